"""bench/gpu/gpu.py's CPU dry run (`--device cpu --tiny`), through bench/gpu/gpu_run.sh as a GPU run calls it:
every section of the GPU bench runs end to end in its own process — training throughput beside HF
Marian, the paper-budget projection, bf16 and fp16 runs of the CLI, the torchrun SIGKILL-resume,
decoding beside CTranslate2, the profile — so the GPU run is one command.
The GPU benches' tooling, not the package: every test here is `long` (scripts/test.sh --long, before
a GPU run)."""

import importlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import tiny_config

import aiayn
from aiayn.checkpoint import list_checkpoints

pytestmark = pytest.mark.long
RUN = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "gpu_run.sh"


@pytest.mark.long
@pytest.mark.slow
def test_gpu_bench_dry_run_on_the_cpu(toy_prepared, tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), LIMIT_S="500",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))  # python3: this one
    res = subprocess.run(["bash", str(RUN), "--device", "cpu", "--tiny", "--skip-compile", "--data", str(toy_prepared),
                          "--test", "test", "--decode-rounds", "1"],
                         capture_output=True, text=True, timeout=600, env=env)
    log = (tmp_path / "out" / "log.txt").read_text()
    assert res.returncode == 0, res.stdout[-3000:] + log[-3000:]
    with tarfile.open(tmp_path / "out" / "logs.tgz") as logs:  # every training run's own log comes back
        assert {"./multi30k-fp16-s1.log", "./base-multi30k.log", "./torchrun-broken.log"} <= set(logs.getnames())
    r = json.loads((tmp_path / "out" / "gpu.json").read_text())
    assert not [k for k, v in r.items() if isinstance(v, dict) and ("error" in v or "skipped" in v)], r
    for name in ("base",):  # --tiny measures base only (big is the same code)
        rows = r["training"][name]
        assert set(rows) == {"aiayn eager (fp32 logits, the preset)", "aiayn eager", "HF Marian eager"}
        assert all(x["tgt_tok_s"] > 0 and 400 < x["tgt_tokens_per_update"] < 650 for x in rows.values())
        best = max(v["tgt_tok_s"] for k, v in rows.items() if k.startswith("aiayn"))
        projected = r["paper_budget_projection"][name]
        assert projected["hours"] == pytest.approx(projected["updates"] * 25_000 / best / 3600, rel=1e-3)
        shipped = rows["aiayn eager (fp32 logits, the preset)"]["tgt_tok_s"]  # the only preset row uncompiled
        assert projected["preset"] == {"at": "aiayn eager (fp32 logits, the preset)", "hours": pytest.approx(
            projected["updates"] * 25_000 / shipped / 3600, rel=1e-3)}
    learning = {k: v for k, v in r["learning"].items() if k != "section_s"}
    assert set(learning) == {"multi30k-bf16-s1", "multi30k-bf16-s2", "multi30k-fp16-s1", "multi30k-fp16-s2",
                             "base-multi30k"}
    assert all(v["returncode"] == 0 and v["validations"] for v in learning.values())
    p = r["fp16_vs_bf16"]
    assert p["fp16_minus_bf16"] == pytest.approx(sum(p["valid_nll"]["fp16"]) / 2 - sum(p["valid_nll"]["bf16"]) / 2)
    assert r["torchrun_resume"]["bit_identical"] is True and r["torchrun_resume"]["killed_after_checkpoints"] >= 2
    assert set(r["test_bleu"]["bleu"]) == {"multi30k-bf16-s1", "multi30k-bf16-s2", "multi30k-fp16-s1",
                                           "multi30k-fp16-s2"}
    dec = r["decoding"]
    assert dec["sentences"] == 20 and dec["aiayn fp32"]["sent_s"] > 0 and "bleu" in dec["aiayn fp32"]
    assert dec["aiayn fp32"]["switches"]["decode.step"] == "fused"  # each figure names the switches it ran with
    warmed = r["training_warmup"]
    assert all(v["switches"]["train.fused_loss"] == ("chunked" not in k) for k, v in warmed.items() if "aiayn" in k)
    assert dec["model_choice"].split()[0] in ("base-multi30k", "multi30k-bf16-s1") and "cut" not in dec
    assert "partial" not in dec and "Name" in dec["profile"]["table"]  # it finished: the rounds, then the profile
    assert dec["profile"]["gpu_ms"] is None and dec["profile"]["kernel_launches"] == 0  # a CPU run: no GPU
    value, unit = re.search(r"Self CPU time total: ([0-9.]+)(us|ms|s)", dec["profile"]["table"]).groups()
    host_ms = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]  # the profiler's own total, as it prints it
    assert dec["profile"]["host_ms"] == pytest.approx(host_ms, rel=1e-3, abs=0.1) and host_ms > 0
    assert {"CTranslate2 float32", "CTranslate2 int8"} <= set(dec)  # measured, or skipped with the reason
    assert "| base | aiayn eager |" in log and "[" in res.stdout  # the table in the log, the sections printed
    assert "aiayn eager" in r["profile"]


