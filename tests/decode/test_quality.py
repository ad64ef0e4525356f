"""Quality signals (decode/quality.py): repeats and the flag's rule against hand-made cases, the mean
log-probability recovered from a beam score equal to the force-decoded one, and `translate --quality`."""

import math

import pytest
from conftest import random_translator, save_translator

from aiayn.cli import main
from aiayn.decode.quality import FIELDS, flag, quality, repeats

SOURCES = ["the dog runs", "a big red house near the street", "the woman sits", "blue cat", ""]


@pytest.mark.parametrize("tokens,want", [([], 0), ([1, 2, 3], 1), ([5, 5, 5, 5], 4), ([1, 2, 1, 2, 1, 2, 3], 3),
                                         ([1, 2, 3, 4, 1, 2, 3, 4], 2), ([7, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5], 1)])
def test_repeats_counts_an_ngram_back_to_back(tokens, want):
    assert repeats(tokens) == want


def test_the_flag_names_every_rule_that_holds():
    ok = {"mean_logprob": -0.5, "normalized": -1.0, "length_ratio": 1.0, "repeated": 1, "coverage": 0.9}
    assert flag(ok) == ""
    assert flag({**ok, "repeated": 3, "length_ratio": 2.5}) == "long,loop"
    assert flag({**ok, "mean_logprob": -3.0, "length_ratio": 0.2, "coverage": 0.1}) == "unsure,short,uncovered"
    assert flag({**ok, "coverage": math.nan}) == ""  # not read: no reason


@pytest.fixture(scope="module")
def translator(toy_prepared):
    return random_translator(toy_prepared / "spm.model", max_len_b=10)


def test_the_mean_log_probability_is_the_force_decoded_one(translator):
    """Beam search's score times lp(|Y|) is the total it ranked: per subword it equals what one
    teacher-forced pass gives the same output (decode/scoring.py)."""
    ids = translator.encode_sources(SOURCES[:4])
    for beam in (1, 4):
        hyps = translator.translate_ids(ids, beam=beam, alpha=0.6)
        texts = translator.tokenizer.decode([h[0].tokens for h in hyps])
        forced = translator.score(SOURCES[:4], texts, alpha=0.6)
        for x, h, text, f, line in zip(ids, hyps, texts, forced, SOURCES):
            q = quality(x, h[0], len(line.split()), set(), beam, 0.6)
            if translator.tokenizer.encode_target([text])[0] == h[0].tokens:
                assert q.mean_logprob == pytest.approx(f.per_subword, abs=1e-4)
            assert q.length_ratio == pytest.approx(len(h[0].tokens) / (len(x) - 1)) and q.coverage == 0.0


def test_translate_writes_a_row_of_signals_per_line(translator, toy_prepared, tmp_path, capsys):
    ckpt = save_translator(translator, tmp_path / "m.safetensors")
    (tmp_path / "in").write_text("".join(s + "\n" for s in SOURCES))
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in"), "-o", str(tmp_path / "out"),
                 "--quality", str(tmp_path / "q.tsv"), "--precision", "fp32"]) == 0
    rows = [x.split("\t") for x in (tmp_path / "q.tsv").read_text().splitlines()]
    assert rows[0] == list(FIELDS) and len(rows) == len(SOURCES) + 1
    for row, line in zip(rows[1:5], SOURCES):
        assert 0 <= float(row[4]) <= 1 and int(row[3]) >= 1 and float(row[0]) <= 0, (line, row)
        assert set(filter(None, row[5].split(","))) <= {"unsure", "short", "long", "loop", "uncovered"}
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in"), "--quality",
                 str(tmp_path / "q2.tsv"), "--nbest", "2"]) == 2
    assert "--quality reads one translation per line" in capsys.readouterr().err
