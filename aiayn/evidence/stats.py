"""The statistics behind the report's verdicts: seed intervals, Holm's correction, equivalence
margins and sacreBLEU's paired bootstrap.

A row is one new training run; the reference is n runs that differ only in their seed. The
question "is the row different from the reference?" is then the prediction question "would a
new reference run land where the row did?": under normal seed noise a new run x satisfies
(x − mean) / (s·√(1 + 1/n)) ~ t(n − 1). Every p-value and interval below follows from that.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..extras import need


@dataclass(frozen=True)
class SeedTest:
    """One run against the reference seeds: the difference, its p-value and intervals."""

    delta: float  # mean of the row's seeds − mean of the reference seeds
    p: float  # two-sided, t with n + m − 2 degrees of freedom
    pi95: float  # half-width of the 95 % interval of delta under no change (one run: prediction interval)
    ci90: tuple[float, float]  # 90 % interval of the difference (for equivalence, TOST at 5 %)
    n: int  # reference seeds
    m: int = 1  # the row's seeds

    @property
    def df(self) -> int:
        return self.n + self.m - 2

    @property
    def scale(self) -> float:
        """The standard error of delta (s_p·√(1/m + 1/n))."""
        return self.pi95 / t_quantile(0.975, self.df)


def p_text(p: float) -> str:
    """A p-value at three decimals, "< 0.001" below that (never "0.000")."""
    return "< 0.001" if p < 0.0005 else f"{p:.3f}"


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t with df degrees of freedom."""
    stats = need("scipy.stats", "evidence")  # here, not at the top: it costs every `aiayn` command 0.7 s

    return float(stats.t.ppf(q, df))


def prediction_halfwidth(values: Sequence[float], level: float = 0.95) -> float:
    """Half-width of the prediction interval for one new draw: t_{(1+level)/2, n−1} · s · √(1 + 1/n)."""
    n = len(values)
    if n < 2:
        raise ValueError("a prediction interval needs at least two reference runs")
    return t_quantile((1 + level) / 2, n - 1) * statistics.stdev(values) * math.sqrt(1 + 1 / n)


def seed_test(x: float | Sequence[float], reference: Sequence[float]) -> SeedTest | None:
    """Test a row's run(s) x against the reference seeds; None with fewer than two seeds. One run:
    the prediction test of the module docstring. m ≥ 2 runs (seeds of the same row): the pooled
    two-sample t test, mean(x) − mean(ref) over s_p·√(1/m + 1/n) with n + m − 2 degrees of freedom,
    which is the one-run test when m = 1."""
    xs = [float(x)] if isinstance(x, (int, float)) else [float(v) for v in x]
    n, m = len(reference), len(xs)
    if n < 2 or m < 1:
        return None
    df = n + m - 2
    ss = (n - 1) * statistics.variance(reference) + ((m - 1) * statistics.variance(xs) if m > 1 else 0.0)
    scale = math.sqrt(ss / df) * math.sqrt(1 / m + 1 / n)
    delta = statistics.mean(xs) - statistics.mean(reference)
    if scale == 0:
        p = 1.0 if delta == 0 else 0.0
    else:
        stats = need("scipy.stats", "evidence")

        p = float(2 * stats.t.sf(abs(delta) / scale, df))
    h90 = t_quantile(0.95, df) * scale
    return SeedTest(delta, p, t_quantile(0.975, df) * scale, (delta - h90, delta + h90), n, m)


def seeds_to_settle(delta: float, reference: Sequence[float], margin: float | None = None, alpha: float = 0.05,
                    cap: int = 20, power: float = 0.5) -> int | None:
    """Fewest seeds of a row that would settle it were its true effect `delta` and its seeds spread as
    the reference's, with probability `power` (0.5: the expected outcome): seed_test's p below alpha,
    or, by equivalence (`margin`, |delta| < margin), the 1 − 2·alpha interval inside ±margin. None
    beyond `cap` seeds."""
    n, s = len(reference), statistics.stdev(reference)
    for m in range(1, cap + 1):
        df, scale = n + m - 2, s * math.sqrt(1 / m + 1 / n)
        extra = t_quantile(power, df) * scale
        if margin is not None and abs(delta) < margin:
            if abs(delta) + t_quantile(1 - alpha, df) * scale + extra < margin:
                return m
        elif abs(delta) > t_quantile(1 - alpha / 2, df) * scale + extra:
            return m
    return None