def test_a_folder_that_is_not_prepared_data_gets_one_line(tmp_path):
    res = subprocess.run([sys.executable, str(RUN.parent / "gpu.py"), "--data", str(tmp_path), "--device", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and f"--data {tmp_path}: not a prepared folder" in res.stderr.strip().splitlines()[-1]
    assert not list(tmp_path.iterdir())  # nothing written


def _gpu_bench(name: str = "gpu"):
    """bench/TOPIC/NAME.py as a module (bench/ is not a package: its scripts import their siblings by name)."""
    folder = next(RUN.parent.parent.rglob(f"{name}.py")).parent
    for path in (folder, RUN.parent.parent):  # its folder, and bench/ (benchdata)
        if str(path) not in sys.path:
            sys.path.append(str(path))  # last: its script names never shadow another module
    return importlib.import_module(name)


def test_decoding_takes_a_model_that_learned():
    """The second H200 run's base-sized model diverged (valid NLL 9.14) and decoding it to the length limit
    ran out the visit's time: such a model gives way to the multi30k run, with the reason recorded."""
    choose = _gpu_bench("gpu_learning").decoding_model

    def runs(base: float | None, small: float) -> dict:
        out = {"multi30k-bf16-s1": {"validations": [{"step": 2750, "valid_nll": small}]}}
        out["base-multi30k"] = {"validations": [{"step": 2750, "valid_nll": base}] if base is not None else []}
        return out

    assert choose(runs(1.65, 1.74))[0] == "base-multi30k"
    assert choose(runs(2.70, 1.74))[0] == "base-multi30k"  # within a nat: it learned, if less well
    run, why = choose(runs(9.1354, 1.7393))
    assert run == "multi30k-bf16-s1" and "did not learn (valid NLL 9.135" in why
    assert choose(runs(None, 1.74))[0] == "multi30k-bf16-s1"  # no validation at all


def test_decoding_sentences_fit_the_time_left():
    fitting = _gpu_bench("gpu_decoding").fitting
    assert fitting(1000, 64, 0.64, 2, float("inf")) == 1000
    assert fitting(1000, 64, 0.64, 2, 100.0) == 1000  # 1000 × 0.01 s × 2 rounds = 20 s ≤ half of 100
    assert fitting(1000, 64, 6.4, 2, 100.0) == 250  # 0.1 s a sentence: 50 s hold 250 sentences twice
    assert fitting(1000, 64, 64.0, 2, 100.0) == 64  # never fewer than the warm-up's
    assert fitting(20, 20, 0.0, 1, 5.0) == 20


def test_decoding_keeps_every_round_it_timed():
    """The third H200 visit was cut inside decoding and kept none of it: each round is saved as it ends,
    with the medians, BLEU and aiayn's ratio so far."""
    from types import SimpleNamespace

    bench, saved = _gpu_bench("gpu_decoding"), []
    SENT = "ein hund spielt im schnee ."
    systems = {"aiayn bf16": lambda s: list(s), "CTranslate2 float16": lambda s: [x.upper() for x in s]}
    out: dict = {}
    bench.timed_decoding(SimpleNamespace(decode_rounds=2, device="cpu"), systems, [SENT] * 4, [SENT] * 4, out,
                         lambda partial: saved.append(json.loads(json.dumps(partial))))
    assert len(saved) == 4 and len(saved[0]["aiayn bf16"]["rounds_s"]) == 1 and "CTranslate2 float16" not in saved[0]
    assert out["aiayn bf16"]["bleu"] == 100.0 and out["CTranslate2 float16"]["bleu"] < 100.0
    ratio = out["aiayn bf16"]["sent_s"] / out["CTranslate2 float16"]["sent_s"]
    assert out["CTranslate2 float16"]["aiayn_over_this"] == pytest.approx(ratio, rel=1e-2, abs=1e-3)


@pytest.mark.parametrize("models", ["base,base", "small", ""])
def test_models_other_than_base_and_big_get_one_line(toy_prepared, models, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--data", str(toy_prepared), "--models", models])
    with pytest.raises(SystemExit) as e:
        _gpu_bench().parse_args()
    assert e.value.code == 2 and "--models must name base, big or both" in capsys.readouterr().err.splitlines()[-1]


def test_a_section_that_fails_keeps_what_it_saved(tmp_path):
    bench = _gpu_bench()
    rec = bench.Record(tmp_path / "r.json", float("inf"))

    def decoding() -> dict:
        rec.data["decoding"] = {"aiayn bf16": {"sent_s": 700.0}, "partial": True}  # a round saved, then a crash
        raise RuntimeError("CUDA error: out of memory")
    rec.section("decoding", decoding)
    kept = json.loads((tmp_path / "r.json").read_text())["decoding"]
    assert kept["aiayn bf16"] == {"sent_s": 700.0} and kept["partial"] and "out of memory" in kept["error"]


@pytest.mark.slow
def test_training_only_times_the_training_rows_and_nothing_else(toy_prepared, tmp_path):
    """A short GPU run's `--training-only`: the training sections, no learning runs, no decoding."""
    res = subprocess.run([sys.executable, str(RUN.parent / "gpu.py"), "--data", str(toy_prepared), "--device", "cpu",
                          "--tiny", "--skip-compile", "--training-only", "--length", "24", "--models", "big",
                          "--out", str(tmp_path / "g.json"), "--work", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((tmp_path / "g.json").read_text())
    assert set(r) == {"command", "env", "training_warmup", "training", "paper_budget_projection", "profile"}, r
    assert {k for k in r["training"] if k in ("base", "big")} == {"big"}  # --models big: not --tiny's base
    assert all(v["tgt_tok_s"] > 0 for v in r["training"]["big"].values())
    assert set(r["paper_budget_projection"]) - {"section_s"} == {"big"} and set(r["profile"]) - {"section_s"} == {
        "aiayn eager"}
    assert r["training"]["batch"]["padded_length"] == 24  # --length: the rows at another sequence length
    assert not list((tmp_path / "w").glob("multi30k-*"))  # no training run started
    both = subprocess.run([sys.executable, str(RUN.parent / "gpu.py"), "--data", str(toy_prepared), "--training-only",
                           "--decode-only"], capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    zero = subprocess.run([sys.executable, str(RUN.parent / "gpu.py"), "--data", str(toy_prepared), "--length", "0"],
                          capture_output=True, text=True, timeout=120)
    assert zero.returncode == 2 and "--length must be in [2, 512]" in zero.stderr.splitlines()[-1]


@pytest.mark.long
@pytest.mark.slow
def test_compile_probe_dry_run_on_the_cpu(toy_prepared, tmp_path):
    """bench/decode/compile_probe.py as the H200 ran it (BENCH=compile_probe), on a CPU and a toy model:
    compile_now compiles every graph the search needs (none is added by the timed batches), and each
    stage is in the JSON when it ends."""
    env = dict(os.environ, OUT=str(tmp_path), BENCH="compile_probe", LIMIT_S="300",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    res = subprocess.run(["bash", str(RUN), "--device", "cpu", "--data", str(toy_prepared), "--test", "test",
                          "--set", "model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=4", "decode.max_len_b=8",
                          "--sentences", "6", "--rounds", "1"], capture_output=True, text=True, timeout=320, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + (tmp_path / "log.txt").read_text()[-3000:]
    stages = {s["name"]: s for s in json.loads((tmp_path / "probe.json").read_text())["stages"]}
    assert list(stages) == ["built", "compile_now", "first eager batch", "first eager sdpa batch",
                            "first eager graphs batch", "first eager graphs whole batch", "first compiled batch",
                            "round 1"]
    assert stages["built"]["eager"] == "explicit" and stages["round 1"]["sdpa_speedup"] > 0  # a CPU's eager route
    assert stages["built"]["max_len"] == [1.0, 8]  # --set decode.max_len_b over the probe's own 0
    assert stages["round 1"]["graphs_speedup"] > 0  # graphs emulated on a CPU: timed, not faster
    assert stages["first eager graphs batch"]["same_as_eager"] == 6  # of 6 sentences
    assert stages["first eager graphs whole batch"]["same_as_eager"] == 6 and stages["round 1"]["shrink_speedup"] > 0
    assert stages["built"]["graphs"] == 0  # a CPU's 6: start, first step and later steps, each for 1 and 3 sentences
    assert stages["compile_now"]["graphs"] == 6
    assert stages["round 1"]["graphs"] == stages["compile_now"]["graphs"]
    assert stages["round 1"]["compiled_over_eager"] > 0
    assert "Recompiling function _tensor_step" in (tmp_path / "log.txt").read_text()  # TORCH_LOGS=recompiles, kept


def test_the_probe_decodes_outputs_as_long_as_their_sources_unless_told():
    """Random weights run every hypothesis to the search's limit a·S + b: b 0 gives test2016's spread of
    lengths (what shrinking a batch is for); the preset's +50 only when --set asks."""
    probe_config = _gpu_bench("compile_probe").probe_config
    assert probe_config("base", []).decode.max_len_b == 0 and probe_config("base", []).decode.max_len_a == 1.0
    assert probe_config("base", [("decode.max_len_b", "50")]).decode.max_len_b == 50
    assert probe_config("base", [("model.N", "1")]).model.N == 1


@pytest.mark.parametrize("args, says", [(["--set", "model.N"], "expected SECTION.FIELD=VALUE"),
                                        (["--set", "model.Q=1"], "unknown config key 'model.Q'"),
                                        ([], "spm.model")])
def test_compile_probe_refuses_bad_input_in_one_line(tmp_path, args, says):
    probe = RUN.parent.parent / "decode" / "compile_probe.py"
    res = subprocess.run([sys.executable, str(probe), "--data", str(tmp_path), "--device", "cpu",
                          "--out", str(tmp_path / "p.json"), *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and says in res.stderr.strip().splitlines()[-1] and "Traceback" not in res.stderr
    assert not (tmp_path / "p.json").exists()


def test_decode_launches_counts_fewer_kernels_through_sdpa_and_matches_the_committed_table(tmp_path):
    """bench/decode/decode_launches.py: a GPU's eager step (SDPA) launches far fewer kernels than the written-out
    route, the graphed step three (the replay and its two inputs), and the committed
    bench/decode/decode_launches.json (bench/README.md's table) is what the code counts today: a change to
    the step's kernels must re-run the bench."""
    script = RUN.parent.parent / "decode" / "decode_launches.py"
    res = subprocess.run([sys.executable, str(script), "--presets", "multi30k", "--out", str(tmp_path / "l.json")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {(r["precision"], r["attention"]): r for r in json.loads((tmp_path / "l.json").read_text())["rows"]}
    for precision in ("bfloat16", "float32"):
        sdpa, explicit = rows[precision, "sdpa"], rows[precision, "explicit"]
        assert sdpa["step kernels"] < 0.7 * explicit["step kernels"]
        assert "clone" in explicit["step by op"] and "clone" not in sdpa["step by op"]  # the history read in place
        graphs = rows[precision, "graphs"]  # the tokens and the position copied in, one replay
        assert graphs["step kernels"] == 3 and graphs["step by op"]["graph replay"] == 1
        assert graphs["search kernels per step"] < 0.65 * sdpa["search kernels per step"]
        assert graphs["graphed search kernels per step"] < 0.4 * graphs["search kernels per step"]
    committed = json.loads((RUN.parent.parent / "decode" / "decode_launches.json").read_text())["rows"]
    for r in committed:
        if r["preset"] == "multi30k":
            assert r == rows[r["precision"], r["attention"]], (r["precision"], r["attention"])


def test_decode_launches_refuses_an_unknown_preset_in_one_line(tmp_path):
    script = RUN.parent.parent / "decode" / "decode_launches.py"
    res = subprocess.run([sys.executable, str(script), "--presets", "multi30k,nope",
                          "--out", str(tmp_path / "l.json")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "unknown preset 'nope'" in res.stderr.strip().splitlines()[-1]
    assert "Traceback" not in res.stderr and not (tmp_path / "l.json").exists()


def test_graphed_rows_counts_a_trained_models_search_three_ways(toy_prepared, tmp_path):
    """bench/decode/graphed_rows.py on a model trained here: each graphed search translates as eager beam search
    does, the graph kept whole computes the most decoder rows, shrinking no fewer than eager's, and a
    whole batch is recorded once."""
    aiayn.train(tiny_config(max_steps=30), str(toy_prepared), str(tmp_path / "run"))
    out = tmp_path / "rows.json"
    res = subprocess.run([sys.executable, str(RUN.parent.parent / "decode" / "graphed_rows.py"), "--checkpoint",
                          str(list_checkpoints(tmp_path / "run")[-1]), "--source", str(toy_prepared / "test.en.txt"),
                          "--reference", str(toy_prepared / "test.de.txt"), "--max-tokens", "300", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(out.read_text())
    rows = {r["search"]: r for r in got["rows"]}
    n = got["sentences"]
    assert len(got["batches"]) > 1 and sum(got["batches"]) == n
    assert all(r["same_as_eager"] == n for r in rows.values()) and len({r["bleu"] for r in rows.values()}) == 1
    assert rows["eager"]["row_steps"] <= rows["shrink"]["row_steps"] <= rows["whole"]["row_steps"]
    assert rows["eager"]["recordings"] == 0 and rows["whole"]["recordings"] == len(got["batches"])
    assert rows["shrink"]["recordings"] >= rows["whole"]["recordings"]


@pytest.mark.parametrize("args, says", [(["--checkpoint", "/nonexistent", "--source", "x"], "checkpoint not found"),
                                        (["--checkpoint", "x", "--source", "y", "--beam", "0"], "must be >= 1")])
def test_graphed_rows_refuses_bad_input_in_one_line(tmp_path, args, says):
    res = subprocess.run([sys.executable, str(RUN.parent.parent / "decode" / "graphed_rows.py"), *args, "--out",
                          str(tmp_path / "o.json")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and says in res.stderr.strip().splitlines()[-1] and "Traceback" not in res.stderr
    assert not (tmp_path / "o.json").exists()
