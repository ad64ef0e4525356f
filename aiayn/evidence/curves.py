"""Table 3's NLL verdicts along the validation curve: every judged row tested again at each
validation point its runs share with its reference's seeds (the weights as they were, unaveraged),
with the same claims, tests and Holm correction as the final verdicts (verdicts.py), so that a
verdict that holds only at the budget's last updates shows as such."""

from __future__ import annotations

import math
import statistics

from .claims import claim_of, judged
from .plan import diverged
from .stats import seed_test
from .verdicts import RowVerdict, analyse_all, families, judge_all, with_repeats

MARK = {True: "agrees", False: "contradicts", None: "·"}  # a cell's word: the verdict, or open


def curve_nll(r: dict) -> dict[int, float]:
    """A run's validation NLL per token by update, from its recorded curve of (update, PPL, ...)."""
    return {int(c[0]): math.log(c[1]) for c in r.get("curve") or [] if c[1] and c[1] > 0}


def shared_points(rs: list[dict]) -> list[int]:
    """The validation updates every run of the table has a point at."""
    sets = [set(curve_nll(r)) for r in rs if r.get("family", "main") in ("main", "depth")]
    return sorted(set.intersection(*sets)) if sets else []


def verdicts_at(rs: list[dict], step: int) -> dict[str, RowVerdict]:
    """Each row's NLL verdict at one validation update (main and depth families, one Holm family)."""
    fam = families(rs)
    out: list[RowVerdict] = []
    for f in ("main", "depth"):
        refs, rows = fam[f]
        ref = [curve_nll(r)[step] for r in refs]
        for runs in with_repeats(rows):
            out.append(RowVerdict(runs[0], seed_test([curve_nll(x)[step] for x in runs], ref), None,
                                  claim_of(runs[0]["row"]), failed=next((d for d in map(diverged, runs) if d), None),
                                  runs=runs))
    judge_all(out)
    return {v.r["row"]: v for v in out}


def curve_section(rs: list[dict]) -> list[str]:
    """A row per judged claim: its verdict at every shared validation point, then the final one (the
    averaged weights); rows whose verdict moves over the last three points or differs at the end
    are named, as the ones a longer run should settle."""
    points = shared_points(rs)
    rows = [v for vs in analyse_all(rs).values() for v in vs if v.v_nll is not None]
    if len(points) < 2 or not rows:
        return []
    at = {s: verdicts_at(rs, s) for s in points}
    cells = {v.r["row"]: [at[s][v.r["row"]].v_nll for s in points] for v in rows}
    out = ["### Verdicts along the validation curve", "",
           "Each judged row's NLL verdict at every validation point (the weights at that update, not averaged), "
           "against its reference's seeds at the same update, Holm-corrected over the rows at each point; the last "
           "column is the verdict above (the last 5 checkpoints averaged). · is inconclusive.", "",
           "| row | claim | " + " | ".join(f"{s:,}" for s in points) + " | final |",
           "|---|---|" + "--:|" * len(points) + "--:|"]
    flips, unsupported = [], []
    for v in rows:
        marks = [MARK[c.reproduced] if c else "–" for c in cells[v.r["row"]]]
        final_mark = MARK[v.v_nll.reproduced]
        out.append(f"| {v.r['row']} | {judged(v.claim, 'nll')} | " + " | ".join(marks) + f" | {final_mark} |")
        if {"agrees", "contradicts"} <= {*marks, final_mark}:
            flips.append(v.r["row"])
        if final_mark not in marks[-3:]:
            unsupported.append(v.r["row"])
    refs = families(rs)["main"][0]
    sd = [statistics.stdev([curve_nll(r)[s] for r in refs]) for s in points] if len(refs) > 1 else []
    out += [f"| reference sd (main, {len(refs)} seeds) | | " + " | ".join(f"{x:.3f}" for x in sd) + " | "
            f"{statistics.stdev([r['valid_nll'] for r in refs]):.3f} |"] if sd else []
    out += ["", "Verdicts that change sign along the curve (agree at one point, contradict at another): "
            + (", ".join(flips) or "none") + ". Final verdicts that none of the last three points shows: "
            + (", ".join(unsupported) or "none") + ". A single checkpoint's NLL varies more between seeds than "
            "the average of five (the reference's sd above), so a cell alone is weaker evidence than the final "
            "column; a verdict that holds only after averaging, or that changed sign late, is one for the "
            "longer runs to settle.", ""]
    return out
