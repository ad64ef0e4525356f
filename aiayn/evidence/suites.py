"""`aiayn reproduce`: the paper's evidence at small scale, as runs and one generated report.

Suites: ``table3`` (Table 3's variations, scaled to the `multi30k` model), ``rnn`` (the
recurrent attention models of §1-2 against the Transformer at one wall-clock budget, the analog
of Table 2), ``confirm`` (Table 3 rows that beat the reference, retrained at the main job's budget
before the `multi30k` preset follows them), ``table1`` (per-layer costs, table1.py) and
``quick`` (all of them at toy sizes, for the tests). A suite is data: rows of named config
overrides. Every row is a normal run directory (WORK/SUITE/ROW) that writes ``result.json``
once trained and evaluated; finished rows are skipped and interrupted ones resume, so a suite
survives a stopped machine. The report (report.py) is rendered from the result files alone:
no number in it is typed by hand.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from ..checkpoint import list_checkpoints, load_checkpoint, write_averaged
from ..config import Config, ConfigError, apply_overrides, preset
from ..files import atomic_write
from .machine import _code_commit, machine

log = logging.getLogger("aiayn")


@dataclass(frozen=True)
class PaperRow:
    """A row of Table 3 (newstest2013 dev PPL / BLEU) and the row it is compared with."""

    label: str
    ppl: float
    bleu: float
    ref_ppl: float = 4.92  # base
    ref_bleu: float = 25.8


@dataclass(frozen=True)
class Row:
    """One run of a suite: config overrides on a preset, and what the paper measured for it."""

    name: str
    change: str  # what differs from the suite's reference, in the paper's notation
    overrides: dict[str, Any] = field(default_factory=dict)
    preset: str = "multi30k"
    seed: int = 1
    paper: PaperRow | None = None
    group: str = ""  # Table 3's row letter, or "ref"


# -- the suites ------------------------------------------------------------------------------
# Table 3 scaled to the multi30k reference (d_model 256, h 4, N 3, d_ff 1024, P_drop 0.2):
# each of our rows is compared with the paper's row that changes the base model the same way.
_P = PaperRow


def table3_rows(seeds: int = 3) -> list[Row]:
    """Reference ×seeds first, then the rows the committed report needs, then the rest."""
    ref = [Row(f"ref-s{s}", "reference", seed=s, group="ref") for s in range(1, seeds + 1)]
    rows = [
        Row("A-h1", "h=1, d_k=d_v=256", {"model.h": 1}, paper=_P("A h=1, d_k=512", 5.29, 24.9), group="A"),
        Row("A-h16", "h=16, d_k=d_v=16", {"model.h": 16}, paper=_P("A h=32, d_k=16", 5.01, 25.4), group="A"),
        Row("B-dk16", "d_k=16", {"model.d_k": 16, "model.d_v": 64}, paper=_P("B d_k=16", 5.16, 25.1), group="B"),
        Row("C-N1", "N=1", {"model.N": 1}, paper=_P("C N=2", 6.11, 23.7), group="C"),
        Row("C-N6", "N=6", {"model.N": 6}, paper=_P("C N=8", 4.88, 25.5), group="C"),
        Row("C-dmodel128", "d_model=128, d_k=32", {"model.d_model": 128},
            paper=_P("C d_model=256, d_k=32", 5.75, 24.5), group="C"),
        Row("C-dmodel512", "d_model=512, d_k=128", {"model.d_model": 512},
            paper=_P("C d_model=1024, d_k=128", 4.66, 26.0), group="C"),
        Row("D-pdrop0.0", "P_drop=0.0", {"model.p_drop": 0.0}, paper=_P("D P_drop=0.0", 5.77, 24.6), group="D"),
        Row("D-ls0.0", "ε_ls=0.0", {"train.label_smoothing": 0.0}, paper=_P("D ε_ls=0.0", 4.67, 25.3), group="D"),
        Row("E", "learned positional embedding", {"model.learned_positions": True},
            paper=_P("E positional embedding", 4.92, 25.7), group="E"),
        Row("A-h2", "h=2, d_k=d_v=128", {"model.h": 2}, paper=_P("A h=4, d_k=128", 5.00, 25.5), group="A"),
        Row("A-h8", "h=8, d_k=d_v=32", {"model.h": 8}, paper=_P("A h=16, d_k=32", 4.91, 25.8), group="A"),
        Row("B-dk32", "d_k=32", {"model.d_k": 32, "model.d_v": 64}, paper=_P("B d_k=32", 5.01, 25.4), group="B"),
        Row("C-N2", "N=2", {"model.N": 2}, paper=_P("C N=4", 5.19, 25.3), group="C"),
        Row("C-dff512", "d_ff=512", {"model.d_ff": 512}, paper=_P("C d_ff=1024", 5.12, 25.4), group="C"),
        Row("C-dff2048", "d_ff=2048", {"model.d_ff": 2048}, paper=_P("C d_ff=4096", 4.75, 26.2), group="C"),
        # Our reference drops with 0.2; the paper's base with 0.1 and its D row with 0.2.
        Row("D-pdrop0.1", "P_drop=0.1", {"model.p_drop": 0.1},
            paper=_P("base P_drop=0.1 vs D P_drop=0.2", 4.92, 25.8, 4.95, 25.5), group="D"),
        Row("D-pdrop0.3", "P_drop=0.3", {"model.p_drop": 0.3},
            paper=_P("D P_drop=0.2 vs base 0.1", 4.95, 25.5), group="D"),
        Row("D-ls0.2", "ε_ls=0.2", {"train.label_smoothing": 0.2}, paper=_P("D ε_ls=0.2", 5.47, 25.7), group="D"),
    ]
    return ref + rows


def table3_common(steps: int, warmup: int) -> dict[str, Any]:
    """Every Table 3 row gets the same number of updates (as in the paper), so its result does not
    depend on the machine's speed; checkpoints every steps/20 updates, the last 5 averaged (§6.1)."""
    every = max(1, steps // 20)
    return {"train.max_steps": steps, "train.warmup_steps": warmup, "train.max_minutes": 0.0,
            "train.max_epochs": 0, "train.valid_every": max(1, steps // 10), "train.valid_bleu_sentences": 0,
            "train.save_every": every, "train.save_every_minutes": 0.0, "train.keep_last": 5,
            "train.log_every": max(1, steps // 40)}


def rnn_rows() -> list[Row]:
    return [
        Row("transformer", "Transformer (multi30k preset)", group="transformer"),
        Row("rnn-additive", "bi-LSTM encoder, LSTM decoder, additive attention (Bahdanau et al.)",
            {"model.rnn_attention": "additive"}, preset="multi30k-rnn", group="rnn"),
        Row("rnn-dot", "bi-LSTM encoder, LSTM decoder, dot attention (Luong et al.)",
            {"model.rnn_attention": "dot"}, preset="multi30k-rnn", group="rnn"),
    ]


def rnn_common(minutes: float) -> dict[str, Any]:
    """The same wall-clock budget for every model: the paper's argument is training cost."""
    every = max(0.05, minutes / 12)
    return {"train.max_minutes": minutes, "train.max_steps": 10_000_000, "train.max_epochs": 0,
            "train.save_every": 0, "train.save_every_minutes": every, "train.keep_last": 5,
            "train.valid_every": 200, "train.valid_bleu_sentences": 0}


def confirm_rows(table3: list[dict], stand_in: bool = False) -> list[Row]:
    """Before the `multi30k` preset follows a Table 3 row that beat the reference beyond the noise
    (report.beats_reference), the row and the reference are retrained at the main job's own budget.
    Rows keep their Table 3 names and overrides; none when no row beat the reference. `stand_in`
    (the quick suite) takes the best row when none did, to exercise the machinery."""
    from .report import _valid_bleu, beats_reference

    cands = beats_reference(table3)
    others = [r for r in table3 if r["group"] != "ref"]
    if not cands and stand_in and others:
        cands = [max(others, key=_valid_bleu)]
    if not cands:
        return []
    ref_overrides = next((r["overrides"] for r in table3 if r["group"] == "ref"), {})
    return [Row("reference", "the multi30k preset (the main job)", ref_overrides, group="ref"),
            *(Row(r["row"], r["change"], r["overrides"], group="candidate") for r in cands)]


# Toy sizes for `--suite quick`: checks the machinery in seconds, not the findings.
_TINY = {"model.d_model": 32, "model.d_ff": 64, "model.h": 4, "model.N": 1, "model.max_positions": 128,
         "data.max_tokens": 400, "train.threads": 1, "train.precision": "fp32", "decode.max_len_b": 10}


def quick_rows() -> tuple[list[Row], list[Row]]:
    t3 = [Row("ref-s1", "reference", _TINY, group="ref"), Row("ref-s2", "reference", _TINY, seed=2, group="ref"),
          Row("A-h1", "h=1", {**_TINY, "model.h": 1}, paper=_P("A h=1, d_k=512", 5.29, 24.9), group="A"),
          Row("E", "learned positions", {**_TINY, "model.learned_positions": True},
              paper=_P("E positional embedding", 4.92, 25.7), group="E")]
    rnn = [Row("transformer", "Transformer", _TINY, group="transformer"),
           Row("rnn-additive", "additive", {**_TINY, "model.rnn_attention": "additive"}, preset="multi30k-rnn",
               group="rnn"),
           Row("rnn-dot", "dot", {**_TINY, "model.rnn_attention": "dot"}, preset="multi30k-rnn", group="rnn")]
    return t3, rnn


# -- one row: train, average, evaluate -------------------------------------------------------
def planned(report_dir: Path) -> dict[str, int]:
    """Rows each suite has, for the report's progress line (confirm's follow table3's results)."""
    return {"table3": len(table3_rows()), "rnn": len(rnn_rows()),
            "confirm": len(confirm_rows(_table3_results(Path(report_dir) / "results")))}


def row_config(row: Row, common: dict[str, Any]) -> Config:
    cfg = preset(row.preset)
    apply_overrides(cfg, {**common, **row.overrides})
    cfg.train.seed = row.seed
    return cfg.validate()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def evaluate(run_dir: Path, data_dir: Path, sentences: int = 0, device: str = "cpu") -> dict[str, Any]:
    """§6.1: average the last checkpoints (at most 5), then validation perplexity and beam-4 BLEU on
    the validation set and every prepared test set (sentences > 0: only the first ones)."""
    from ..batches import TokenData
    from ..data import load_manifest
    from ..steps import validate
    from ..translate import Translator

    run_dir, data_dir = Path(run_dir), Path(data_dir)
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise ConfigError(f"{run_dir}: no checkpoints to evaluate")
    averaged = run_dir / "averaged.safetensors"
    chosen = ckpts[-5:]
    write_averaged(chosen, averaged)
    model, cfg, tokenizer, step = load_checkpoint(averaged, device)
    cfg.train.precision = "fp32"  # the same numbers whatever the processor
    out: dict[str, Any] = {"averaged": len(chosen), "step": step}
    out.update(validate(model, TokenData(data_dir, "valid"), cfg, torch.device(device)))
    from .table1 import flops_per_token

    out["flops_per_token"] = flops_per_token(model, TokenData(data_dir, "valid"), cfg)
    settings = load_manifest(data_dir)["settings"]
    translator = Translator(model, tokenizer, cfg.decode, precision="fp32")
    bleu: dict[str, dict[str, Any]] = {}
    metric = sacrebleu.BLEU()
    splits = ["valid"] + [s for s in load_manifest(data_dir)["splits"] if s not in ("train", "valid")]
    for split in splits:
        src_path, ref_path = data_dir / f"{split}.{settings['src']}.txt", data_dir / f"{split}.{settings['tgt']}.txt"
        if not (src_path.exists() and ref_path.exists()):
            continue
        src, ref = src_path.read_text().splitlines(), ref_path.read_text().splitlines()
        if sentences:
            src, ref = src[:sentences], ref[:sentences]
        start = time.perf_counter()
        hyps = translator.translate(src)
        score = metric.corpus_score(hyps, [ref])
        bleu[split] = {"bleu": round(score.score, 2), "bp": round(score.bp, 3), "sentences": len(src),
                       "seconds": round(time.perf_counter() - start, 1)}
        (run_dir / f"{split}.hyp").write_text("".join(h + "\n" for h in hyps))
    out["bleu"] = bleu
    out["signature"] = str(metric.get_signature())
    out["decode"] = {"beam": cfg.decode.beam, "alpha": cfg.decode.alpha, "max_len_b": cfg.decode.max_len_b}
    return out


def run_row(row: Row, suite: str, common: dict[str, Any], data_dir: Path, work: Path, results: Path,
            sentences: int = 0, device: str | None = None) -> dict[str, Any]:
    """Train (or resume, or skip) one row and write its result.json; returns the result."""
    from ..runs import Run
    from ..train import train

    run_dir = Path(work) / suite / row.name
    result_path = run_dir / "result.json"
    copy = Path(results) / suite / f"{row.name}.json"
    if not run_dir.exists() and _same_row(copy, row, common):  # the run folder went, its result stayed
        log.info("%s/%s: result already in %s, skipped", suite, row.name, copy)
        return json.loads(copy.read_text())
    if result_path.exists():
        log.info("%s/%s: finished earlier, skipped", suite, row.name)
        result = json.loads(result_path.read_text())
    else:
        cfg = row_config(row, common)
        start = time.time()
        if (run_dir / "config.yaml").exists():
            log.info("%s/%s: resuming", suite, row.name)
            state = train(None, data_dir, run_dir, resume=True, device=device)
        else:
            log.info("%s/%s: training (%s)", suite, row.name, row.change)
            state = train(cfg, data_dir, run_dir, device=device)
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model_cfg = cfg.model
        metrics = read_metrics(Run(run_dir).path)
        train_rows = [m for m in metrics if "tgt_tok_s" in m]
        n_params = _count_params(model_cfg, data_dir)
        result = {
            "suite": suite, "row": row.name, "change": row.change, "group": row.group, "seed": row.seed,
            "preset": row.preset, "overrides": row.overrides, "common": common,
            "paper": None if row.paper is None else row.paper.__dict__,
            "params": n_params, "updates": state["step"], "epochs": state["epoch"],
            "train_minutes": round(state["elapsed"] / 60, 2),
            "tgt_tok_s": statistics.median(m["tgt_tok_s"] for m in train_rows[1:] or train_rows) if train_rows else 0,
            "curve": sorted({m["step"]: [m["step"], m["valid_ppl"], _minutes_at(m["step"], train_rows)]
                             for m in metrics if "valid_ppl" in m}.values()),
            "train_curve": [[m["step"], m["ppl"]] for m in train_rows],
            "machine": machine(), "device": dev, "precision": cfg.train.precision,
            "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "wall_minutes": round((time.time() - start) / 60, 1),
        }
        result.update(evaluate(run_dir, data_dir, sentences, dev))
        atomic_write(result_path, json.dumps(result, indent=1).encode())
        log.info("%s/%s: valid ppl %.3f, valid BLEU %.2f", suite, row.name, result["valid_ppl"],
                 result["bleu"].get("valid", {}).get("bleu", float("nan")))
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result_path, copy)
    return result


def _table3_results(results: Path) -> list[dict]:
    from .report import load_results

    return load_results(results).get("table3", [])


def _same_row(path: Path, row: Row, common: dict[str, Any]) -> bool:
    """A result file written for this very row: same preset, overrides, seed and suite settings."""
    try:
        r = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (r.get("preset"), r.get("overrides"), r.get("seed"), r.get("common")) == (
        row.preset, row.overrides, row.seed, common)


def _minutes_at(step: int, train_rows: list[dict]) -> float:
    """Training minutes when `step` was reached (from the last training record at or before it)."""
    seen = [m["elapsed_s"] for m in train_rows if m["step"] <= step and "elapsed_s" in m]
    return round(max(seen, default=0.0) / 60, 3)


def _count_params(model_cfg, data_dir: Path) -> int:
    from ..data import load_manifest
    from ..models import build_model

    model_cfg.vocab_size = int(load_manifest(data_dir)["vocab_size"])
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(model_cfg).parameters())


# -- the command -------------------------------------------------------------------------------
SUITES = ("table3", "rnn", "confirm", "table1", "quick")


def reproduce(suite: str, data_dir: Path | None, work: Path, report_dir: Path, rows: list[str] | None = None,
              steps: int = 1000, warmup: int = 400, minutes: float = 20.0, seeds: int = 3,
              device: str | None = None, command: str = "") -> Path:
    """Run a suite (skipping finished rows, resuming interrupted ones) and render the report."""
    from .report import render

    if suite not in SUITES:
        raise ConfigError(f"unknown suite {suite!r}; choose from: {', '.join(SUITES)}")
    _code_commit()
    results = Path(report_dir) / "results"
    plan: list[tuple[str, list[Row], dict[str, Any], int]] = []
    if suite == "table3":
        plan.append(("table3", table3_rows(seeds), table3_common(steps, warmup), 0))
    elif suite == "rnn":
        plan.append(("rnn", rnn_rows(), rnn_common(minutes), 0))
    elif suite == "confirm":
        # the preset's own budget (30 minutes for multi30k): common settings change nothing
        plan.append(("confirm", confirm_rows(_table3_results(results)), {}, 0))
    elif suite == "quick":
        t3, rnn = quick_rows()
        plan += [("table3", t3, table3_common(8, 4), 20), ("rnn", rnn, {**table3_common(8, 4)}, 20),
                 ("confirm", [], table3_common(8, 4), 20)]  # rows known once table3 has run
    if suite in ("table3", "rnn", "confirm", "quick"):
        if data_dir is None:
            raise ConfigError("this suite trains models: give a prepared data folder with --data")
        if not (Path(data_dir) / "manifest.json").exists():
            raise ConfigError(f"{data_dir}: not a prepared data folder (run `aiayn prepare` first)")
    known = [r.name for _, suite_rows, _, _ in plan for r in suite_rows]
    unknown = [r for r in rows or [] if r not in known]
    if unknown:
        raise ConfigError(f"unknown row(s) {', '.join(unknown)} in suite {suite}; rows: {', '.join(known)}")
    for name, suite_rows, common, sentences in plan:
        if name == "confirm" and suite == "quick":  # the rows follow this invocation's table3 results
            suite_rows = confirm_rows(_table3_results(results), stand_in=True)
        if name == "confirm" and not suite_rows:
            log.info("confirm: no Table 3 row beats the reference beyond the noise; nothing to retrain")
        chosen = [r for r in suite_rows if r.name in rows] if rows else suite_rows
        for row in chosen:
            row_config(row, common)  # every config checked before the first run starts
        for row in chosen:
            run_row(row, name, common, Path(data_dir), Path(work), results, sentences, device)
            render(Path(report_dir), command, planned(Path(report_dir)))
    if suite in ("table1", "quick"):
        from .table1 import measure_table1

        quick = suite == "quick"
        out = measure_table1(ns=(16, 32, 64) if quick else (16, 32, 64, 128, 256, 512, 1024, 2048),
                             d=32 if quick else 512, repeats=1 if quick else 5, device=device)
        path = results / "table1" / ("quick.json" if quick else "table1.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(out, indent=1).encode())
    return render(Path(report_dir), command, planned(Path(report_dir)))
