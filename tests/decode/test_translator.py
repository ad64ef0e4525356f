"""Inference precisions: `auto` by processor, int8 against fp32, batch == one by one in each; `tune`."""

import json
import os
import shutil

import pytest
import sacrebleu
import torch
from conftest import requires_int8, tiny_config

import aiayn
from aiayn.checkpoint import list_checkpoints, read_weights
from aiayn.cli import main
from aiayn.config import ConfigError
from aiayn.decode.translator import Translator
from aiayn.device import TRAIN_PRECISIONS, cpu_class, cpu_flags, int8_kernel, resolve_precision
from aiayn.models.linear import Int8Linear

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
    vnni = ("int8", "asked for (VNNI: 8-bit rows, torch._int_mm)")
    assert resolve_precision("int8", CPU, {"avx2", "avx512_vnni"}) == vnni
    assert resolve_precision("int8", CPU, {"avx2", "avx_vnni"}) == vnni  # Alder Lake, Zen 5 desktop
    got, why = resolve_precision("int8", CPU, {"avx2", "fma"})  # Zen 2/3, Haswell: fbgemm's 7-bit rows
    assert got == "int8" and "fbgemm" in why
    got, why = resolve_precision("int8", CPU, {"sse4_2"})  # no AVX2: refused, fp32 instead
    assert got == "fp32" and why.startswith("int8 refused: this CPU has no AVX2")
    assert resolve_precision("fp32", CPU, {"avx512_bf16"}) == ("fp32", "asked for")
    assert resolve_precision("bf16", CPU, {"avx512_bf16"}) == ("bf16", "asked for")
    assert "emulated" in resolve_precision("bf16", CPU, {"avx2"})[1]
    with pytest.raises(ConfigError, match="int8 runs on the CPU"):
        resolve_precision("int8", torch.device("cuda"))
    with pytest.raises(ValueError, match="auto, fp32, bf16, int8"):
        resolve_precision("fp16", CPU)
    assert resolve_precision("fp16", CPU, {"avx512_bf16"}, choices=TRAIN_PRECISIONS)[1].endswith("slower than fp32")
    with pytest.raises(ValueError, match="auto, fp32, bf16, fp16, got 'int8'"):
        resolve_precision("int8", CPU, {"avx512_vnni"}, choices=TRAIN_PRECISIONS)  # training has no int8


AVX512_BF16_AMX = "flags\t: fpu avx2 fma avx512f avx512bw avx512vl avx512_vnni avx_vnni avx512_bf16 amx_bf16 amx_int8\n"


@pytest.mark.parametrize("limit,kept,cls", [
    (None, {"avx512f", "avx512_bf16", "amx_bf16", "avx_vnni"}, "AMX"),
    ("AVX2", {"avx2", "fma"}, "AVX2"),
    ("avx2_vnni", {"avx2", "avx_vnni"}, "AVX2 VNNI"),
    ("AVX512_CORE", {"avx2", "avx512f", "avx512bw"}, "AVX-512"),
    ("AVX512_CORE_BF16", {"avx512_bf16", "avx512_vnni", "avx_vnni"}, "AVX-512 BF16"),
])
def test_onednn_max_cpu_isa_bars_the_flags_above_it(limit, kept, cls):
    """ONEDNN_MAX_CPU_ISA makes oneDNN run as a smaller CPU would; aiayn's choices follow it, so the
    variable reproduces an AVX2 processor's precisions on any machine (tests, bench)."""
    env = {} if limit is None else {"ONEDNN_MAX_CPU_ISA": limit}
    flags = cpu_flags(AVX512_BF16_AMX, env)
    assert kept <= flags
    assert cpu_class(AVX512_BF16_AMX, env)["class"] == cls
    if limit in ("AVX2", "AVX512_CORE"):
        assert not (flags & {"avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8"})
        assert resolve_precision("auto", CPU, flags)[0] == "fp32" and int8_kernel(flags) == "fbgemm"
    if limit == "AVX2":
        assert not (flags & {"avx512f", "avx512bw"})


