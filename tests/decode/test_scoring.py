"""Force-decoded scores (decode/scoring.py): a search's own output scores what the search reported,
a reference scores the teacher-forced sum computed here, batched as alone; the command line's TSV."""

import pytest
import torch
from conftest import random_translator, save_translator

from aiayn.cli import main
from aiayn.data.tokenizer import BOS, EOS
from aiayn.decode.beams import length_penalty
from aiayn.decode.translator import Translator

SOURCES = ["the dog runs", "a big red house near the street", "the woman sits", "blue cat", "the man runs near"]
TARGETS = ["der hund läuft", "ein großer roter haus nahe straße", "die frau sitzt", "blauer katze", ""]


@pytest.fixture(scope="module")
def translator(toy_prepared):
    return random_translator(toy_prepared / "spm.model", max_len_b=10)


def test_a_searchs_own_output_scores_what_the_search_said(translator):
    """Beam 4 at α 0.6 ranks by log p / lp(|Y|): `normalized` of its best hypothesis is its score;
    greedy's score is the total."""
    ids = translator.encode_sources(SOURCES)
    for beam, field in ((4, "normalized"), (1, "total")):
        hyps = translator.translate_ids(ids, beam=beam, alpha=0.6)
        texts = translator.tokenizer.decode([h[0].tokens for h in hyps])
        for h, text, got in zip(hyps, texts, translator.score(SOURCES, texts, alpha=0.6)):
            if translator.tokenizer.encode_target([text])[0] == h[0].tokens:  # the text segments back the same
                assert getattr(got, field) == pytest.approx(h[0].score, abs=1e-4), (beam, text)


def test_a_references_score_is_the_teacher_forced_sum_batched_as_alone(translator):
    model, tok = translator.model, translator.tokenizer
    scores = translator.score(SOURCES, TARGETS, alpha=1.0)
    alone = [translator.score([s], [t], alpha=1.0)[0] for s, t in zip(SOURCES, TARGETS)]
    assert [x.total for x in scores] == pytest.approx([x.total for x in alone], rel=1e-6, abs=1e-5)  # rounding only
    for s, t, got in zip(SOURCES, TARGETS, scores):
        x, y = tok.encode([s])[0] + [EOS], tok.encode_target([t])[0] + [EOS]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([x]), torch.tensor([[BOS] + y[:-1]])), -1)[0]
        total = float(sum(logp[i, w] for i, w in enumerate(y)))
        assert got.total == pytest.approx(total, abs=1e-4) and got.subwords == len(y) - 1
        assert got.per_subword == pytest.approx(total / len(y)) and got.normalized == pytest.approx(
            total / length_penalty(len(y), 1.0))


def test_the_command_line_prints_one_line_each_and_refuses_misaligned_files(toy_prepared, tmp_path, capsys):
    ckpt = save_translator(random_translator(toy_prepared / "spm.model", seed=1), tmp_path / "m.safetensors")
    (tmp_path / "src").write_text("".join(s + "\n" for s in SOURCES))
    (tmp_path / "hyp").write_text("".join(s + "\n" for s in TARGETS))
    assert main(["score", "--checkpoint", str(ckpt), "--src", str(tmp_path / "src"), "--hyp",
                 str(tmp_path / "hyp")]) == 0
    lines = capsys.readouterr().out.splitlines()
    want = Translator.load(ckpt, precision="fp32").score(SOURCES, TARGETS)
    assert lines[0].split("\t") == ["total", "per_subword", "normalized", "subwords"] and len(lines) == 6
    assert [float(x.split("\t")[0]) for x in lines[1:]] == pytest.approx([w.total for w in want], abs=1e-3)
    (tmp_path / "short").write_text("a\n")
    assert main(["score", "--checkpoint", str(ckpt), "--src", str(tmp_path / "src"), "--hyp",
                 str(tmp_path / "short")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "5 lines" in err[0] and "1" in err[0]
    assert main(["score", "--hyp", str(tmp_path / "hyp")]) == 2 and "--ref" in capsys.readouterr().err
