"""Inference precisions: `auto` by processor, int8 against fp32, batch == one by one in each; `tune`."""

import json

import pytest
import sacrebleu
import torch
from conftest import tiny_config

import aiayn
from aiayn.checkpoint import list_checkpoints, read_weights
from aiayn.cli import main
from aiayn.config import ConfigError
from aiayn.translate import Translator, resolve_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize("flags,want", [
    ({"fpu", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"}, "bf16"),   # Zen 4/5, Cooper Lake
    ({"avx2", "avx512f", "amx_bf16", "amx_tile"}, "bf16"),                 # Sapphire Rapids
    ({"avx2", "avx512f", "avx512_vnni"}, "fp32"),                          # Skylake/Cascade Lake: no bf16
    ({"avx2", "fma"}, "fp32"),                                              # Zen 2/3, Haswell
    (set(), "fp32"),                                                        # flags unknown (not Linux)
])
def test_auto_precision_follows_the_processor(flags, want):
    got, why = resolve_precision("auto", CPU, flags)
    assert got == want and why.startswith("auto:")


def test_explicit_precisions_and_refusals():
    assert resolve_precision("int8", CPU, set()) == ("int8", "asked for")
    assert resolve_precision("fp32", CPU, {"avx512_bf16"}) == ("fp32", "asked for")
    with pytest.raises(ConfigError, match="int8 runs on the CPU"):
        resolve_precision("int8", torch.device("cuda"))
    with pytest.raises(ValueError, match="auto, fp32, bf16, int8"):
        resolve_precision("fp16", CPU)


@pytest.fixture(scope="module")
def trained(toy_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("inference") / "run"
    cfg = tiny_config(max_steps=300, warmup_steps=50, lr_scale=0.5, save_every=300)
    cfg.model.d_model, cfg.model.d_ff, cfg.model.p_drop = 64, 128, 0.0
    cfg.data.max_tokens = 600
    aiayn.train(cfg, str(toy_prepared), str(run))
    return list_checkpoints(run)[-1], toy_prepared


def sources(data):
    return (data / "test.en.txt").read_text().splitlines() + (data / "valid.en.txt").read_text().splitlines()


def test_int8_agrees_with_fp32(trained):
    """Per-channel int8 weights and 8-bit activations with one scale per batch (PyTorch's dynamic
    quantization): an identical translation's score — a mean log-probability, §6.1 — moved by at
    most 0.13 when this was written (a batch's largest activation sets everyone's step), so < 0.2
    is asked. This toy model is unsure (about -2 per token), so near ties flip: 35 of 40
    translations were identical; >= 85 % is asked."""
    ckpt, data = trained
    src = sources(data)
    fp32 = Translator.load(ckpt, precision="fp32").hypotheses(src)
    ref = (data / "test.de.txt").read_text().splitlines() + (data / "valid.de.txt").read_text().splitlines()
    assert sacrebleu.corpus_bleu([h[0].text for h in fp32], [ref]).score > 30  # a model that translates
    int8 = Translator.load(ckpt, precision="int8")
    assert int8.precision == "int8" and any("quantized" in type(m).__module__ for m in int8.model.modules())
    q = int8.hypotheses(src)
    same = [(a[0], b[0]) for a, b in zip(fp32, q) if a[0].text == b[0].text]
    assert len(same) >= 0.85 * len(src)
    assert max(abs(a.score - b.score) for a, b in same) < 0.2
    assert max(abs(a.score - b.score) for a, b in same) > 0  # int8 really ran


@pytest.mark.parametrize("precision", ["fp32", "bf16", pytest.param("int8", marks=pytest.mark.xfail(
    strict=True, reason="PyTorch's dynamic quantization scales activations per tensor, so a sentence's int8 "
                        "products depend on its batch; per-row scales (torch._int_mm) are the planned fix"))])
def test_batch_equals_one_by_one_in_every_precision(trained, precision):
    ckpt, data = trained
    t = Translator.load(ckpt, precision=precision)
    src = sources(data)[:16]
    assert t.translate(src) == [t.translate([s])[0] for s in src]


def test_tune_picks_the_best_validation_bleu_and_translate_uses_it(trained, tmp_path, capsys):
    ckpt, data = trained
    out = tmp_path / "tuned.safetensors"
    assert main(["tune", "--checkpoint", str(ckpt), "--beams", "1,3", "--alphas", "0,1.5", "--precision", "fp32",
                 "-o", str(out)]) == 0  # the data comes from the run's run.json
    printed = capsys.readouterr().out
    # every grid point scored again here, independently of tune's own loop
    src, ref = (data / "valid.en.txt").read_text().splitlines(), (data / "valid.de.txt").read_text().splitlines()
    t = Translator.load(ckpt, precision="fp32")
    scores = {(b, a): round(sacrebleu.BLEU().corpus_score(t.translate(src, beam=b, alpha=a), [ref]).score, 2)
              for b in (1, 3) for a in (0.0, 1.5)}
    best = max(scores.values())
    tuned = Translator.load(out, precision="fp32")
    assert scores[(tuned.decode_cfg.beam, tuned.decode_cfg.alpha)] == best
    extra = json.loads(read_weights(out)[1]["extra"])
    assert {(p["beam"], p["alpha"]): p["bleu"] for p in extra["tuned"]["points"]} == scores
    assert extra["tuned"]["valid"].endswith("valid.en.txt") and "<- chosen" in printed
    assert read_weights(out)[0].keys() == read_weights(ckpt)[0].keys()


def test_tune_bad_input_gets_one_line_errors(trained, tmp_path, capsys):
    ckpt, _ = trained
    cases = [(["--checkpoint", str(tmp_path / "none.safetensors")], "checkpoint not found"),
             (["--checkpoint", str(ckpt), "--beams", "2,x"], "--beams: expected comma-separated numbers"),
             (["--checkpoint", str(ckpt), "--alphas", "-1"], "--alphas finite and >= 0"),
             (["--checkpoint", str(ckpt), "--data", str(tmp_path)], "no manifest.json")]
    for args, message in cases:
        assert main(["tune", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
