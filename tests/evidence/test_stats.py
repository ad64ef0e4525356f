"""evidence/stats.py against hand-computed intervals and against sacreBLEU's own command line."""

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.evidence.stats import holm, judge, p_text, paired_bootstrap, prediction_halfwidth, seed_test


def test_prediction_interval_by_hand():
    # 1..5: mean 3, s = √2.5; t(0.975, 4) = 2.776 from the printed table
    assert prediction_halfwidth([1, 2, 3, 4, 5]) == pytest.approx(2.776 * math.sqrt(2.5) * math.sqrt(1.2), rel=1e-3)
    # the case: 3 seeds, t(0.975, 2) = 4.303; BLEU 33.91/33.88/34.16 (s = 0.1537)
    s = math.sqrt(((33.91 - 33.9833) ** 2 + (33.88 - 33.9833) ** 2 + (34.16 - 33.9833) ** 2) / 2)
    assert prediction_halfwidth([33.91, 33.88, 34.16]) == pytest.approx(4.303 * s * math.sqrt(4 / 3), rel=1e-3)
    with pytest.raises(ValueError):
        prediction_halfwidth([1.0])


def test_seed_test_p_value_is_the_prediction_interval_read_backwards():
    ref = [10.0, 11.0, 12.0, 10.5, 11.5]
    h = prediction_halfwidth(ref)
    edge = seed_test(11.0 + h, ref)  # exactly on the 95 % prediction bound: p = 0.05
    assert edge.p == pytest.approx(0.05, abs=1e-9) and edge.delta == pytest.approx(h)
    assert seed_test(11.0, ref).p == pytest.approx(1.0)
    # 90 % interval: t(0.95, 4) = 2.132
    lo, hi = seed_test(11.2, ref).ci90
    half = 2.132 * math.sqrt(0.625) * math.sqrt(1.2)
    assert (lo, hi) == (pytest.approx(0.2 - half, abs=2e-3), pytest.approx(0.2 + half, abs=2e-3))
    assert seed_test(1.0, [2.0]) is None


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.03, 0.04 with m = 4: 0.04, 0.06, 0.06 (monotone), 0.06
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    """TOST at 5 % (margin_ps) against the 90 % interval seed_test gives: inside ±margin exactly when p < 0.05."""
    from aiayn.evidence.stats import margin_ps

    ref = [2.00, 2.02, 1.98, 2.01, 1.99]
    for xs in ([2.001] * 3, [2.004, 2.006, 2.005, 2.003] * 3, [2.012], [2.0] * 12, [2.03, 2.02]):
        t = seed_test(xs, ref)
        inside = -0.02 < t.ci90[0] and t.ci90[1] < 0.02
        assert (margin_ps(t, 0.02)[0] < 0.05) == inside, xs


@pytest.mark.parametrize("claim,delta,tests,higher,expected,ok", [
    ("worse", -1.2, (0.01, 1.0, 1.0), True, "agrees: worse, significant", True),
    ("worse", +1.2, (0.01, 1.0, 1.0), True, "contradicts: better, significant (claim: worse)", False),
    ("worse", -1.2, (0.20, 1.0, 1.0), True, "inconclusive (claim: worse)", None),
    ("worse", +0.05, (0.80, 0.01, 1.0), True, "contradicts: equivalent within the margin (claim: worse)", False),
    ("no change", 0.05, (0.80, 0.01, 1.0), True, "agrees: equivalent within the margin", True),
    ("no change", 0.05, (0.80, 0.30, 1.0), True, "inconclusive (claim: no change)", None),
    ("no change", -0.3, (0.001, 0.30, 0.40), True, "inconclusive (claim: no change)", None),  # ≠ 0, not beyond
    ("no change", -2.0, (0.001, 1.0, 0.01), True, "contradicts: worse beyond the margin", False),
    ("worse", 0.30, (0.001, 1.0, 1.0), False, "agrees: worse, significant", True),  # NLL: up is worse
])
def test_verdicts_are_symmetric_in_what_the_paper_claims(claim, delta, tests, higher, expected, ok):
    from aiayn.evidence.stats import Tests

    v = judge(claim, delta, Tests(*tests), higher)
    assert (v.word, v.reproduced) == (expected, ok)


def test_an_equivalent_row_contradicts_a_change_claim_and_agrees_with_no_change():
    """The rule is symmetric in practice. One synthetic row, ten seeds equivalent within the
    margin against five reference seeds: it must contradict "worse" and agree with "no change"; a row
    clearly outside the margin must contradict "no change" (by the minimum-effect test, not ≠ 0)."""
    from aiayn.evidence.stats import Tests, margin_ps

    ref = [2.000, 2.004, 1.996, 2.002, 1.998]
    row = seed_test([2.001 + 0.002 * ((-1) ** k) for k in range(10)], ref)
    equiv, outside = margin_ps(row, 0.02)
    assert equiv < 0.05 and outside > 0.05 and -0.02 < row.ci90[0] and row.ci90[1] < 0.02
    assert judge("worse", row.delta, Tests(row.p, equiv, outside), False).reproduced is False
    assert judge("no change", row.delta, Tests(row.p, equiv, outside), False).reproduced is True
    far = seed_test([2.05 + 0.002 * ((-1) ** k) for k in range(4)], ref)
    equiv, outside = margin_ps(far, 0.02)
    assert outside < 0.05 and judge("no change", far.delta, Tests(far.p, equiv, outside), False).reproduced is False
    near = seed_test(2.015, ref)  # significantly ≠ 0 perhaps, but not shown beyond the margin
    assert margin_ps(near, 0.02)[1] > 0.05


