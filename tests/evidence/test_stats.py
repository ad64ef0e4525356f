"""evidence/stats.py against hand-computed intervals and against sacreBLEU's own command line."""

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.evidence.stats import equivalent, holm, judge, p_text, paired_bootstrap, prediction_halfwidth, seed_test


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
    assert equivalent((-0.01, 0.015), 0.02)
    assert not equivalent((-0.01, 0.025), 0.02)


def _test(delta, p, ci):
    from aiayn.evidence.stats import SeedTest

    return SeedTest(delta, p, 1.0, ci, 5)


@pytest.mark.parametrize("paper,delta,p_adj,ci,higher,expected,ok", [
    (-0.9, -1.2, 0.01, (-1.5, -0.9), True, "same direction, significant (worse)", True),
    (-0.9, +1.2, 0.01, (0.9, 1.5), True, "opposite, significant (ours better; paper: worse)", False),
    (-0.9, -1.2, 0.20, (-2.5, 0.1), True, "inconclusive (paper: worse)", None),
    (-0.1, 0.05, 0.80, (-0.2, 0.3), True, "no change (equivalent), as the paper", True),
    (0.0, 0.05, 0.80, (-0.7, 0.8), True, "inconclusive (paper: no change)", None),
    (0.0, -2.0, 0.001, (-2.4, -1.6), True, "worse (significant); paper: no change", False),
    (0.37, 0.30, 0.001, (0.2, 0.4), False, "same direction, significant (worse)", True),  # NLL: up is worse
])
def test_verdicts_are_symmetric_in_what_the_paper_claims(paper, delta, p_adj, ci, higher, expected, ok):
    v = judge(paper, 0.5 if higher else 0.02, _test(delta, 0.0, ci), p_adj, 0.5 if higher else 0.02, higher)
    assert (v.word, v.reproduced) == (expected, ok)


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
