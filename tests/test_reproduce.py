"""`aiayn reproduce`: the quick suite end to end in real processes (run, skip, resume), the
report's verdicts, and Table 1's layers against brute-force references."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from aiayn.attention import attention
from aiayn.baselines.rnn import LSTMCell
from aiayn.config import preset
from aiayn.evidence.report import beats_reference, confirm_section, diverged, table3_section, verdict
from aiayn.evidence.suites import confirm_rows, table3_rows
from aiayn.evidence.table1 import (
    RestrictedSelfAttention,
    _recurrent_encoder_flops,
    make_layers,
    path_length,
    saved_bytes,
)


def reproduce(*args, cwd=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "aiayn", "reproduce", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600, cwd=cwd)


def test_quick_suite_runs_skips_finished_rows_and_resumes_interrupted_ones(toy_prepared, tmp_path):
    work, report = tmp_path / "work", tmp_path / "report"
    start = time.perf_counter()
    p = reproduce("--suite", "quick", "--data", toy_prepared, "--work", work, "--report", report)
    seconds = time.perf_counter() - start
    assert p.returncode == 0, p.stderr[-2000:]
    assert seconds < 120  # the budget for CI
    results = {f"{f.parent.name}/{f.stem}": json.loads(f.read_text()) for f in (report / "results").glob("*/*.json")}
    assert {"table3/ref-s1", "table3/ref-s2", "table3/A-h1", "table3/E", "rnn/transformer", "rnn/rnn-additive",
            "rnn/rnn-dot", "table1/quick"} <= set(results)
    for name, r in results.items():
        if name.startswith("table1"):
            continue
        assert r["updates"] == 8 and r["averaged"] == 5 and r["step"] == 8
        assert set(r["bleu"]) == {"valid", "test"} and r["bleu"]["valid"]["sentences"] == 20
        assert r["flops_per_token"] > 0 and r["params"] > 0 and r["curve"]
    assert results["rnn/rnn-dot"]["params"] != results["rnn/transformer"]["params"]
    # confirm retrains the reference and Table 3's winner (at toy sizes: the best row stands in)
    t3 = {k[len("table3/"):]: r for k, r in results.items() if k.startswith("table3/")}
    best = max((r for r in t3.values() if r["group"] != "ref"), key=lambda r: r["bleu"]["valid"]["bleu"])
    assert {k for k in results if k.startswith("confirm/")} == {"confirm/reference", f"confirm/{best['row']}"}
    assert results[f"confirm/{best['row']}"]["overrides"] == best["overrides"]
    assert results["confirm/reference"]["overrides"] == t3["ref-s1"]["overrides"]
    text = (report / "REPORT.md").read_text()
    for heading in ("## Table 3 at small scale", "## Transformer vs recurrent attention", "## Table 1",
                    "## Does the preset follow the evidence?"):
        assert heading in text
    for png in ("table3_curves", "rnn_curves", "confirm_curves", "table1", "bleu_params", "schedule"):
        assert (report / "img" / f"{png}.png").stat().st_size > 1000
    # A second run skips every finished row: nothing is trained again.
    before = {f: f.read_bytes() for f in work.glob("*/*/result.json")}
    p = reproduce("--suite", "quick", "--data", toy_prepared, "--work", work, "--report", report)
    assert p.returncode == 0 and p.stderr.count("finished earlier, skipped") == 9
    assert {f: f.read_bytes() for f in work.glob("*/*/result.json")} == before
    # An interrupted row (checkpoints up to step 4, no result) resumes where it stopped.
    row = work / "rnn" / "rnn-additive"
    (row / "result.json").unlink()
    for f in (row / "checkpoints").glob("step-*"):
        if int(f.name[5:13]) > 4:
            f.unlink()
    p = reproduce("--suite", "quick", "--data", toy_prepared, "--work", work, "--report", report)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "resumed from step-00000004.safetensors at step 4" in p.stderr
    assert json.loads((row / "result.json").read_text())["updates"] == 8
    # A run folder lost with its machine: the committed result stands in for it, nothing retrains.
    shutil.rmtree(work / "table3" / "E")
    p = reproduce("--suite", "quick", "--data", toy_prepared, "--work", work, "--report", report, "--rows", "E")
    assert p.returncode == 0 and "result already in" in p.stderr and not (work / "table3" / "E").exists()


def test_bad_suite_requests_get_one_line_errors(toy_prepared, tmp_path):
    p = reproduce("--suite", "table3", "--rows", "A-h3", "--data", toy_prepared, "--work", tmp_path)
    assert p.returncode == 2 and "unknown row(s) A-h3 in suite table3" in p.stderr and "Traceback" not in p.stderr
    p = reproduce("--suite", "rnn", "--work", tmp_path)
    assert p.returncode == 2 and "--data" in p.stderr
    p = reproduce("--suite", "rnn", "--data", tmp_path, "--work", tmp_path)
    assert p.returncode == 2 and "not a prepared data folder" in p.stderr
    # confirm before any Table 3 row has beaten the reference: nothing to retrain, nothing trained
    p = reproduce("--suite", "confirm", "--data", toy_prepared, "--work", tmp_path / "w", "--report", tmp_path / "r")
    assert p.returncode == 0 and "nothing to retrain" in p.stderr and not (tmp_path / "w" / "confirm").exists()
    assert "confirm 0 of 0" in (tmp_path / "r" / "REPORT.md").read_text()


def test_table3_rows_are_valid_configs_and_the_reference_runs_three_seeds():
    rows = table3_rows()
    assert [r.seed for r in rows if r.group == "ref"] == [1, 2, 3]
    needed = {"A-h1", "A-h16", "B-dk16", "C-N1", "C-N6", "C-dmodel128", "C-dmodel512", "D-pdrop0.0", "D-ls0.0", "E"}
    assert needed <= {r.name for r in rows}
    ref = preset("multi30k").model
    assert (ref.d_model, ref.h, ref.N) == (256, 4, 3)  # the reference the rows are scaled to
    for r in rows:
        cfg = preset(r.preset)
        for k, v in r.overrides.items():
            section, name = k.split(".")
            setattr(getattr(cfg, section), name, v)
        cfg.validate()
        if r.name.startswith("A-"):  # fixed compute: d_k = d_v = d_model / h
            assert cfg.model.head_dim_k * cfg.model.h == 256 == cfg.model.head_dim_v * cfg.model.h


@pytest.mark.parametrize("ours,noise,paper,expected", [
    (-1.0, 0.4, -0.9, "direction reproduced"),
    (+1.0, 0.4, -0.9, "not reproduced (ours better)"),
    (-0.3, 0.4, -0.9, "within noise (paper: worse)"),
    (0.1, 0.4, -0.1, "reproduced (no change)"),
    (0.8, 0.4, 0.0, "not reproduced (ours better, paper: no change)"),
    (0.8, None, 0.5, "no noise estimate"),
])
def test_bleu_verdicts(ours, noise, paper, expected):
    assert verdict(ours, noise, paper, 0.2, higher_is_better=True) == expected


def test_a_paper_change_of_exactly_one_step_counts_despite_float_rounding():
    assert 26.0 - 25.8 < 0.2  # what the float subtraction gives
    assert verdict(-3.0, 2.7, 26.0 - 25.8, 0.2, higher_is_better=True) == "not reproduced (ours worse)"
    assert verdict(0.5, 0.1, 4.97 - 4.92, 0.05, higher_is_better=False) == "direction reproduced"


def test_perplexity_verdicts_read_lower_as_better():
    assert verdict(0.5, 0.1, 0.37, 0.05, higher_is_better=False) == "direction reproduced"
    assert verdict(-0.5, 0.1, 0.37, 0.05, higher_is_better=False) == "not reproduced (ours better)"


def _result(row, group, ppl, bleu, curve, paper=None):
    return {"row": row, "change": row, "group": group, "seed": 1, "preset": "multi30k", "params": 1e6,
            "updates": 1000, "valid_ppl": ppl, "bleu": {"valid": {"bleu": bleu}}, "paper": paper,
            "common": {"train.max_steps": 1000, "train.warmup_steps": 400}, "machine": {"cpu": "test"},
            "curve": [[s, p, 0.0] for s, p in curve]}


def test_confirm_retrains_only_rows_beyond_the_noise_and_says_whether_the_preset_follows():
    """Rows beating the reference's mean by more than the seed range (and not diverged) go to the
    confirm suite; its verdict uses the same band and reads the preset's current values."""
    refs = [_result(f"ref-s{i}", "ref", 11.0, 27.0 + i, [(1000, 11.0)]) for i in range(3)]  # mean 28, band 2
    win = {**_result("C-N1", "C", 8.0, 30.5, [(1000, 8.0)]), "overrides": {"model.N": 1}}
    near = {**_result("A-h1", "A", 11.0, 29.9, [(1000, 11.0)]), "overrides": {"model.h": 1}}
    gone = {**_result("C-N6", "C", 9000.0, 31.0, [(300, 300.0), (1000, 9000.0)]), "overrides": {"model.N": 6}}
    for r in refs:
        r["overrides"] = {}
    assert beats_reference(refs + [win, near, gone]) == [win]
    assert [(r.name, r.overrides, r.group) for r in confirm_rows(refs + [win, near, gone])] == [
        ("reference", {}, "ref"), ("C-N1", {"model.N": 1}, "candidate")]
    assert confirm_rows(refs + [near]) == [] and confirm_rows(refs[:1] + [win]) == []  # no band: no candidate

    def at_budget(name, bleu, overrides):
        return {**_result(name, "ref" if name == "reference" else "candidate", 6.0, bleu, [(3000, 6.0)]),
                "overrides": overrides, "train_minutes": 30.0, "updates": 3000}

    t3 = refs + [win]
    text = "\n".join(confirm_section([at_budget("reference", 39.0, {}), at_budget("C-N1", 41.5, {"model.N": 1})], t3))
    assert "| C-N1 |" in text and "| +2.50 |" in text and "| beats the reference |" in text
    n_now = preset("multi30k").model.N
    assert ("**C-N1** (C-N1) wins at the main job's budget; the `multi30k` preset "
            + ("has adopted it." if n_now == 1 else "does not have it yet: it should follow.")) in text
    text = "\n".join(confirm_section([at_budget("reference", 39.0, {}), at_budget("C-N1", 40.5, {"model.N": 1})], t3))
    assert "| within noise |" in text and "the `multi30k` preset keeps its settings" in text
    text = "\n".join(confirm_section([at_budget("reference", 39.0, {}),
                                      at_budget("C-N1", 36.5, {"model.N": 1})], t3))
    assert "| worse |" in text and "keeps its settings" in text


