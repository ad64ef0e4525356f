"""The report's one-paragraph summary: the seeds that would settle a row, checked against scipy's t
test on runs built to that count, and the rows it names, from results whose verdicts are known by hand."""

import re
import statistics

import pytest
from scipy import stats as scipy_stats

from aiayn.evidence.stats import seed_test, seeds_to_settle
from aiayn.evidence.summary import summary_section

REF = [2.00, 2.02, 1.98, 2.01, 1.99]  # mean 2.00, s = 0.01581


def _runs(delta: float, m: int) -> list[float]:
    """m runs whose mean is the reference's + delta and whose sample sd is the reference's."""
    if m == 1:
        return [statistics.mean(REF) + delta]
    z = [k - (m - 1) / 2 for k in range(m)]
    z = [v / statistics.stdev(z) for v in z]
    return [statistics.mean(REF) + delta + statistics.stdev(REF) * v for v in z]


@pytest.mark.parametrize("delta,alpha", [(0.03, 0.05), (0.02, 0.05), (-0.025, 0.01), (0.04, 0.05 / 9)])
def test_seeds_to_settle_is_the_fewest_runs_scipy_calls_significant(delta, alpha):
    m = seeds_to_settle(delta, REF, alpha=alpha)
    assert m is not None
    assert scipy_stats.ttest_ind(_runs(delta, m), REF).pvalue < alpha
    if m > 1:
        assert scipy_stats.ttest_ind(_runs(delta, m - 1), REF).pvalue >= alpha


def test_seeds_to_settle_a_no_change_claim_by_equivalence_and_gives_up_beyond_the_cap():
    m = seeds_to_settle(0.004, REF, margin=0.02)
    lo, hi = seed_test(_runs(0.004, m), REF).ci90
    assert -0.02 < lo and hi < 0.02
    if m > 1:
        lo, hi = seed_test(_runs(0.004, m - 1), REF).ci90
        assert not (-0.02 < lo and hi < 0.02)
    assert seeds_to_settle(0.0005, REF) is None  # a change this small: no 20 seeds show it


def _result(row: str, nll: float, paper_ppl: float | None = None, **extra) -> dict:
    r = {"row": row, "group": "ref" if row.startswith("ref") else row[0], "valid_nll": nll, "valid_ppl": 7.4,
         "bleu": {"valid": {"bleu": 30.0}}, "curve": [], "updates": 2750, "change": row, "params": 7.6e6, **extra}
    if paper_ppl:
        r["paper"] = {"label": row, "ppl": paper_ppl, "bleu": 25.8, "ref_ppl": 4.92, "ref_bleu": 25.8}
    return r


def test_the_summary_names_held_contradicted_and_open_rows_and_their_budget():
    refs = [_result(f"ref-s{i}", v, seed=i) for i, v in enumerate(REF, 1)]
    rows = [_result("A-held", 2.10, 6.11),  # paper worse (+0.22 nats), ours +0.10: held
            _result("B-against", 1.90, 6.11),  # paper worse, ours significantly better
            _result("C-open", 2.03, 6.11)]  # +0.03: inside the prediction interval
    arch = [_result("transformer", 1.6, paired_bs=None), _result("luong", 1.8, paired_bs={"delta": -2.5, "p": 0.001})]
    arch[0].pop("paired_bs")
    text = "\n".join(summary_section({"table3": refs + rows, "arch": arch}))
    assert "**1 of 3 held** (A-held)" in text and "**1 did not** (B-against (ours better, paper worse))" in text
    assert "**1 is inconclusive** (C-open)" in text
    more = int(re.search(r"C-open (\d+);", text).group(1))
    assert scipy_stats.ttest_ind(_runs(0.03, more + 1), REF).pvalue < 0.05 / 3  # Bonferroni over 3 rows
    assert scipy_stats.ttest_ind(_runs(0.03, more), REF).pvalue >= 0.05 / 3
    assert "luong (valid NLL 1.8000) +2.50 BLEU (p 0.001)" in text  # Transformer minus family
    assert "the tune suite has not run" in text
    tuned = "\n".join(summary_section({"table3": refs + rows, "arch": arch, "tune": [arch[1]]}))
    assert "the tune suite has not run" not in tuned and "luong (valid NLL 1.8000)" in tuned
