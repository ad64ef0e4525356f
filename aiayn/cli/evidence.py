"""`aiayn reproduce`: the paper's experiments at small scale and their report."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

from ..files import check_output_folder
from .common import (
    UserError,
)

log = logging.getLogger("aiayn")


def cmd_reproduce(args: argparse.Namespace, extra: list[str]) -> None:
    """Run a suite of the paper's experiments at small scale and render the report."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    from ..evidence.report import is_report, render
    from ..evidence.suites import reproduce

    work = Path(args.work)
    report = Path(args.report) if args.report else (work / "quick-report" if args.suite == "quick"
                                                    else Path("docs/reproduction"))
    command = "aiayn " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("aiayn") else ""
    for name in ("steps", "warmup", "seeds"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not (args.minutes > 0 and math.isfinite(args.minutes)):
        raise UserError(f"--minutes must be a positive number, got {args.minutes}")
    check_output_folder(report, is_report, "--report")
    if args.render_only:
        from ..evidence.suites import planned

        out = render(report, command, planned(report))
    else:
        rows = [r for r in args.rows.split(",") if r] if args.rows else None
        out = reproduce(args.suite, Path(args.data) if args.data else None, work, report, rows, args.steps,
                        args.warmup, args.minutes, args.seeds, args.device, command)
    print(f"wrote {out}")


def add_reproduce(sub) -> None:
    """`aiayn reproduce` and its flags."""
    p = sub.add_parser("reproduce", help="the paper's experiments at small scale (Table 3, recurrent baselines, "
                       "Table 1; confirm: Table 3's winners at the main job's budget) and a generated report")
    p.add_argument("--suite", required=True, choices=["table3", "rnn", "confirm", "table1", "quick"])
    p.add_argument("--data", help="prepared data folder (from `aiayn prepare`); table3, rnn, confirm and quick "
                   "train on it")
    p.add_argument("--work", default="runs/reproduce", help="folder for the run directories (default runs/reproduce)")
    p.add_argument("--report", help="folder for REPORT.md, its plots and results/ (default docs/reproduction; "
                   "quick: WORK/quick-report)")
    p.add_argument("--rows", help="comma-separated row names to run (default: all of the suite)")
    p.add_argument("--steps", type=int, default=1000, help="table3: updates per row (default 1000)")
    p.add_argument("--warmup", type=int, default=400, help="table3: warm-up steps, Eq. 3 (default 400)")
    p.add_argument("--minutes", type=float, default=20.0, help="rnn: training minutes per model (default 20)")
    p.add_argument("--seeds", type=int, default=3, help="table3: seeds of the reference row (default 3)")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--render-only", action="store_true", help="only re-render the report from results/")
    p.set_defaults(func=cmd_reproduce)
