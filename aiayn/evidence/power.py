"""What each Table 3 row could show: the smallest NLL change its seeds detect at 80 % power, and the
seeds that would settle it; and each row's claim with its source (claims.py), as report tables."""

from __future__ import annotations

from .claims import SAME, judged
from .plan import NLL_MARGIN
from .stats import min_detectable, seeds_to_settle

POWER = 0.8


def judged_count(verdicts: list) -> int:
    """The size of each Holm family of NLL tests (verdicts.judge_all): every judged row, whose agreeing
    arms form one family and whose contradicting arms another."""
    return sum(1 for v in verdicts if v.p_nll is not None)


def _settle_cell(v, ref_nll: list[float], alpha: float) -> str:
    d = v.nll.delta
    by_diff = seeds_to_settle(d, ref_nll, None, alpha, power=POWER)
    cells = [f"{by_diff} by difference" if by_diff else "more than 20 by difference"]
    if abs(d) < NLL_MARGIN:
        by_eq = seeds_to_settle(d, ref_nll, NLL_MARGIN, alpha, power=POWER)
        cells.append(f"{by_eq} by equivalence" if by_eq else "more than 20 by equivalence")
    elif judged(v.claim, "nll") == SAME:  # the no-change claim's agreeing arm
        cells.append(f"none would let it agree at the change it showed (\\|ΔNLL\\| {abs(d):.4f} beyond the margin "
                     f"{NLL_MARGIN})")
    return "; ".join(cells)


def power_table(verdicts: list, refs: dict[str, list[float]]) -> list[str]:
    """Per row (`refs`: each family's reference NLL by family name): its seeds, the smallest |ΔNLL| they
    find at 80 % power (α 0.05, and α/k at Holm's first step over the k judged rows), and the seeds
    that would settle the row with that power at α/k were its change the one it showed."""
    k = max(judged_count(verdicts), 1)
    out = [f"| row | NLL claim | seeds | ΔNLL | smallest \\|ΔNLL\\| found, 80 % power: α 0.05 / α/{k} | "
           f"seeds to settle, 80 % power at α/{k} (were its change the one shown) |", "|---|---|--:|--:|--:|---|"]
    for v in verdicts:
        if v.failed or v.nll is None:
            continue
        claim = judged(v.claim, "nll") or "none (not judged)"
        out.append(f"| {v.r['row']} | {claim} | {v.nll.m} | {v.nll.delta:+.4f} | "
                   f"{min_detectable(v.nll, 0.05, POWER):.3f} / {min_detectable(v.nll, 0.05 / k, POWER):.3f} | "
                   f"{_settle_cell(v, refs[v.r.get('family', 'main')], 0.05 / k)} |")
    return out


def bleu_power_table(verdicts: list) -> list[str]:
    """Per row, BLEU's test (secondary): its seeds, ΔBLEU, and the smallest |ΔBLEU| its seeds find at 80 %
    power at α 0.05 and at α/k (Holm's first step over the k rows judged on BLEU); the paired bootstrap,
    which a BLEU difference must also pass, is not in these figures."""
    k = max(sum(1 for v in verdicts if v.p_bleu is not None), 1)
    out = [f"| row | BLEU claim | seeds | ΔBLEU | smallest \\|ΔBLEU\\| found, 80 % power: α 0.05 / α/{k} |",
           "|---|---|--:|--:|--:|"]
    for v in verdicts:
        if v.failed or v.bleu is None:
            continue
        claim = judged(v.claim, "bleu") or "none (not judged)"
        out.append(f"| {v.r['row']} | {claim} | {v.bleu.m} | {v.bleu.delta:+.2f} | "
                   f"{min_detectable(v.bleu, 0.05, POWER):.2f} / {min_detectable(v.bleu, 0.05 / k, POWER):.2f} |")
    return out


def claims_table(verdicts: list) -> list[str]:
    """Each row's claim (NLL / BLEU) and the sentence it rests on."""
    out = ["| row | claim: NLL / BLEU | source |", "|---|---|---|"]
    for v in verdicts:
        c = v.claim
        if c is None:
            continue
        what = "ours, not counted" if c.kind == "extension" else (
            "an observation, not counted" if c.kind == "observation" else f"{c.nll or 'none'} / {c.bleu or 'none'}")
        out.append(f"| {v.r['row']} | {what} | {c.source} |")
    return out
