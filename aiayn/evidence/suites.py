"""`aiayn reproduce`: the paper's evidence at small scale, as runs and one generated report.

Suites (their rows are data, plan.py): ``budget`` (the reference trained long, to choose the
update budget), ``table3`` (Table 3's variations, after a stability check of the deepest row),
``arch`` (Transformer, recurrent and convolutional models at one update budget, with their clean
throughput: Table 2's comparison at small scale), ``tune`` (the baselines' rate, clipping and depth,
chosen on validation), ``table1`` (per-layer costs, table1.py) and ``quick`` (their machinery at
toy sizes, for the tests). Every row is a normal run directory (WORK/SUITE/ROW) that writes
``result.json`` once trained and evaluated; finished rows are skipped and interrupted ones resume,
so a suite survives a stopped machine. A suite's rows come from one commit. The report
(report.py) is rendered from the result files alone: no number in it is typed by hand.
"""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from ..checkpoint import list_checkpoints, load_checkpoint, write_averaged
from ..config import Config, ConfigError, apply_overrides, preset
from ..files import atomic_write
from .machine import _code_commit, machine
from .plan import (
    BUDGET_UPDATES,
    DEPTH,
    TINY,
    Row,
    arch_rows,
    depth_rows,
    diverged,
    protocol,
    quick_rows,
    stability_rows,
    table3_rows,
    tune_rows,
)
from .stats import paired_bootstrap

log = logging.getLogger("aiayn")


# -- one row: train, average, evaluate -------------------------------------------------------
def planned(report_dir: Path) -> dict[str, int]:
    """Rows each suite has, for the report's progress line: Table 3's include the stability runs
    made so far, and the depth group's own reference when N=6 diverged."""
    from .report import load_results

    stab = [r for r in load_results(Path(report_dir) / "results").get("table3", []) if r.get("family") == "stability"]
    depth_refs = sum(r.family == "depth" and r.group == "ref" for r in table3_rows(5, 1.0)) if any(
        diverged(r) for r in stab) else 0
    return {"table3": len(table3_rows()) + len(stab) + depth_refs, "arch": len(arch_rows()),
            "tune": len(tune_rows())}


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
            sentences: int = 0, device: str | None = None, allow_mixed: bool = False) -> dict[str, Any]:
    """Train (or resume, or skip) one row and write its result.json, hypotheses beside it; returns the result."""
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
        _check_commit(Path(results) / suite, run_dir, allow_mixed)
        result = _train_and_evaluate(row, suite, common, data_dir, run_dir, sentences, device)
        atomic_write(result_path, json.dumps(result, indent=1).encode())
        log.info("%s/%s: valid NLL %.4f, valid BLEU %.2f", suite, row.name, result["valid_nll"],
                 result["bleu"].get("valid", {}).get("bleu", float("nan")))
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result_path, copy)
    for hyp in sorted(run_dir.glob("*.hyp")):  # the hypotheses, so that anyone can re-score
        atomic_write(copy.parent / f"{row.name}.{hyp.stem}.hyp.gz", gzip.compress(hyp.read_bytes(), mtime=0))
    return result


def _train_and_evaluate(row: Row, suite: str, common: dict[str, Any], data_dir: Path, run_dir: Path,
                        sentences: int, device: str | None) -> dict[str, Any]:
    from ..runs import Run
    from ..train import train

    cfg = row_config(row, common)
    start = time.time()
    if (run_dir / "config.yaml").exists():
        log.info("%s/%s: resuming", suite, row.name)
        state = train(None, data_dir, run_dir, resume=True, device=device)
    else:
        log.info("%s/%s: training (%s)", suite, row.name, row.change)
        state = train(cfg, data_dir, run_dir, device=device)
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    metrics = read_metrics(Run(run_dir).path)
    train_rows = [m for m in metrics if "tgt_tok_s" in m]
    result = {
        "suite": suite, "row": row.name, "change": row.change, "group": row.group, "family": row.family,
        "seed": row.seed, "preset": row.preset, "overrides": row.overrides, "common": common,
        "paper": None if row.paper is None else row.paper.__dict__, "config": cfg.to_dict(),
        "params": _count_params(cfg.model, data_dir), "updates": state["step"], "epochs": state["epoch"],
        "train_minutes": round(state["elapsed"] / 60, 2),
        "tgt_tok_s": statistics.median(m["tgt_tok_s"] for m in train_rows[1:] or train_rows) if train_rows else 0,
        "curve": sorted({m["step"]: [m["step"], m["valid_ppl"], _minutes_at(m["step"], train_rows)]
                         for m in metrics if "valid_ppl" in m}.values()),
        "train_curve": [[m["step"], m["ppl"]] for m in train_rows],
        "machine": machine(), "device": dev, "precision": cfg.train.precision,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "wall_minutes": round((time.time() - start) / 60, 1),
    }
    result["data"] = _data_words(data_dir)
    result.update(evaluate(run_dir, data_dir, sentences, dev))
    return result


