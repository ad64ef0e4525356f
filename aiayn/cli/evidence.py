"""`aiayn reproduce`: the paper's experiments at small scale and their report."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..files import check_output_folder
from .common import (
    UserError,
)

log = logging.getLogger("aiayn")


MAX_SEEDS = 100  # runs per row, each ~40 CPU-minutes at the suite's budget: 10^30 once hung building the plan


def cmd_reproduce(args: argparse.Namespace, extra: list[str]) -> None:
    """Run a suite of the paper's experiments at small scale and render the report."""
    from ..evidence.report import is_report, is_results, render
    from ..evidence.suites import reproduce

    work = Path(args.work)
    report = Path(args.report) if args.report else (work / "quick-report" if args.suite == "quick"
                                                    else Path("docs/reproduction"))
    results = (Path(args.results) if args.results else
               Path("results/reproduction") if not args.report and args.suite != "quick" else report / "results")
    command = "aiayn " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("aiayn") else ""
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
    if args.valid_every is not None and args.valid_every < 1:
        raise UserError(f"--valid-every must be >= 1, got {args.valid_every}")
    if not 0 <= args.extra_seeds <= MAX_SEEDS:
        raise UserError(f"--extra-seeds must be >= 0, got {args.extra_seeds}" if args.extra_seeds < 0 else
                        f"--extra-seeds must be at most {MAX_SEEDS}, got {args.extra_seeds}")
    if not 2 <= args.seeds <= MAX_SEEDS:
        raise UserError(f"--seeds must be >= 2 (an interval needs two reference runs), got {args.seeds}"
                        if args.seeds < 2 else f"--seeds must be at most {MAX_SEEDS}, got {args.seeds}")
    check_output_folder(report, is_report, "--report")
    check_output_folder(results, is_results, "--results")
    locations = "".join(f" --{k} {v}" for k, v in (("report", args.report), ("results", args.results)) if v)
    rows = [r for r in args.rows.split(",") if r] if args.rows else None
    if args.render_only:
        from ..evidence.suites import check_rows, planned

        if rows and args.suite != "table3":
            raise UserError("--rows with --render-only names the rows of a table3 run; give --suite table3")
        check_rows(args.suite, rows, args.seeds)
        out = render(report, command, planned(report, args.seeds, rows=rows, results_dir=results), args.seeds, rows,
                     results_dir=results, locations=locations)
    else:
        out = reproduce(args.suite, Path(args.data) if args.data else None, work, report, rows, args.steps,
                        args.seeds, args.device, command, args.allow_mixed_commits, args.extra_seeds,
                        args.valid_every, results, locations)
    print(f"wrote {out}")


def add_reproduce(sub) -> None:
    """`aiayn reproduce` and its flags."""
    from ..evidence.plan import BUDGET_UPDATES, SUITES

    p = sub.add_parser("reproduce", help="the paper's experiments at small scale (Table 3, the recurrent and "
                       "convolutional families, Table 1) by updates, and a generated report")
    p.add_argument("--suite", required=True, choices=list(SUITES),
                   help="budget: the reference trained long, to choose the update budget; table3: Table 3's rows "
                   "after a stability check of N=6; arch: the architecture families; tune: every family's rate and "
                   "clipping chosen on validation, then 3 seeds at each choice; decode: the tune suite's compared runs "
                   "again, each at the beam and alpha chosen on its validation set; table1: layer costs; "
                   "quick: all at toy sizes")
    p.add_argument("--data", help="prepared data folder (from `aiayn prepare`); every suite but table1 trains on it")
    p.add_argument("--work", default="runs/reproduce", help="folder for the run directories (default runs/reproduce)")
    p.add_argument("--report", help="folder for REPORT.md and its plots (default docs/reproduction; "
                   "quick: WORK/quick-report)")
    p.add_argument("--results", help="folder of the result files, one per run, the hypotheses beside them "
                   "(default results/reproduction; with --report or --suite quick: REPORT/results)")
    p.add_argument("--rows", help="comma-separated row names to run (default: all of the suite); table3's "
                   "`second-seeds` and arch's `seeds` name the runs added from the results; with --render-only, "
                   "the rows a table3 run was given (its report counts and names those)")
    p.add_argument("--steps", type=int, help=f"updates per row (default {BUDGET_UPDATES}: the budget chosen by the "
                   f"budget suite; budget: {2 * BUDGET_UPDATES})")
    p.add_argument("--valid-every", type=int, help="table3, arch, tune: validate every this many updates "
                   "(default: a tenth of --steps; e.g. 250 for a long rerun's curve)")
    p.add_argument("--seeds", type=int, default=5,
                   help="table3: seeds of each reference (default 5); with --render-only, the seeds the run used")
    p.add_argument("--extra-seeds", type=int, default=12,
                   help="table3: at most this many seed-2 runs of rows whose NLL change lies between 1 and 2.5 "
                   "interval half-widths (default 12: the rule picked 10 in the rerun); arch always adds seeds 2 "
                   "and 3 of the Transformer and of each family's best")
    p.add_argument("--allow-mixed-commits", action="store_true",
                   help="train a row although the suite's results come from another commit")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--render-only", action="store_true", help="only re-render the report from its result files")
    p.set_defaults(func=cmd_reproduce)