def test_an_avx2_process_trains_the_lstm_and_takes_fbgemm_for_int8_under_onednn_max_cpu_isa():
    """Across a real process boundary, oneDNN limited to AVX2 (what an AVX2 EPYC runs): auto is fp32,
    int8 takes fbgemm's 7-bit rows (oneDNN's s8 x s8 product would saturate), and the recurrent model
    trains under bf16 autocast (its LSTM in fp32: oneDNN has no bf16 LSTM there)."""
    import subprocess
    import sys

    code = """
import logging, torch
from aiayn.config import ModelConfig
from aiayn.device import resolve_precision, lstm_bf16
from aiayn.models.build import build_model
from aiayn.decode.translator import Translator
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
print("auto", resolve_precision("auto", torch.device("cpu"))[0], "lstm_bf16", lstm_bf16())
model = build_model(ModelConfig(arch="rnn", vocab_size=40, d_model=16, N=1, p_drop=0.0))
with torch.autocast("cpu", dtype=torch.bfloat16):
    model(torch.randint(4, 40, (2, 5)), torch.randint(4, 40, (2, 4))).float().sum().backward()
print("rnn trained")
t = Translator(build_model(ModelConfig(vocab_size=40, d_model=16, d_ff=32, h=2, N=1)), [None] * 40, precision="int8")
print("int8 ->", t.precision)
"""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
           "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "auto fp32 lstm_bf16 False" in out.stdout and "rnn trained" in out.stdout
    assert "int8 -> int8" in out.stdout and "decoding in int8 (asked for (AVX2 without VNNI" in out.stderr


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


@pytest.mark.slow
@requires_int8
def test_int8_agrees_with_fp32(trained):
    """Per-channel int8 weights and per-row int8 activations (linear.Int8Linear): an identical
    translation's score — a mean log-probability, §6.1 — moved by at most 0.052 when this was
    written (PyTorch's per-tensor dynamic quantization: 0.13, as one large activation sets a
    whole batch's step), so < 0.1 is asked. This toy model is unsure (about -2 per token), so
    near ties flip: 38 of 40 translations were identical (per-tensor: 35), and 35 on an Intel family 6
    model 207 whose fp32 side takes oneDNN's kernels; >= 80 % is asked.
    fbgemm's rows (AVX2 without VNNI) have 7 bits, half the levels: 0.103 measured, < 0.2 asked."""
    ckpt, data = trained
    src = sources(data)
    fp32 = Translator.load(ckpt, precision="fp32").hypotheses(src)
    ref = (data / "test.de.txt").read_text().splitlines() + (data / "valid.de.txt").read_text().splitlines()
    assert sacrebleu.corpus_bleu([h[0].text for h in fp32], [ref]).score > 30  # a model that translates
    int8 = Translator.load(ckpt, precision="int8")
    assert int8.precision == "int8" and any(isinstance(m, Int8Linear) for m in int8.search_model.encoder.modules())
    assert isinstance(int8.search_model.layers[0].qkv, Int8Linear)  # the fused step's projections are int8 too
    q = int8.hypotheses(src)
    same = [(a[0], b[0]) for a, b in zip(fp32, q) if a[0].text == b[0].text]
    assert len(same) >= 0.8 * len(src)
    assert max(abs(a.score - b.score) for a, b in same) < (0.1 if int8_kernel() == "int_mm" else 0.2)
    assert max(abs(a.score - b.score) for a, b in same) > 0  # int8 really ran


@pytest.mark.parametrize("precision", ["fp32", "bf16", pytest.param("int8", marks=requires_int8),
                                       pytest.param("int8-fbgemm", marks=requires_int8)])