def test_a_diverged_row_gets_no_verdict_and_is_named(tmp_path):
    """A row whose final validation PPL is more than twice its own best did not train: the report
    names it with its best and final perplexity and keeps it out of the verdict counts."""
    paper = {"label": "C N=8", "ppl": 4.88, "bleu": 25.5, "ref_ppl": 4.92, "ref_bleu": 25.8}
    refs = [_result(f"ref-s{i}", "ref", 11.0 + i / 10, 27.0 + i, [(500, 20.0), (1000, 11.0 + i / 10)])
            for i in range(3)]
    bad = _result("C-N6", "C", 9000.0, 0.0, [(300, 336.0), (600, 4000.0), (1000, 9000.0)], paper)
    slow = _result("C-N1", "C", 30.0, 20.0, [(500, 60.0), (1000, 30.0)], paper)  # bad, but still improving
    assert diverged(bad) == "diverged: validation PPL 336 at update 300, 9,000 at the end"
    assert diverged(slow) is None and diverged(refs[0]) is None
    text = "\n".join(table3_section(refs + [bad, slow], tmp_path))
    row = next(line for line in text.splitlines() if line.startswith("| C-N6 |"))
    assert row.endswith("| diverged: no verdict | diverged: no verdict |")
    assert "- C-N6 (C-N6) diverged: validation PPL 336 at update 300, 9,000 at the end." in text
    assert "BLEU direction reproduced in 1 of 1 rows; 0 within noise; 0 not reproduced; 1 diverged." in text


