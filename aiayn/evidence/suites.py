"""`aiayn reproduce`: the paper's evidence at small scale, as runs and one generated report.

Suites (their rows are data, plan.py): ``budget`` (the reference trained long, to choose the
update budget), ``table3`` (Table 3's variations, after a stability check of the deepest row),
``arch`` (Transformer, recurrent and convolutional models at one update budget, with their clean
throughput: Table 2's comparison at small scale), ``tune`` (every family's peak rate and
clipping, the Transformer's included, chosen on validation; then seeds at each choice, and at equal
FLOPs), ``decode`` (the tune suite's compared runs trained again, each decoded at the beam and α
chosen on its validation set), ``table1`` (per-layer costs, table1.py) and ``quick`` (their machinery at
toy sizes, for the tests). Every row is a normal run directory (WORK/SUITE/ROW) that writes
``result.json`` once trained and evaluated; finished rows are skipped and interrupted ones resume,
so a suite survives a stopped machine. A suite's rows come from one commit. The report
(report.py) is rendered from the result files alone: no number in it is typed by hand.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..files import atomic_write
from .machine import code_commit
from .plan import (
    BUDGET_UPDATES,
    DEPTH,
    SUITES,
    TINY,
    Row,
    arch_rows,
    depth_rows,
    diverged,
    protocol,
    quick_rows,
    repeat,
    second_seed_distance,
    stability_rows,
    table3_rows,
    tune_rows,
    unstable,
)
from .report import load_results, render
from .rows import pair_with_references, row_config, run_row, run_rows, seed_matched
from .table1 import measure_table1
from .throughput import measure_throughput
from .tuning import ARCH_SEEDS, decode_rows, run_decode, run_tune, tune_planned

log = logging.getLogger("aiayn")


def planned(report_dir: Path, seeds: int = 5, arch_seeds: int = 3, rows: list[str] | None = None,
            results_dir: Path | None = None) -> dict[str, int]:
    """Rows each suite has, for the report's progress line (second seeds of Table 3 apart): Table 3's
    `seeds` references and its rows, the stability runs made so far and the depth group's own
    references when N=6 diverged; arch's its later seeds of the Transformer and of each other
    family's best; `rows`: the --rows a table3 report's run was given (those it names, as it runs
    them). A quick report's rows (toy-sized, TINY) are the quick suite's. The results are read from
    `results_dir` (default REPORT_DIR/results)."""

    results_dir = Path(results_dir) if results_dir is not None else Path(report_dir) / "results"
    results = load_results(results_dir)
    quick = any(TINY.items() <= r.get("overrides", {}).items() for rs in results.values() for r in rs)
    stab = [r for r in results.get("table3", []) if r.get("family") == "stability"]
    full = {"table3": table3_rows(seeds), "arch": arch_rows(), "tune": tune_rows()}
    seeds, q = (QUICK_SEEDS, quick_rows()) if quick else (seeds, full)
    arch_seeds = QUICK_SEEDS if quick else arch_seeds
    families = len({r.group for r in q["arch"]})
    return {"table3": _table3_planned(q["table3"], stab, seeds, rows),
            "arch": len(q["arch"]) + families * (arch_seeds - 1),
            "tune": tune_planned(q["tune"], results_dir, results, arch_seeds),
            "decode": len(decode_rows(q["tune"], results_dir, 1, arch_seeds))}


def _table3_planned(rows: list[Row], stab: list[dict], seeds: int, only: list[str] | None) -> int:
    """Table 3's runs as _table3 makes them: its rows, the depth group's references when N=6 diverged
    and the stability runs made so far, of them the ones `only` names (the stability runs when it
    names a depth row)."""
    deep = depth_rows(seeds, 1.0, rows)
    plan = rows + ([r for r in deep if r.group == "ref"] if any(unstable(r) for r in stab) else [])
    if not only:
        return len(plan) + len(stab)
    wanted = any(r.name in only for r in stability_rows() + deep)
    return sum(r.name in only or r.group in only for r in plan) + len(stab) * wanted


# -- the suites ----------------------------------------------------------------------------------
QUICK_SEEDS = 2  # the quick suite's seeds of the reference depth group and of the arch models
# The report is re-rendered as rows finish, at most this often: a real suite's row trains for an hour,
# the quick suite's for seconds (and rendering the figures takes about one).
RENDER_EVERY_S = 60.0


def at_most_every(seconds: float, fn, clock=time.monotonic):
    """fn, called again only once `seconds` have passed since its last run (the first call runs it)."""
    last = [float("-inf")]

    def call() -> None:
        if clock() - last[0] >= seconds:
            fn()
            last[0] = clock()
    return call


def stability(rows: list[Row], common: dict[str, Any], ctx: dict[str, Any]) -> float | None:
    """Table 3's deepest row at the suite's schedule (for 2 warm-ups' worth of updates), then at lower
    rates: None when N=6 trains at the suite's rate, else the first train.lr_scale at which it does."""
    for i, row in enumerate(rows):
        cfg = row_config(row, common)
        short = {**common, **protocol(min(common["train.max_steps"], 2 * cfg.train.warmup_steps))}
        if not unstable(run_row(row, "table3", short, **ctx)):
            return None if i == 0 else cfg.train.lr_scale
    log.warning("N=6 did not train at any rate tried; the depth rows run at the lowest (%s)", rows[-1].name)
    return row_config(rows[-1], common).train.lr_scale


def reproduce(suite: str, data_dir: Path | None, work: Path, report_dir: Path, rows: list[str] | None = None,
              steps: int | None = None, seeds: int = 5, device: str | None = None, command: str = "",
              allow_mixed: bool = False, extra_seeds: int = 12, valid_every: int | None = None,
              results_dir: Path | None = None, locations: str = "") -> Path:
    """Run a suite (skipping finished rows, resuming interrupted ones) and render the report;
    extra_seeds: at most this many second-seed runs of Table 3's rows near the line; valid_every:
    validation spacing in updates (default: a tenth of the run); results_dir: where the result files
    go (default REPORT_DIR/results); locations: as render's."""

    if suite not in SUITES:
        raise ConfigError(f"unknown suite {suite!r}; choose from: {', '.join(SUITES)}")
    code_commit()
    steps = steps or (2 * BUDGET_UPDATES if suite == "budget" else BUDGET_UPDATES)
    report_dir = Path(report_dir)
    results = Path(results_dir) if results_dir is not None else report_dir / "results"
    if suite != "table1":
        _check_data(data_dir)
        check_rows(suite, rows, seeds)
    ctx = {"data_dir": Path(data_dir or "."), "work": Path(work), "results": results, "device": device,
           "allow_mixed": allow_mixed, "sentences": 20 if suite == "quick" else 0}

    # while rows run; the report is rendered once more after the last
    def render_now() -> Path:
        return render(report_dir, command, planned(report_dir, seeds, results_dir=results), seeds,
                      results_dir=results, locations=locations)

    render_report = at_most_every(RENDER_EVERY_S, render_now)

    if suite == "quick":
        _quick(ctx, rows, render_report)
    elif suite == "budget":
        run_rows("budget", [Row("ref", "reference")], {**protocol(steps), "train.valid_every": max(1, steps // 24)},
                  ctx, rows, render_report)
    elif suite == "table3":
        _table3(table3_rows(seeds), stability_rows(), seeds, protocol(steps, valid_every), ctx, rows, render_report,
                extra_seeds)
    elif suite == "arch":
        _arch(suite, arch_rows(), protocol(steps, valid_every), ctx, rows, render_report)
    elif suite == "tune":
        run_tune(tune_rows(), protocol(steps, valid_every), ctx, rows, render_report)
    elif suite == "decode":
        if not decode_rows(tune_rows(), results, steps):
            raise ConfigError(f"{results / 'tune'}: no family's tune grid has finished; the decode suite trains "
                              "the tune suite's choices again: run `aiayn reproduce --suite tune` first")
        run_decode(tune_rows(), protocol(steps, valid_every), ctx, rows, render_report)
    if suite in ("table1", "quick"):
        _table1(results, suite == "quick", device)
    return render_now()


def _table3(rows: list[Row], stab: list[Row], seeds: int, common: dict[str, Any], ctx: dict[str, Any],
            only: list[str] | None, render_report, extra_seeds: int = 12) -> None:
    """The stability check, then the reference seeds and the rows, then at most `extra_seeds`
    second seeds of rows near the line, then the paired tests."""
    wanted = not only or SECOND_SEEDS in only or any(r.name in only for r in stab + depth_rows(seeds, 1.0, rows))
    lr_scale = stability(stab, common, ctx) if wanted else None  # the depth rows (and their second seeds) need it
    if lr_scale is not None:
        rows = [r for r in rows if r.name not in DEPTH] + depth_rows(seeds, lr_scale, rows)
    run_rows("table3", rows, common, ctx, only, render_report)
    extra = second_seeds(rows, ctx["results"] / "table3")[:extra_seeds]
    if not only or SECOND_SEEDS in only:
        run_rows("table3", extra, common, ctx, None, render_report)
    elif extra:  # a --rows run that leaves them out: say what it did not run
        log.warning("the seed rule picks a second seed of %s; --rows runs them only when it names %s",
                    ", ".join(r.of for r in extra), SECOND_SEEDS)
    pair_with_references("table3", ctx["results"], ctx["data_dir"], seed_matched)
    render_report()


SECOND_SEEDS = "second-seeds"  # --rows name of the runs added from results (the seed rule's)


def second_seeds(rows: list[Row], results: Path) -> list[Row]:
    """Table 3's seed rule on the finished rows: a seed-2 run of every row run once whose NLL change
    lies between 1 and 2.5 half-widths of its family's reference interval (plan.second_seed_distance),
    rows nearest the line first; finished ones stay in, so that a resumed suite picks the same ones."""

    rs = {r["row"]: r for r in load_results(results.parent).get("table3", [])}
    out = []
    for row in rows:
        r, refs = rs.get(row.name), [x["valid_nll"] for x in rs.values()
                                     if x["group"] == "ref" and x.get("family", "main") == row.family]
        if row.group == "ref" or r is None or diverged(r):
            continue
        distance = second_seed_distance(r["valid_nll"], refs)
        if distance is not None:
            out.append((distance, repeat(row, 2)))
    return [row for _, row in sorted(out, key=lambda x: x[0])]


def arch_seeds(rows: list[Row], results: Path, seeds: int = 3) -> list[Row]:
    """Seeds 2..`seeds` of the Transformer and of the best finished model (lowest validation NLL) of
    each other family: recurrent and convolutional."""

    rs = {r["row"]: r for r in load_results(results.parent).get("arch", [])}
    best = [r for r in rows if r.group == "transformer"]
    for group in ("recurrent", "convolutional"):
        done = [r for r in rows if r.group == group and r.name in rs]
        best += [min(done, key=lambda r: rs[r.name]["valid_nll"])] if done else []
    return [repeat(r, s) for s in range(2, seeds + 1) for r in best]


def _arch(suite: str, rows: list[Row], common: dict[str, Any], ctx: dict[str, Any], only: list[str] | None,
          render_report, updates: int = 10, rounds: int = 3, seeds: int = 3) -> None:
    """The rows by updates, their clean throughput apart, and the paired tests against the Transformer."""

    run_rows(suite, rows, common, ctx, only, render_report)
    if suite == "arch" and (not only or ARCH_SEEDS in only):
        run_rows(suite, arch_seeds(rows, ctx["results"] / suite, seeds), common, ctx, None, render_report)
    if suite == "arch":
        path = ctx["results"] / suite / "throughput" / "throughput.json"
        if not path.exists():
            out = measure_throughput({r.name: row_config(r, common) for r in rows}, ctx["data_dir"], updates,
                                     rounds, ctx["device"])
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(out, indent=1).encode())
        pair_with_references(suite, ctx["results"], ctx["data_dir"], _same_seed_transformer)
    render_report()


def _same_seed_transformer(r: dict) -> str | None:
    """The architecture comparison pairs each run with the Transformer of the same seed."""
    if r["group"] == "transformer":
        return None
    return "transformer" if r["seed"] == 1 else f"transformer-s{r['seed']}"


def _quick(ctx: dict[str, Any], only: list[str] | None, render_report) -> None:
    """Every suite's machinery at toy sizes (8 updates a row): not the findings."""
    q = quick_rows()
    common = protocol(8)
    stab = stability_rows((1.0, 0.02), TINY, lr_scale=40.0)  # diverges at ×1 on purpose, trains at 0.8
    _table3(q["table3"], stab, QUICK_SEEDS, common, ctx, only, render_report, extra_seeds=1)
    _arch("arch", q["arch"], common, ctx, only, render_report, updates=2, rounds=1, seeds=QUICK_SEEDS)
    run_tune(q["tune"], common, ctx, only, render_report, QUICK_SEEDS)
    run_decode(q["tune"], common, ctx, only, render_report, QUICK_SEEDS)


def _table1(results: Path, quick: bool, device: str | None) -> None:

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


def check_rows(suite: str, rows: list[str] | None, seeds: int) -> None:
    q = quick_rows()
    known = {"budget": ["ref"], "table3": [r.name for r in table3_rows(seeds, 0.4) + stability_rows()],
             "arch": [r.name for r in arch_rows()], "tune": [r.name for r in tune_rows()],
             "decode": list(dict.fromkeys(r.group for r in tune_rows())),  # a family's runs
             "quick": [r.name for rs in q.values() for r in rs]}.get(suite, [])  # table1 has no rows
    known += ["ref"] if suite in ("table3", "quick") else []  # a group: every reference seed
    known += {"table3": [SECOND_SEEDS], "arch": [ARCH_SEEDS], "tune": [ARCH_SEEDS]}.get(suite, [])
    unknown = [r for r in rows or [] if r not in known]
    if unknown:
        raise ConfigError(f"unknown row(s) {', '.join(unknown)} in suite {suite}; "
                          f"rows: {', '.join(dict.fromkeys(known))}")