def test_batch_equals_one_by_one_in_every_precision(trained, precision, monkeypatch):
    """int8-fbgemm: the AVX2 kernel forced on any x86 CPU (its per-tensor range pinned by the anchor row)."""
    from aiayn.models import linear

    ckpt, data = trained
    if precision == "int8-fbgemm":
        monkeypatch.setattr(linear, "int8_kernel", lambda: "fbgemm")
        precision = "int8"
    t = Translator.load(ckpt, precision=precision)
    if precision == "int8":
        fused = t.search_model
        layers = [m for m in fused.encoder.modules() if isinstance(m, Int8Linear)] + [fused.layers[0].qkv, fused.out]
        assert {m.kernel for m in layers} == {linear.int8_kernel()}
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
    ckpt, data = trained
    other = tmp_path / "other-vocabulary"
    shutil.copytree(data, other)
    (other / "spm.model").write_bytes((other / "spm.model").read_bytes()[:-1] + b"?")
    cases = [(["--checkpoint", str(tmp_path / "none.safetensors")], "checkpoint not found"),
             (["--checkpoint", str(ckpt), "--beams", "2,x"], "--beams: expected comma-separated numbers"),
             (["--checkpoint", str(ckpt), "--alphas", "-1"], "--alphas in [0, 10]"),
             (["--checkpoint", str(ckpt), "--alphas", "0.6,11"], "--alphas in [0, 10]; got 2,4,6, 0.6,11"),
             (["--checkpoint", str(ckpt), "--data", str(tmp_path)], "no manifest.json"),
             (["--checkpoint", str(ckpt), "--data", str(other)], "its vocabulary is not the checkpoint's")]
    for args, message in cases:
        assert main(["tune", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_bf16_weights_cast_once_give_what_autocast_gives(trained):
    """bf16 decoding runs a copy whose projections hold bf16 weights (translate.cast_bf16);
    autocast rounds fp32 weights the same way at every step, so the hypotheses and scores must
    be identical to searching the fp32 model under autocast. The given model stays fp32."""
    from aiayn.data.tokenizer import EOS, PAD
    from aiayn.decode.fast import FusedDecoder
    from aiayn.decode.search import beam_search

    ckpt, data = trained
    t = Translator.load(ckpt, precision="bf16")
    assert all(p.dtype == torch.float32 for p in t.model.parameters())
    assert isinstance(t.search_model, FusedDecoder)  # the fused decoder step, checked here against the modules
    assert any(p.dtype == torch.bfloat16 for p in t.search_model.model.parameters())
    ids = t.encode_sources(sources(data)[:12])
    src = torch.full((len(ids), max(map(len, ids))), PAD)
    for i, x in enumerate(ids):
        src[i, :len(x)] = torch.tensor(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = beam_search(t.model, src, beam=4, alpha=0.6, nbest=2)
    got = t.translate_ids(ids, beam=4, alpha=0.6, nbest=2)
    assert [[(h.tokens, h.score) for h in hs] for hs in got] == [[(h.tokens, h.score) for h in hs] for hs in ref]
    assert all(EOS not in h.tokens for hs in got for h in hs)


def test_huge_pages_are_asked_for_unless_the_user_chose(monkeypatch):
    """device.huge_pages sets THP_MEM_ALLOC_ENABLE for PyTorch's allocator, never over the user's value."""
    from aiayn import device

    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    device.huge_pages()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    device.huge_pages()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"


def test_an_isa_limit_gets_its_own_inductor_cache(monkeypatch):
    """TorchInductor's disk cache does not key on ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY: each limit
    gets a cache of its own, the user's choice is kept, and without a limit nothing changes."""
    from aiayn.device import inductor_cache

    for var in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    inductor_cache()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("-avx2-avx2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/mine")
    inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/mine"


def test_the_precision_rule_takes_the_fastest_within_the_tolerance():
    from aiayn.decode.tuned_precision import Measured, choose_precision

    def rows(*spec):
        return [Measured(p, b, s, 100 / s) for p, b, s in spec]
    ref = ("fp32", 30.0, 10.0)
    assert choose_precision(rows(ref, ("int8", 29.85, 8.0)), "fp32") == "int8"  # -0.15 BLEU, 20 % faster
    assert choose_precision(rows(ref, ("int8", 29.7, 8.0)), "fp32") == "fp32"  # -0.3 BLEU: too much lost
    assert choose_precision(rows(ref, ("int8", 30.5, 9.7)), "fp32") == "fp32"  # 3 % faster: inside the margin
    assert choose_precision(rows(ref, ("int8", 30.0, 8.0), ("bf16", 30.0, 7.0)), "fp32") == "bf16"
    assert choose_precision(rows(ref, ("int8", 30.0, 8.0), ("bf16", 25.0, 7.0)), "fp32") == "int8"
    assert choose_precision(rows(ref, ("int8", 29.6, 8.0)), "fp32", tolerance=0.5) == "int8"
    # the grid ran in bf16 (auto on a native-bf16 CPU): the tolerance is still against fp32's BLEU
    assert choose_precision(rows(ref, ("bf16", 29.9, 7.0), ("int8", 29.9, 6.0)), "bf16") == "int8"
    assert choose_precision(rows(ref, ("bf16", 29.9, 7.0), ("int8", 29.7, 6.0)), "bf16") == "bf16"
    assert choose_precision(rows(ref, ("bf16", 29.7, 7.0)), "bf16") == "fp32"  # bf16 loses 0.3 against fp32
    assert choose_precision(rows(ref, ("bf16", 29.7, 7.0), ("int8", 29.85, 9.0)), "bf16") == "int8"
    assert choose_precision(rows(ref, ("bf16", 29.7, 7.0), ("int8", 29.85, 9.8)), "bf16") == "fp32"
    assert choose_precision(rows(("bf16", 30.0, 7.0), ("int8", 29.85, 6.0)), "bf16") == "int8"  # no fp32 row


@requires_int8
def test_tune_times_each_precision_and_auto_takes_its_choice_on_this_processor_class(trained, tmp_path, capsys):
    from aiayn.decode.tuned_precision import Measured, choose_precision, machine

    ckpt, data = trained
    out = tmp_path / "tuned.safetensors"
    assert main(["tune", "--checkpoint", str(ckpt), "--beams", "2", "--alphas", "0.6", "--precisions", "fp32,int8",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    extra = json.loads(read_weights(out)[1]["extra"])
    choice = extra["tuned"]["precision_choice"]
    rows = [Measured(**r) for r in choice["measured"]]
    reference = resolve_precision("auto", CPU)[0]
    assert choice["reference"] == reference and {r.precision for r in rows} == {reference, "fp32", "int8"}
    assert choice["chosen"] == choose_precision(rows, reference, 0.2, 0.05) and "<- auto takes it" in printed
    src, ref = (data / "valid.en.txt").read_text().splitlines(), (data / "valid.de.txt").read_text().splitlines()
    for r in rows:  # every recorded BLEU, scored again here
        text = Translator.load(ckpt, precision=r.precision).translate(src, beam=2, alpha=0.6)
        assert round(sacrebleu.BLEU().corpus_score(text, [ref]).score, 2) == r.bleu
    assert choice["class"] == machine()["class"]
    assert Translator.load(out).precision == choice["chosen"]  # auto on this processor class: tune's choice
    assert Translator.load(out, precision="fp32").precision == "fp32"  # an explicit precision wins


def test_auto_ignores_a_precision_chosen_on_another_processor_class(trained, tmp_path):
    from aiayn.checkpoint import read_meta, save_weights
    from aiayn.decode.tuned_precision import machine, recorded

    ckpt, _ = trained
    tensors, meta = read_weights(ckpt)
    cfg = read_meta(meta, ckpt)[0]
    t = Translator.load(ckpt)
    here = machine()
    for cls, want in ((here["class"], "int8" if int8_kernel() else resolve_precision("auto", CPU)[0]),
                      ("AVX-512 BF16 (elsewhere)", resolve_precision("auto", CPU)[0])):
        path = tmp_path / f"{len(cls)}.safetensors"
        choice = {"chosen": "int8", "reference": "fp32", "class": cls, "int8_kernel": here["int8_kernel"],
                  "cpu": "a machine", "measured": []}
        save_weights(path, tensors, cfg, t.tokenizer, 1, {"tuned": {"precision_choice": choice}})
        assert Translator.load(path).precision == want
        assert (recorded({"tuned": {"precision_choice": choice}}, CPU)[0] is None) == (cls != here["class"])
    for damaged in ({"tuned": "x"}, {"tuned": {"precision_choice": {"chosen": "fp64"}}}, {}):
        assert recorded(damaged, CPU)[0] is None
    odd = {"chosen": "fp32", "class": here["class"], "int8_kernel": here["int8_kernel"], "measured": 7}
    assert recorded({"tuned": {"precision_choice": odd}}, CPU)[0] == "fp32"  # a damaged table is not a traceback


def test_tune_precision_flags_bad_input_gets_one_line(trained, capsys):
    ckpt, _ = trained
    for args, message in ((["--precisions", "fp32,int4"], "--precisions: auto, none, or"),
                          (["--precision-tolerance", "-1"], "--precision-tolerance must be in [0, 100]")):
        assert main(["tune", "--checkpoint", str(ckpt), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_the_precisions_timed_and_the_choice_taken_follow_the_processors_flags(monkeypatch):
    """Injected processors: an AVX-512 BF16 + VNNI CPU times fp32, bf16 and int8; an AVX2 one fp32 and
    int8; one without AVX2 fp32 only. A choice recorded on the first applies there and not on the second."""
    from aiayn.decode import tuned_precision as tp

    def as_cpu(cls, kernel, bf16):
        monkeypatch.setattr(tp, "native_bf16", lambda: ["avx512_bf16"] if bf16 else [])
        monkeypatch.setattr(tp, "int8_kernel", lambda: kernel)
        monkeypatch.setattr(tp, "cpu_class", lambda: {"class": cls, "cpu": "EPYC", "cpu_family": 26, "cpu_model": 2})
    as_cpu("AVX-512 BF16", "int_mm", True)
    assert tp.candidates(CPU) == ["fp32", "bf16", "int8"]
    rows = [tp.Measured("fp32", 30, 10, 100), tp.Measured("bf16", 30, 6, 166)]
    rec = {"tuned": {"precision_choice": tp.choice_record(rows, "fp32", "bf16", 0.2, 0.05)}}
    assert tp.recorded(rec, CPU)[0] == "bf16" and tp.tuned_precision("auto", rec, CPU) == "bf16"
    assert tp.tuned_precision("fp32", rec, CPU) == "fp32"
    as_cpu("AVX2", "fbgemm", False)
    assert tp.candidates(CPU) == ["fp32", "int8"]
    assert tp.recorded(rec, CPU)[0] is None and tp.tuned_precision("auto", rec, CPU) == "auto"
    as_cpu("pre-AVX2", None, False)
    assert tp.candidates(CPU) == ["fp32"]