def _data_words(data_dir: Path) -> dict[str, Any]:
    """What a row trained on: the prepared folder's name, its languages and training pairs."""
    from ..data import load_manifest

    m = load_manifest(Path(data_dir))
    return {"dir": Path(data_dir).name, "src": m["settings"]["src"], "tgt": m["settings"]["tgt"],
            "train_pairs": m["splits"]["train"]["pairs"]}


def _check_commit(suite_results: Path, run_dir: Path, allow_mixed: bool) -> None:
    """A suite's rows come from one commit: refuse to train a row with other code than its results'."""
    now = _code_commit()
    seen = set()
    for f in sorted(suite_results.glob("*.json")):
        try:
            seen.add(json.loads(f.read_text()).get("machine", {}).get("git"))
        except (OSError, json.JSONDecodeError):
            continue
    other = sorted(str(c) for c in seen - {now})
    if other and not allow_mixed:
        raise ConfigError(f"{suite_results}: results from commit(s) {', '.join(other)}, this code is {now}; a "
                          "suite's rows come from one commit: move that folder away to rerun the suite, or pass "
                          "--allow-mixed-commits (the report then names the commits)")
    if now is not None and now.endswith("+dirty") and not allow_mixed:
        log.warning("%s: training from uncommitted changes (%s): the result cannot be traced", run_dir, now)


def pair_with_references(suite: str, results: Path, data_dir: Path, baseline_of) -> None:
    """sacreBLEU's paired bootstrap of every row's validation hypotheses against its baseline
    (`baseline_of(result)`: a row name, e.g. the seed-matched reference), once both are there."""
    from ..data import load_manifest

    folder = Path(results) / suite
    settings = load_manifest(Path(data_dir))["settings"]
    refs = (Path(data_dir) / f"valid.{settings['tgt']}.txt").read_text().splitlines()
    for path in sorted(folder.glob("*.json")):
        r = json.loads(path.read_text())
        base = baseline_of(r)
        hyp, base_hyp = folder / f"{r['row']}.valid.hyp.gz", folder / f"{base}.valid.hyp.gz"
        if base is None or "paired_bs" in r or not (hyp.exists() and base_hyp.exists()):
            continue
        hyps, base_hyps = (gzip.decompress(p.read_bytes()).decode().splitlines() for p in (hyp, base_hyp))
        n = min(len(refs), r["bleu"]["valid"]["sentences"])
        r["paired_bs"] = {"baseline": base, "split": "valid", **paired_bootstrap(base_hyps, hyps, refs[:n])}
        atomic_write(path, json.dumps(r, indent=1).encode())


def _seed_matched(r: dict) -> str | None:
    """Table 3: a row is paired with the reference seed that saw the same data order."""
    if r["group"] == "ref" or r["family"] == "stability":
        return None
    return f"{'depth-' if r['family'] == 'depth' else ''}ref-s{r['seed']}"


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


# -- the suites ----------------------------------------------------------------------------------
SUITES = ("budget", "table3", "arch", "tune", "table1", "quick")


def stability(rows: list[Row], common: dict[str, Any], ctx: dict[str, Any]) -> float | None:
    """Table 3's deepest row at the suite's schedule (for 2 warm-ups' worth of updates), then at lower
    rates: None when N=6 trains at the suite's rate, else the first train.lr_scale at which it does."""
    for i, row in enumerate(rows):
        cfg = row_config(row, common)
        short = {**common, **protocol(min(common["train.max_steps"], 2 * cfg.train.warmup_steps))}
        if not diverged(run_row(row, "table3", short, **ctx)):
            return None if i == 0 else cfg.train.lr_scale
    log.warning("N=6 diverged at every rate tried; the depth rows run at the lowest (%s)", rows[-1].name)
    return row_config(rows[-1], common).train.lr_scale


def _run_rows(suite: str, rows: list[Row], common: dict[str, Any], ctx: dict[str, Any], only: list[str] | None,
              render_report) -> list[dict]:
    chosen = [r for r in rows if r.name in only or r.group in only] if only else rows
    for row in chosen:
        row_config(row, common)  # every config checked before the first run starts
    out = []
    for row in chosen:
        out.append(run_row(row, suite, common, **ctx))
        render_report()
    return out