def test_margin_tests_agree_with_scipys_one_sided_t_tests():
    from scipy import stats as scipy_stats

    from aiayn.evidence.stats import margin_ps

    ref, xs = [2.00, 2.02, 1.98, 2.01, 1.99], [2.03, 2.05]
    t = seed_test(xs, ref)
    equiv, outside = margin_ps(t, 0.02)
    shifted_up = scipy_stats.ttest_ind([x - 0.02 for x in xs], ref, alternative="less").pvalue  # H0: Δ ≥ +margin
    shifted_down = scipy_stats.ttest_ind([x + 0.02 for x in xs], ref, alternative="greater").pvalue  # H0: Δ ≤ −m
    assert equiv == pytest.approx(max(shifted_up, shifted_down))
    beyond = scipy_stats.ttest_ind([x - 0.02 for x in xs], ref, alternative="greater").pvalue
    assert outside == pytest.approx(min(1.0, 2 * beyond))


def test_paired_bootstrap_matches_sacrebleus_command_line(tmp_path):
    rng = random.Random(3)
    words = "a the cat dog sat ran on mat in park red blue big small".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(60)]

    def noisy(s, keep):
        return " ".join(w for w in s.split() if rng.random() < keep) or "a"

    base, system = [noisy(r, 0.7) for r in refs], [noisy(r, 0.8) for r in refs]
    for name, lines in (("ref", refs), ("base", base), ("sys", system)):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    cli = Path(sys.executable).parent / "sacrebleu"
    out = subprocess.run([str(cli), str(tmp_path / "ref"), "-i", str(tmp_path / "base"), str(tmp_path / "sys"),
                          "-m", "bleu", "--paired-bs", "-f", "json"], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    cli_base, cli_sys = json.loads(out.stdout)
    ours = paired_bootstrap(base, system, refs)
    assert ours["p"] == pytest.approx(cli_sys["BLEU"]["p_value"], abs=1e-12)
    assert ours["delta"] == pytest.approx(cli_sys["BLEU"]["score"] - cli_base["BLEU"]["score"], abs=1e-3)
    with pytest.raises(ValueError, match="aligned"):
        paired_bootstrap(base[:-1], system, refs)


def test_seed_test_of_several_runs_is_the_pooled_two_sample_t_test():
    from scipy import stats as scipy_stats

    ref, xs = [10.0, 11.0, 12.0, 10.5, 11.5], [12.4, 13.1]
    t = seed_test(xs, ref)
    assert t.p == pytest.approx(scipy_stats.ttest_ind(xs, ref, equal_var=True).pvalue, rel=1e-9)
    assert (t.delta, t.n, t.m) == (pytest.approx(12.75 - 11.0), 5, 2)
    lo, hi = scipy_stats.ttest_ind(xs, ref, equal_var=True).confidence_interval(0.90)
    assert t.ci90 == (pytest.approx(lo), pytest.approx(hi))
    assert seed_test([11.7], ref) == seed_test(11.7, ref)  # one run in a list: the prediction test


def test_a_p_value_is_never_printed_as_zero():
    """Three decimals round 0.0002 to 0.000, a p-value no test gives: it reads < 0.001. A paired bootstrap's
    smallest p, 1/1001, is 0.001."""
    assert p_text(0.0002) == "< 0.001" and p_text(0.0) == "< 0.001"
    assert p_text(1 / 1001) == "0.001" and p_text(0.0163) == "0.016" and p_text(1.0) == "1.000"


def test_every_table3_row_has_a_claim_that_follows_its_table_delta():
    """claims.py against plan.py: every Table 3 row has a claim, and where the paper's Δ is beyond the
    margin the claim goes its way (a claim against the table would need the text to overrule it)."""
    import math

    from aiayn.evidence.claims import CLAIMS, SAME
    from aiayn.evidence.plan import BLEU_MARGIN, NLL_MARGIN, table3_rows

    rows = [r for r in table3_rows() if r.group != "ref"]
    assert sorted(r.name for r in rows) == sorted(CLAIMS)
    for r in rows:
        c = CLAIMS[r.name]
        d_nll = math.log(r.paper.ppl) - math.log(r.paper.ref_ppl)
        d_bleu = r.paper.bleu - r.paper.ref_bleu
        for claim, d, margin, lower_is_better in ((c.nll, d_nll, NLL_MARGIN, True),
                                                  (c.bleu, d_bleu, BLEU_MARGIN, False)):
            if claim in (None, SAME) or abs(d) < margin:
                continue
            table = "better" if (d < 0) == lower_is_better else "worse"
            assert claim == table, (r.name, claim, d)