def test_restricted_attention_equals_masked_full_attention():
    torch.manual_seed(0)
    d, n, r = 16, 37, 8
    layer = RestrictedSelfAttention(d, 2, r)
    x = torch.randn(2, n, d)
    m = layer.mha
    q, (k, v) = m._split(m.w_q(x), m.d_k), m.project_kv(x)
    i = torch.arange(n)
    band = (i[:, None] - i[None, :]).abs() <= r // 2
    full, _ = attention(q, k, v, band, use_sdpa=False)
    ref = m.w_o(full.transpose(1, 2).reshape(2, n, d))
    assert torch.allclose(layer(x), ref, atol=1e-5)


@pytest.mark.parametrize("name", ["convolution (k=3)", "restricted self-attention (r=32)", "self-attention"])
def test_path_length_is_the_depth_at_which_position_0_reaches_n_minus_1(name):
    n, d = 50, 8
    layer = make_layers(d, h=2)[name]
    L = path_length(name, n)

    def reaches(depth):
        x = torch.randn(1, n, d, requires_grad=True)
        y = x
        for _ in range(depth):
            y = layer(y)
        y[0, n - 1].sum().backward()
        return bool(x.grad[0, 0].abs().sum() > 0)

    assert reaches(L) and (L == 1 or not reaches(L - 1))


def test_explicit_attention_stores_n_squared_the_others_n():
    layers = make_layers(8, h=2)
    ratio = {name: saved_bytes(f, torch.randn(1, 512, 8, requires_grad=True))
             / saved_bytes(f, torch.randn(1, 256, 8, requires_grad=True)) for name, f in layers.items()}
    assert ratio["self-attention"] > 3.5  # n×n weights dominate
    for name in ("recurrent (LSTM)", "convolution (k=3)", "restricted self-attention (r=32)"):
        assert 1.7 < ratio[name] < 2.3, (name, ratio[name])


def test_recurrent_encoder_flops_formula_matches_a_counted_cell_loop():
    enc = torch.nn.LSTM(12, 6, num_layers=2, bidirectional=True, batch_first=True)
    src = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 8]])  # 7 real tokens
    model = torch.nn.Module()
    model.encoder = enc
    formula = _recurrent_encoder_flops(model, src, preset("multi30k-rnn"))
    cells = [LSTMCell(12, 6), LSTMCell(12, 6)]  # layer 2 reads both directions: 2·6 inputs
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast("cpu", dtype=torch.bfloat16):
        for cell in cells:
            for _ in range(2 * 7):  # two directions over the real tokens
                cell(torch.randn(1, 12), (torch.zeros(1, 6), torch.zeros(1, 6)))
    assert formula == counter.get_total_flops()  # the same products (FlopCounterMode ignores biases)


def test_reproduce_command_is_in_the_readme():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "aiayn reproduce --suite quick" in readme and "docs/reproduction/REPORT.md" in readme
