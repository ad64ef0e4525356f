"""The families' fair comparison (§6.1, Table 2's at small scale): the tune suite's grid of peak
rates × clipping for every family, extended past a choice at its highest rate, seeds at each choice
and runs at the Transformer's training FLOPs; and the decode suite, which trains those compared runs
again and decodes each at the beam and α chosen on its own validation set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .families import FLOPS, chosen, grid_edges, grid_run
from .plan import TUNE_EXTEND, Row, equal_flops, extended, repeat
from .report import load_results
from .rows import pair_with_references, run_rows

ARCH_SEEDS = "seeds"  # --rows name of the runs added from the results (arch's and tune's seeds)


def run_tune(rows: list[Row], common: dict[str, Any], ctx: dict[str, Any], only: list[str] | None, render_report,
             seeds: int = 3) -> None:
    """The grid (one seed a setting), extended past a choice at its highest rate (extend_grid); once a
    family's grid is done, seeds 2..`seeds` at its choice (the lowest validation NLL); then, for a
    family that spends fewer training FLOPs per update than the Transformer's choice, its choice's
    seeds again to the Transformer's FLOPs at the budget."""

    run_rows("tune", rows, common, ctx, only, render_report)
    if only and ARCH_SEEDS not in only:
        return render_report()
    rows = extend_grid(rows, common, ctx, render_report)
    seeded, longer = choice_runs(tune_choices(rows, ctx["results"]), ctx["results"], common["train.max_steps"], seeds)
    run_rows("tune", seeded, common, ctx, None, render_report)
    run_rows("tune", longer, common, ctx, None, render_report)
    render_report()


def choice_runs(picks: dict[str, Row], results: Path, budget: int, seeds: int) -> tuple[list[Row], list[Row]]:
    """Seeds 2..`seeds` at each family's choice; and each choice that spends fewer training FLOPs than the
    Transformer's trained to its FLOPs at `budget` updates, with those seeds too."""
    seeded = [repeat(r, s) for r in picks.values() for s in range(2, seeds + 1)]
    longer = [equal_flops(r, n) for r, n in flops_parity(picks, results, budget)]
    return seeded, [x for r in longer for x in [r] + [repeat(r, s) for s in range(2, seeds + 1)]]


def decode_rows(grid: list[Row], results: Path, budget: int, seeds: int = 3) -> list[Row]:
    """The runs the tune suite compares, from its finished results: each family's choice, its seeds and
    its runs at the Transformer's FLOPs (the decode suite trains them again)."""
    picks = tune_choices(_grid_so_far(grid, results), results)
    seeded, longer = choice_runs(picks, results, budget, seeds)
    return [r for pick in picks.values() for r in [pick] + [x for x in seeded if x.of == pick.name]] + longer


def run_decode(grid: list[Row], common: dict[str, Any], ctx: dict[str, Any], only: list[str] | None,
               render_report, seeds: int = 3) -> None:
    """The tune suite's compared runs trained again from their configs and seeds, each decoded at the beam
    and α chosen on its own validation set (§6.1, as `aiayn tune` chooses the main job's), so that no
    family's BLEU is set by a length penalty tuned for another; the paired tests against the Transformer."""
    rows = decode_rows(grid, ctx["results"], common["train.max_steps"], seeds)
    run_rows("decode", rows, common, {**ctx, "tune_decode": True}, only, render_report)
    base = next((r.name for r in rows if r.group == "transformer" and not r.of), None)
    pair_with_references("decode", ctx["results"], ctx["data_dir"],
                         lambda r: None if r["group"] == "transformer" or base is None else
                         base if r["seed"] == 1 else f"{base}-s{r['seed']}")
    render_report()


def extend_grid(rows: list[Row], common: dict[str, Any], ctx: dict[str, Any], render_report) -> list[Row]:
    """While a family's choice lies at the highest peak rate of its grid (of two rates or more), one
    more row at twice that rate and the choice's clipping, TUNE_EXTEND times at most; the grid so
    extended (a resumed suite extends it the same way: each step reads only finished results)."""
    for _ in range(TUNE_EXTEND):
        more = _extensions(rows, ctx["results"])
        if not more:
            break
        rows = rows + more
        run_rows("tune", more, common, ctx, None, render_report)
    return rows


def _grid_so_far(grid: list[Row], results: Path) -> list[Row]:
    """The grid with the extensions its finished results call for (extend_grid's rule, nothing run)."""
    rows = grid
    for _ in range(TUNE_EXTEND):
        more = _extensions(rows, results)
        if not more:
            break
        rows = rows + more
    return rows


def _extensions(rows: list[Row], results: Path) -> list[Row]:
    """The rows that extend a grid next: twice the rate of each family's choice that lies at its grid's
    highest rate, read from finished results only (the suite and its planned count agree)."""
    edges = grid_edges(_tune_results(rows, results))
    return [extended(r, 2 * r.overrides["train.peak_lr"]) for f, r in tune_choices(rows, results).items()
            if edges.get(f) == "highest"]


def _tune_results(rows: list[Row], results: Path) -> list[dict]:
    """The tune suite's finished results of `rows` (a grid as far as it is planned: others are not its)."""
    names = {r.name for r in rows}
    return [r for r in load_results(results).get("tune", []) if r["row"] in names]


def tune_choices(rows: list[Row], results: Path) -> dict[str, Row]:
    """Each family's choice among its finished grid (lowest validation NLL), for families whose whole
    grid has run: a resumed suite picks the same."""
    rs = _tune_results(rows, results)
    done, names, out = chosen(rs), {r["row"] for r in rs}, {}
    for group in dict.fromkeys(r.group for r in rows):
        grid = [r for r in rows if r.group == group]
        if group in done and all(r.name in names for r in grid):
            out[group] = next(r for r in grid if r.name == done[group]["row"])
    return out


def flops_parity(picks: dict[str, Row], results: Path, budget: int) -> list[tuple[Row, int]]:
    """The choices that spend fewer training FLOPs per target token than the Transformer's, with the
    updates at which they have spent what it spent in `budget` updates (the same batches); a choice whose
    result has no FLOPs recorded is none of them."""
    fpt = {r["row"]: r["flops_per_token"] for r in load_results(results).get("tune", []) if "flops_per_token" in r}
    if "transformer" not in picks or picks["transformer"].name not in fpt:
        return []
    f_t = fpt[picks["transformer"].name]
    return [(r, round(budget * f_t / fpt[r.name])) for g, r in picks.items()
            if g != "transformer" and r.name in fpt and fpt[r.name] < f_t]


def tune_planned(grid: list[Row], results_dir: Path, results: dict[str, list[dict]], seeds: int) -> int:
    """The tune suite's runs as run_tune makes them, counted from its finished results: the grid with the
    extensions run and the one each family's choice at its highest rate calls for next (extend_grid's
    rule), `seeds` - 1 more seeds a family, and `seeds` runs at equal FLOPs for each family known to
    spend fewer FLOPs than the Transformer's choice (flops_parity; run or not yet)."""
    rows = _grid_so_far(grid, results_dir)
    beyond = {r["row"] for r in results.get("tune", []) if grid_run(r)} - {r.name for r in rows}  # older rules'
    longer = {r.get("of") or r["row"] for r in results.get("tune", []) if r.get("family") == FLOPS}
    longer |= {equal_flops(r, n).name for r, n in flops_parity(tune_choices(rows, results_dir), results_dir, 1)}
    return len(rows) + len(beyond) + len({r.group for r in grid}) * (seeds - 1) + len(longer) * seeds
