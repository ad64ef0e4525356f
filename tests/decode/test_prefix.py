"""Target prefixes (decode/prefix.py): every output starts with its prefix, batched as alone, and
goes on as the search would from there (greedy: the model's argmax continuation, computed here)."""

import pytest
import torch
from conftest import random_translator, save_translator

from aiayn.data.tokenizer import BOS, EOS

SOURCES = ["the dog runs", "a big red house near the street", "the woman sits", "blue cat"]
PREFIXES = ["der hund", "", "die frau sitzt nahe", "ein"]


@pytest.fixture(scope="module")
def translator(toy_prepared):
    return random_translator(toy_prepared / "spm.model")


@pytest.mark.parametrize("beam", [1, 4])
def test_each_output_starts_with_its_prefix_batched_as_alone(translator, beam):
    tok = translator.tokenizer
    ids = translator.encode_sources(SOURCES)
    forced = tok.encode_target(PREFIXES)
    hyps = translator.translate_ids(ids, beam=beam, prefixes=forced)
    for h, p in zip(hyps, forced):
        assert h[0].tokens[:len(p)] == p
    alone = [translator.translate_ids([x], beam=beam, prefixes=[p])[0] for x, p in zip(ids, forced)]
    assert [h[0].tokens for h in hyps] == [a[0].tokens for a in alone]
    plain = translator.translate_ids(ids, beam=beam)
    assert hyps[1][0].tokens == plain[1][0].tokens  # an empty prefix changes nothing
    assert translator.translate(SOURCES, beam=beam, prefixes=PREFIXES) == tok.decode([h[0].tokens for h in hyps])


def test_greedy_goes_on_from_the_prefix_as_the_model_would(translator):
    """Past the prefix, each token is the argmax of one teacher-forced pass over source, BOS and all
    tokens before it (until EOS or the length limit)."""
    model, tok = translator.model, translator.tokenizer
    for src, prefix in zip(SOURCES, PREFIXES):
        x = tok.encode([src])[0] + [EOS]
        y = tok.encode_target([prefix])[0]
        got = translator.translate_ids([x], beam=1, prefixes=[y])[0][0].tokens
        limit = 12 + len(x) - 1
        while len(y) < limit:
            with torch.no_grad():
                logits = model(torch.tensor([x]), torch.tensor([[BOS] + y]))[0, -1]
            logits[[0, BOS]] = float("-inf")
            nxt = int(logits.argmax())
            if nxt == EOS:
                break
            y.append(nxt)
        assert got == y, src


def test_a_prefix_too_long_for_its_output_is_refused(translator):
    ids = translator.encode_sources(["a cat"])
    with pytest.raises(ValueError, match="prefix 1 has"):
        translator.translate_ids(ids, prefixes=[[5] * 40])


def test_translate_prefix_takes_a_file_of_prefixes_line_by_line(translator, toy_prepared, tmp_path, capsys):
    from aiayn.cli import main

    ckpt = save_translator(translator, tmp_path / "m.safetensors")
    (tmp_path / "in").write_text("".join(s + "\n" for s in SOURCES))
    (tmp_path / "prefix").write_text("".join(s + "\n" for s in PREFIXES))
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in"), "--prefix",
                 str(tmp_path / "prefix"), "--precision", "fp32", "--max-len-b", "12"]) == 0
    assert capsys.readouterr().out.splitlines() == translator.translate(SOURCES, prefixes=PREFIXES)
    (tmp_path / "short").write_text("der\n")
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in"), "--prefix",
                 str(tmp_path / "short")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "4 lines" in err[0] and "short has 1" in err[0]