def min_detectable(test: SeedTest, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest |delta| the test's seeds find significant (two-sided, `alpha`) with `power`."""
    return (t_quantile(1 - alpha / 2, test.df) + t_quantile(power, test.df)) * test.scale


def margin_ps(test: SeedTest, margin: float) -> tuple[float, float]:
    """(p of equivalence within ±margin: TOST, the larger one-sided p; p of a difference beyond the
    margin: the minimum-effect test, two-sided, so below 0.05 when the 95 % interval excludes ±margin)."""
    stats = need("scipy.stats", "evidence")

    d, s = test.delta, test.scale
    if s == 0:
        return (0.0 if abs(d) < margin else 1.0), (0.0 if abs(d) > margin else 1.0)
    equiv = max(float(stats.t.sf((d + margin) / s, test.df)), float(stats.t.cdf((d - margin) / s, test.df)))
    outside = min(1.0, 2 * float(stats.t.sf((abs(d) - margin) / s, test.df)))
    return equiv, outside


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over the rows of one table)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], refs: Sequence[str],
                     samples: int = 1000) -> dict[str, float]:
    """sacreBLEU's paired bootstrap (`--paired-bs`, Koehn 2004): the system's BLEU minus the
    baseline's, with the p-value of "no difference" over `samples` resamples of the sentences."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if not (len(baseline) == len(system) == len(refs)):
        raise ValueError(f"paired bootstrap needs aligned sentences: {len(baseline)}, {len(system)}, {len(refs)}")
    seed = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = "12345"  # sacreBLEU's default: the same resamples as its command line
    quiet = logging.getLogger("sacrebleu")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # it logs each stage at INFO
    try:
        test = PairedTest([("baseline", list(baseline)), ("system", list(system))], {"BLEU": BLEU()},
                          [list(refs)], test_type="bs", n_samples=samples)
        _, scores = test()
    finally:
        quiet.setLevel(level)
        if seed is None:
            os.environ.pop("SACREBLEU_SEED", None)
        else:
            os.environ["SACREBLEU_SEED"] = seed
    base, sys_ = scores["BLEU"]
    return {"delta": round(sys_.score - base.score, 4), "p": float(sys_.p_value), "samples": samples}


@dataclass(frozen=True)
class Verdict:
    """How one row's change compares with what the paper claims, for one metric."""

    word: str  # agrees / contradicts / inconclusive, and why
    reproduced: bool | None  # True agrees, False contradicts, None inconclusive


@dataclass(frozen=True)
class Tests:
    """One row's Holm-adjusted p-values for one metric: a difference (two-sided), equivalence within
    the margin (TOST) and a difference beyond it (minimum effect)."""

    diff: float
    equiv: float
    outside: float


def judge(claim: str, delta: float, p: Tests, higher_is_better: bool, alpha: float = 0.05) -> Verdict:
    """The verdict rule, symmetric: each claim can be agreed with, contradicted, or left open.

    A change claim ("better"/"worse") agrees when ours differs significantly in its direction, and is
    contradicted when ours differs significantly the other way or is equivalent within the margin
    (the claimed change is not there). A no-change claim agrees when ours is equivalent within the
    margin, and is contradicted when ours differs by more than the margin (not merely from zero)."""
    good = 1 if higher_is_better else -1
    ours = ("better" if delta * good > 0 else "worse") if p.diff < alpha else None
    if claim == "no change":
        if p.equiv < alpha:
            return Verdict("agrees: equivalent within the margin", True)
        if p.outside < alpha:
            return Verdict(f"contradicts: {'better' if delta * good > 0 else 'worse'} beyond the margin", False)
        return Verdict("inconclusive (claim: no change)", None)
    if ours == claim:
        return Verdict(f"agrees: {ours}, significant", True)
    if ours is not None:
        return Verdict(f"contradicts: {ours}, significant (claim: {claim})", False)
    if p.equiv < alpha:
        return Verdict(f"contradicts: equivalent within the margin (claim: {claim})", False)
    return Verdict(f"inconclusive (claim: {claim})", None)
