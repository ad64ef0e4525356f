"""The paper's evidence re-run: Table 3 with seed intervals and tests, the families it replaced, Table 1.

Read first: suites.py (`aiayn reproduce`: the runs of a suite), then verdicts.py (each claim judged)
and report.py (REPORT.md rendered from the result files).
"""

from ..doors import lazy

__all__ = ["BUDGET_UPDATES", "SUITES", "render", "reproduce"]
__getattr__, __dir__ = lazy(__name__, {
    "reproduce": "suites",
    "render": "report",
    "SUITES": "plan",
    "BUDGET_UPDATES": "plan",
})