def reproduce(suite: str, data_dir: Path | None, work: Path, report_dir: Path, rows: list[str] | None = None,
              steps: int | None = None, seeds: int = 5, device: str | None = None, command: str = "",
              allow_mixed: bool = False) -> Path:
    """Run a suite (skipping finished rows, resuming interrupted ones) and render the report."""
    from .report import render

    if suite not in SUITES:
        raise ConfigError(f"unknown suite {suite!r}; choose from: {', '.join(SUITES)}")
    _code_commit()
    steps = steps or (2 * BUDGET_UPDATES if suite == "budget" else BUDGET_UPDATES)
    report_dir = Path(report_dir)
    results = report_dir / "results"
    if suite != "table1":
        _check_data(data_dir)
        _check_rows(suite, rows, seeds)
    ctx = {"data_dir": Path(data_dir or "."), "work": Path(work), "results": results, "device": device,
           "allow_mixed": allow_mixed, "sentences": 20 if suite == "quick" else 0}

    def render_report() -> None:
        render(report_dir, command, planned(report_dir))

    if suite == "quick":
        _quick(ctx, rows, render_report)
    elif suite == "budget":
        _run_rows("budget", [Row("ref", "reference")], {**protocol(steps), "train.valid_every": max(1, steps // 24)},
                  ctx, rows, render_report)
    elif suite == "table3":
        _table3(table3_rows(seeds), stability_rows(), seeds, protocol(steps), ctx, rows, render_report)
    elif suite in ("arch", "tune"):
        _arch(suite, arch_rows() if suite == "arch" else tune_rows(), protocol(steps), ctx, rows,
              render_report)
    if suite in ("table1", "quick"):
        _table1(results, suite == "quick", device)
    return render(report_dir, command, planned(report_dir))


def _table3(rows: list[Row], stab: list[Row], seeds: int, common: dict[str, Any], ctx: dict[str, Any],
            only: list[str] | None, render_report) -> None:
    """The stability check, then the reference seeds and the rows, then the paired tests."""
    wanted = not only or any(r.name in only for r in stab + depth_rows(seeds, 1.0, rows))
    lr_scale = stability(stab, common, ctx) if wanted else None  # only the depth rows need the check
    if lr_scale is not None:
        rows = [r for r in rows if r.name not in DEPTH] + depth_rows(seeds, lr_scale, rows)
    _run_rows("table3", rows, common, ctx, only, render_report)
    pair_with_references("table3", ctx["results"], ctx["data_dir"], _seed_matched)
    render_report()


def _arch(suite: str, rows: list[Row], common: dict[str, Any], ctx: dict[str, Any], only: list[str] | None,
          render_report, updates: int = 10, rounds: int = 3) -> None:
    """The rows by updates, their clean throughput apart, and the paired tests against the Transformer."""
    from .throughput import measure_throughput

    _run_rows(suite, rows, common, ctx, only, render_report)
    if suite == "arch":
        path = ctx["results"] / suite / "throughput" / "throughput.json"
        if not path.exists():
            out = measure_throughput({r.name: row_config(r, common) for r in rows}, ctx["data_dir"], updates,
                                     rounds, ctx["device"])
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(out, indent=1).encode())
        pair_with_references(suite, ctx["results"], ctx["data_dir"],
                             lambda r: None if r["row"] == "transformer" else "transformer")
    render_report()


def _quick(ctx: dict[str, Any], only: list[str] | None, render_report) -> None:
    """Every suite's machinery at toy sizes (8 updates a row): not the findings."""
    q = quick_rows()
    common = protocol(8)
    stab = stability_rows((1.0, 0.02), TINY, lr_scale=40.0)  # diverges at ×1 on purpose, trains at 0.8
    _table3(q["table3"], stab, 2, common, ctx, only, render_report)
    _arch("arch", q["arch"], common, ctx, only, render_report, updates=2, rounds=1)
    _arch("tune", q["tune"], common, ctx, only, render_report)


def _table1(results: Path, quick: bool, device: str | None) -> None:
    from .table1 import measure_table1

    out = measure_table1(ns=(16, 32, 64) if quick else (16, 32, 64, 128, 256, 512, 1024, 2048),
                         d=32 if quick else 512, repeats=1 if quick else 5, device=device)
    path = results / "table1" / ("quick.json" if quick else "table1.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(out, indent=1).encode())


def _check_data(data_dir: Path | None) -> None:
    if data_dir is None:
        raise ConfigError("this suite trains models: give a prepared data folder with --data")
    if not (Path(data_dir) / "manifest.json").exists():
        raise ConfigError(f"{data_dir}: not a prepared data folder (run `aiayn prepare` first)")


def _check_rows(suite: str, rows: list[str] | None, seeds: int) -> None:
    q = quick_rows()
    known = {"budget": ["ref"], "table3": [r.name for r in table3_rows(seeds, 0.4) + stability_rows()],
             "arch": [r.name for r in arch_rows()], "tune": [r.name for r in tune_rows()],
             "quick": [r.name for rs in q.values() for r in rs]}[suite]
    known += ["ref"] if suite in ("table3", "quick") else []  # a group: every reference seed
    unknown = [r for r in rows or [] if r not in known]
    if unknown:
        raise ConfigError(f"unknown row(s) {', '.join(unknown)} in suite {suite}; "
                          f"rows: {', '.join(dict.fromkeys(known))}")
