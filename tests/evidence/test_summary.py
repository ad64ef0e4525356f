"""The report's one-paragraph summary: the seeds that would settle a row, checked against scipy's t
test on runs built to that count, and the rows it names, from results whose verdicts are known by hand."""

import json
import re
import statistics
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from aiayn.evidence.machine import compute_section
from aiayn.evidence.report import _fmt_machine
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


def _power(delta: float, m: int, alpha: float) -> float:
    """The two-sided t test's power for m runs against REF at a true change `delta` (noncentral t)."""
    n, df = len(REF), len(REF) + m - 2
    ncp = delta / (statistics.stdev(REF) * (1 / m + 1 / n) ** 0.5)
    crit = scipy_stats.t.ppf(1 - alpha / 2, df)
    return scipy_stats.nct.sf(crit, df, ncp) + scipy_stats.nct.cdf(-crit, df, ncp)


def test_the_summary_names_agreeing_contradicted_open_and_unjudged_rows_and_their_budget():
    """Rows named as Table 3's (claims.py says what the paper claims for each): C-N1 and A-h1 claim
    worse, E no change, A-h2 nothing (within the margins, the text silent)."""
    refs = [_result(f"ref-s{i}", v, seed=i) for i, v in enumerate(REF, 1)]
    rows = [_result("C-N1", 2.10, 6.11),  # claim worse, ours +0.10: agrees
            _result("A-h1", 1.90, 5.29),  # claim worse, ours significantly better: contradicts
            _result("B-dk16", 2.03, 5.16),  # +0.03: inside the prediction interval
            _result("A-h2", 2.10, 5.00)]  # no claim: reported, not judged
    arch = [_result("transformer", 1.6), _result("luong", 1.8)]
    text = "\n".join(summary_section({"table3": refs + rows, "arch": arch}))
    assert "of the paper's 3 Table 3 claims" in text and "**1 agrees** (C-N1)" in text
    assert "**1 contradicts** (A-h1 (ours better, paper worse))" in text and "**1 is inconclusive** (B-dk16)" in text
    assert "Not judged: A-h2 (the paper's Δ within the margins and its text silent)" in text
    more = int(re.search(r"B-dk16 (\d+);", text).group(1))
    alpha = 0.05 / 3  # Holm's first step over the 3 judged rows
    assert _power(0.03, more + 1, alpha) >= 0.75 and _power(0.03, more, alpha) < 0.8
    assert "the tune suite has not run" in text and "luong, 1 seed: valid NLL 1.8000" in text
    tuned = "\n".join(summary_section({"table3": refs + rows, "arch": arch, "tune": [arch[1]]}))
    assert "the tune suite has not run" not in tuned and "luong, 1 seed: valid NLL 1.8000" in tuned


def test_the_summary_names_the_rows_whose_bleu_agrees_or_contradicts():
    refs = [_result(f"ref-s{i}", v, seed=i, bleu={"valid": {"bleu": b}})
            for i, (v, b) in enumerate(zip(REF, [30.0, 30.2, 29.8, 30.1, 29.9]), 1)]
    paired = {"baseline": "ref-s1", "split": "valid", "p": 0.001, "samples": 1000}
    rows = [_result("C-N1", 2.10, 6.11, bleu={"valid": {"bleu": 25.0}}, paired_bs={**paired, "delta": -5.0}),
            _result("A-h1", 1.90, 5.29, bleu={"valid": {"bleu": 35.0}}, paired_bs={**paired, "delta": 5.0}),
            _result("B-dk16", 2.03, 5.16, bleu={"valid": {"bleu": 30.1}}, paired_bs={**paired, "delta": 0.1})]
    text = "\n".join(summary_section({"table3": refs + rows}))
    assert "Of its 3 BLEU claims (a difference must also pass the paired bootstrap) 1 agrees (C-N1), " \
           "1 contradicts (A-h1) and 1 is inconclusive." in text


def test_a_row_whose_own_seeds_spread_wide_is_not_settled_by_none_more():
    """An inconclusive row with as many seeds as would settle it at the reference's spread (its own two
    spread far wider) needs at least one more, not "0"."""
    refs = [_result(f"ref-s{i}", v, seed=i) for i, v in enumerate(REF, 1)]
    wide = _seeds("C-N1", "C", [1.98, 2.14], [30.0, 30.0])
    for r in wide:
        r["paper"] = {"label": "C-N1", "ppl": 6.11, "bleu": 23.7, "ref_ppl": 4.92, "ref_bleu": 25.8}
    p = scipy_stats.ttest_ind([1.98, 2.14], REF).pvalue
    assert p > 0.05 and seeds_to_settle(0.06, REF, alpha=0.05, power=0.8) <= 2  # inconclusive, "settled" at 2
    text = "\n".join(summary_section({"table3": refs + wide}))
    assert "**1 is inconclusive** (C-N1)" in text and "C-N1 0" not in text
    assert "C-N1 1 or more (its 2 seeds spread wider than the reference's" in text and "in all 1 runs" in text


def _seeds(row: str, group: str, nlls: list[float], bleus: list[float], family: str = "main", **extra) -> list[dict]:
    return [{"row": row if s == 1 else f"{row}-s{s}", "of": row, "seed": s, "group": group, "family": family,
             "valid_nll": v, "valid_ppl": 7.0, "updates": 2750, "change": row, "params": 7.6e6, "curve": [],
             "bleu": {"valid": {"bleu": b}, "test_2016_flickr": {"bleu": b - 1}}, **extra}
            for s, (v, b) in enumerate(zip(nlls, bleus), 1)]


def test_the_families_are_compared_over_seeds_with_scipys_pooled_t_test_on_validation_and_test():
    """Family minus Transformer over seeds: the mean difference, scipy's pooled-variance t test's p, and the
    95 % interval's half-width (t quantile × the pooled standard error), for NLL and BLEU alike."""
    base = _seeds("transformer", "transformer", [1.67, 1.68, 1.66], [39.6, 39.3, 40.0])
    conv = _seeds("conv", "convolutional", [1.92, 1.925, 1.918], [38.2, 38.1, 38.3])
    luong = _seeds("luong", "recurrent", [1.93], [38.6])
    text = "\n".join(summary_section({"arch": base + conv + luong}))
    for xs, ys, digits in (([r["valid_nll"] for r in conv], [r["valid_nll"] for r in base], 4),
                           ([38.2, 38.1, 38.3], [39.6, 39.3, 40.0], 2), ([37.2, 37.1, 37.3], [38.6, 38.3, 39.0], 2),
                           ([38.6], [39.6, 39.3, 40.0], 2)):
        t = scipy_stats.ttest_ind(xs, ys) if len(xs) > 1 else None
        n, m = len(ys), len(xs)
        s_p = (((n - 1) * statistics.variance(ys) + (m - 1) * (statistics.variance(xs) if m > 1 else 0))
               / (n + m - 2)) ** 0.5
        half = scipy_stats.t.ppf(0.975, n + m - 2) * s_p * (1 / m + 1 / n) ** 0.5
        delta = statistics.mean(xs) - statistics.mean(ys)
        expected = f"({delta:+.{digits}f} ± {half:.{digits}f}, p "
        assert expected in text, expected
        if t is not None:
            p = t.pvalue
            assert (f"{expected}{p:.3f})" in text) or (p < 0.001 and f"{expected}< 0.001)" in text)
    assert "conv, 3 seeds: valid NLL 1.9210" in text and "test2016 BLEU 37.20 (-1.43" in text
    assert "luong, 1 seed: valid NLL 1.9300" in text  # one run: the prediction test against the seeds


def test_the_tune_suite_chooses_each_familys_lowest_validation_nll_and_compares_its_seeds():
    """The choice is the grid's lowest validation NLL (seeds and equal-FLOPs runs never choose); the
    summary compares the chosen seeds, and the equal-FLOPs seeds, with the chosen Transformer's."""
    from aiayn.evidence.families import chosen, grid_edges, tuned_lines

    grid = (_seeds("transformer-lr0.001-clip0", "transformer", [1.70], [39.0])
            + _seeds("transformer-lr0.002-clip0", "transformer", [1.66, 1.67, 1.68], [39.6, 39.3, 40.0])
            + _seeds("conv-lr0.001-clip0", "conv", [float("nan")], [0.0])  # non-finite: never chosen
            + _seeds("conv-lr0.002-clip0", "conv", [1.30], [12.0], curve=[[275, 3.0], [2750, 9.0]])  # diverged
            + _seeds("conv-lr0.001-clip1", "conv", [1.95], [38.0])
            + _seeds("conv-lr0.002-clip1", "conv", [1.91, 1.50, 1.40], [38.2, 38.1, 38.3])
            + _seeds("conv-lr0.002-clip1-flops", "conv", [1.80, 1.81, 1.79], [39.0, 39.1, 38.9], family="flops"))
    picks = chosen(grid)
    assert {f: r["row"] for f, r in picks.items()} == {"transformer": "transformer-lr0.002-clip0",
                                                        "conv": "conv-lr0.002-clip1"}  # not -s2/-s3, not -flops
    text = "\n".join(summary_section({"tune": grid}))
    assert "family minus the Transformer (transformer-lr0.002-clip0, 3 seeds" in text
    rated = [{**r, "overrides": {"train.peak_lr": float(r["of"].split("-lr")[1].split("-")[0])}} for r in grid]
    assert grid_edges(rated) == {"transformer": "highest", "conv": "highest"} and grid_edges(grid) == {}
    mid = _seeds("conv-lr0.004-clip1", "conv", [1.99], [37.0], overrides={"train.peak_lr": 0.004})
    assert grid_edges(rated + mid) == {"transformer": "highest"}  # conv's 2e-3 now lies inside its grid
    assert "At an edge of its grid's peak rates: conv (highest), transformer (highest)" in "\n".join(tuned_lines(rated))
    assert "At an edge" in "\n".join(summary_section({"tune": rated})) and "At an edge" not in text
    assert "conv, 3 seeds: valid NLL 1.6033 (-0.0667" in text  # the mean of 1.91, 1.50, 1.40 against 1.67
    assert "conv at the Transformer's training FLOPs (2,750 updates), 3 seeds: valid NLL 1.8000 (+0.1300" in text
    lone = "\n".join(tuned_lines(grid + _seeds("luong-lr0.001-clip0", "luong", [1.9], [38.0])))
    assert "(luong), 1 seed, 2,750 updates: valid NLL 1.9000" in lone and "(conv), 3 seeds, " in lone


def test_the_summary_keeps_the_presets_comparison_until_every_tuned_family_has_its_seeds():
    """While the tune suite's seeds come in, the summary gives the presets' comparison (arch) and the tuned
    one for the families seeded so far; once every family's choice has the Transformer's count of seeds,
    only the tuned one."""
    arch = (_seeds("transformer", "transformer", [1.67, 1.68, 1.66], [39.6, 39.3, 40.0])
            + _seeds("conv", "convolutional", [1.92, 1.925, 1.918], [38.2, 38.1, 38.3]))
    tune = (_seeds("transformer-lr0.002-clip1", "transformer", [1.66, 1.665, 1.661], [39.4, 39.5, 39.2])
            + _seeds("conv-lr0.004-clip1", "conv", [1.70], [39.0])
            + _seeds("bahdanau-lr0.016-clip0", "bahdanau", [1.67, 1.65], [39.6, 40.0]))
    partial = "\n".join(summary_section({"arch": arch, "tune": tune}))
    assert "conv, 3 seeds: valid NLL 1.9210" in partial and "train at their presets' rate and clipping;" in partial
    assert "Every family tuned on validation" in partial and "bahdanau, 2 seeds: valid NLL 1.6600" in partial
    assert "Seeds still to come: bahdanau, conv." in partial
    complete = tune + _seeds("bahdanau-lr0.016-clip0", "bahdanau", [1.66, 1.66, 1.66], [0, 0, 0])[2:] + [
        {**r, "row": f"conv-lr0.004-clip1-s{r['seed']}"} for r in _seeds("conv-lr0.004-clip1", "conv",
                                                                         [1.7, 1.71, 1.72], [39, 39, 39])[1:]]
    done = "\n".join(summary_section({"arch": arch, "tune": complete}))
    assert "Every family tuned on validation" in done and "conv, 3 seeds: valid NLL 1.7" in done
    assert "presets' rate" not in done and "1.9210" not in done and "still to come" not in done

def test_every_committed_result_config_rebuilds_its_parameter_count():
    """A result's recorded config is the model that ran: built again (on the meta device, no memory),
    it has the parameter count the run recorded (15 files once said vocab_size 37000 for 8,000)."""
    import json
    from pathlib import Path

    import torch

    from aiayn.config import ModelConfig
    from aiayn.parsing.model import build_any

    checked = 0
    for f in sorted((Path(__file__).parents[2] / "results" / "reproduction").glob("*/*.json")):
        r = json.loads(f.read_text())
        if not isinstance(r, dict) or "config" not in r or "params" not in r:
            continue
        with torch.device("meta"):
            model = build_any(ModelConfig(**r["config"]["model"]))
        assert sum(p.numel() for p in model.parameters()) == r["params"], f.name
        checked += 1
    assert checked >= 50


def test_verdicts_along_the_curve_are_judged_at_each_point_and_name_the_moving_rows():
    """Each point is judged on its own (the runs' NLL there, ln of the recorded PPL); a row that is worse
    early and better late changes sign; a final verdict no late point shows is named."""
    import math

    from aiayn.evidence.curves import curve_nll, curve_section, verdicts_at

    points = (100, 200, 300, 400)

    def run(row: str, final: float, nlls: tuple[float, ...], **extra) -> dict:
        return _result(row, final, curve=[[s, math.exp(v), 1.0] for s, v in zip(points, nlls)], **extra)

    refs = [run(f"ref-s{i}", v, tuple(v + 0.5 - 0.1 * k for k in range(4)), seed=i) for i, v in enumerate(REF, 1)]
    mean = statistics.mean(REF)
    rows = [run("C-N1", 2.10, (mean + 0.6, mean + 0.5, mean + 0.4, mean + 0.3), paper=None),  # worse throughout
            run("A-h1", mean + 0.1, (mean + 0.6, mean + 0.4, mean + 0.3, mean + 0.2)),  # claim worse: agrees
            run("C-dmodel512", mean - 0.1, (mean + 0.7, mean + 0.5, mean + 0.1, mean))]  # claim better: flips
    rs = refs + rows
    assert curve_nll(rows[0])[100] == pytest.approx(mean + 0.6)
    at = verdicts_at(rs, 100)
    assert at["C-N1"].v_nll.reproduced is True and at["C-dmodel512"].v_nll.reproduced is False
    assert verdicts_at(rs, 400)["C-dmodel512"].nll.delta == pytest.approx(-0.2)  # refs at mean + 0.2 there
    text = "\n".join(curve_section(rs))
    assert "| 100 | 200 | 300 | 400 | final |" in text
    assert "| C-N1 | worse | agrees | agrees | agrees | agrees | agrees |" in text
    assert "change sign along the curve (agree at one point, contradict at another): C-dmodel512." in text
    assert curve_section(refs) == []  # no judged row: no section


def test_compute_spent_sums_each_suites_hours_by_machine():
    """The report's hours and hardware: a hand-made set of results on two machines, one of them
    recorded before family and model were, and one result without a training time (not counted)."""
    zen4 = {"cpu": "AMD EPYC", "cpu_family": 25, "cpu_model": 17, "class": "AVX-512 BF16", "git": "d38ac2b" + "0" * 33}
    old = {"cpu": "AMD EPYC", "git": "a8de93c" + "0" * 33}
    results = {"tune": [{"train_minutes": 30.0, "machine": zen4}, {"train_minutes": 60.0, "machine": zen4},
                        {"train_minutes": 6.0, "machine": old}],
               "heads": [{"machine": zen4}]}
    text = "\n".join(compute_section(results))
    assert "| tune | AMD EPYC family 25 model 17, AVX-512 BF16 | 2 | 1.5 | d38ac2b |" in text
    assert "| tune | AMD EPYC, family and model not recorded | 1 | 0.1 | a8de93c |" in text
    assert "| all | | 3 | 1.6 | |" in text and "heads" not in text
    assert compute_section({"heads": [{"machine": zen4}]}) == []


def test_a_suite_split_across_machines_names_each_rows_machine():
    """Rows of one report trained on two CPUs (the 5,000-update reruns: family 26, then family 25):
    the machine line names each machine with its rows; one machine is named once, without rows; a
    row resumed on another CPU is named with both (its result's `trained_on`, from run.json)."""
    zen5 = {"cpu": "AMD EPYC", "cpu_family": 26, "cpu_model": 2, "class": "AVX-512 BF16", "threads": 2,
            "torch": "2.13.0+cpu"}
    zen4 = dict(zen5, cpu_family=25, cpu_model=17)
    rs = [{"row": "ref-s1", "machine": zen5, "device": "cpu"}, {"row": "ref-s2", "machine": zen5, "device": "cpu"},
          {"row": "D-ls0.0", "machine": zen4, "device": "cpu"}]
    both = _fmt_machine(rs)
    assert both == ("AMD EPYC family 26 model 2, AVX-512 BF16 (cpu, 2 threads, torch 2.13.0+cpu): ref-s1, ref-s2; "
                    "AMD EPYC family 25 model 17, AVX-512 BF16 (cpu, 2 threads, torch 2.13.0+cpu): D-ls0.0")
    assert _fmt_machine(rs[:2]) == "AMD EPYC family 26 model 2, AVX-512 BF16 (cpu, 2 threads, torch 2.13.0+cpu)"
    rs[2]["trained_on"] = ["AMD EPYC family 26 model 2, AVX-512 BF16", "AMD EPYC family 25 model 17, AVX-512 BF16"]
    assert _fmt_machine(rs) == both + (" (resumed on another machine: D-ls0.0 trained on AMD EPYC family 26 model 2, "
                                       "AVX-512 BF16 then AMD EPYC family 25 model 17, AVX-512 BF16)")


def test_the_committed_reports_hours_add_up_to_its_result_files():
    """docs/reproduction/REPORT.md's total training hours are the sum of every committed result's
    train_minutes (read here from the files, not through the report's loader)."""
    repo = Path(__file__).resolve().parents[2]
    docs = repo / "docs" / "reproduction"
    files = (repo / "results" / "reproduction").glob("*/*.json")
    minutes = [json.loads(f.read_text()).get("train_minutes") for f in files]
    minutes = [m for m in minutes if m is not None]
    line = next(x for x in (docs / "REPORT.md").read_text().splitlines() if x.startswith("| all | |"))
    assert line == f"| all | | {len(minutes)} | {sum(minutes) / 60:.1f} | |"


def test_the_tune_section_names_every_run_that_diverged():
    """A grid run that blew up (plan.diverged, read here from each committed result) is named beside the
    tune table, as a run that cannot be a choice, and none that trained is."""
    from aiayn.evidence.plan import diverged

    repo = Path(__file__).resolve().parents[2]
    docs = repo / "docs" / "reproduction"
    rs = [json.loads(f.read_text()) for f in sorted((repo / "results" / "reproduction" / "tune").glob("*.json"))]
    line = next(x for x in (docs / "REPORT.md").read_text().splitlines() if x.startswith("Diverged, so never"))
    assert any(diverged(r) for r in rs)
    for r in rs:
        assert (f"{r['row']} (" in line) == bool(diverged(r)), r["row"]


def test_an_unfinished_confirmatory_suite_prints_no_tally_as_a_verdict():
    """At 5,000 updates (confirmatory: plan.DESIGNS) with fewer reference seeds than FULL_REFERENCE_SEEDS
    the summary says it is unfinished and bolds no count; with all five it is a verdict; at 2,750 the
    suite is labelled exploratory."""
    from aiayn.evidence.summary import brief, readme_cell

    def suite(updates: int, seeds: int) -> list[dict]:
        refs = [_result(f"ref-s{i}", v, seed=i, updates=updates) for i, v in enumerate(REF[:seeds], 1)]
        return refs + [_result("C-N1", 2.30, 6.11, updates=updates)]

    short = "\n".join(summary_section({"table3": suite(5000, 2)}))
    assert "(confirmatory:" in short and "the suite is **unfinished**: its references have 2 of the 5 seeds" in short
    assert "**1 agrees**" not in short and "1 agrees (C-N1)" in short
    assert readme_cell(suite(5000, 2)) == "unfinished: 2 of 5 reference seeds, no verdict"
    assert "unfinished, 2 of 5 reference seeds" in brief(suite(5000, 2))
    whole = "\n".join(summary_section({"table3": suite(5000, 5)}))
    assert "**1 agrees** (C-N1)" in whole and "unfinished" not in whole
    assert readme_cell(suite(5000, 5)) == "1 claims on valid NLL: 1 agree, 0 contradict, 0 open"
    assert "(exploratory:" in "\n".join(summary_section({"table3": suite(2750, 5)}))


def test_a_confirmatory_suite_with_second_seeds_to_run_prints_no_tally_as_a_verdict():
    """With all five reference seeds, a row the seed rule picks (run once, 1-2.5 half-widths of the
    reference's interval: here +0.07 against ±0.048) keeps the suite unfinished until its second seed is in."""
    from aiayn.evidence.summary import brief, readme_cell

    refs = [_result(f"ref-s{i}", v, seed=i, updates=5000) for i, v in enumerate(REF, 1)]
    once = refs + [_result("C-N1", 2.30, 6.11, updates=5000), _result("A-h16", 2.07, 5.16, updates=5000)]
    short = "\n".join(summary_section({"table3": once}))
    assert "the suite is **unfinished**: the second seeds its seed rule picks (A-h16) have not run" in short
    assert "**" not in short.split("unfinished**")[1]
    assert readme_cell(once) == "unfinished: second seeds of A-h16 to run, no verdict"
    assert "unfinished, second seeds of A-h16 to run: where the claims stand, not a verdict" in brief(once)
    seeded = once + [_result("A-h16-s2", 2.075, 5.16, seed=2, of="A-h16", updates=5000)]
    assert "unfinished" not in "\n".join(summary_section({"table3": seeded})) + brief(seeded) + readme_cell(seeded)


def test_the_committed_table1_stores_the_formulas_the_report_prints():
    """Table 1's sequential steps and path lengths are formulas: the committed result file holds what
    evidence/table1.py computes for every layer and n (the report prints the function's value)."""
    from aiayn.evidence.table1 import path_length, sequential_steps

    t1 = json.loads((Path(__file__).resolve().parents[2] / "results/reproduction/table1/table1.json").read_text())
    for name, layer in t1["layers"].items():
        assert layer["path_length"] == [path_length(name, n) for n in t1["ns"]], name
        assert layer["sequential"] == [sequential_steps(name, n) for n in t1["ns"]], name


def test_power_tables_give_bleu_its_own_and_say_when_no_seeds_let_a_no_change_claim_agree():
    """BLEU's power table: the smallest ΔBLEU found at 80 % power equals the noncentral-t computation
    (stats.min_detectable, checked against scipy in test_stats); a no-change row beyond the margin gets
    the line that no number of seeds lets it agree at the change it showed."""
    from aiayn.evidence.power import bleu_power_table, power_table
    from aiayn.evidence.stats import min_detectable
    from aiayn.evidence.verdicts import judge_all, seed_tests

    refs = [_result(f"ref-s{i}", v, seed=i, bleu={"valid": {"bleu": b}})
            for i, (v, b) in enumerate(zip(REF, [30.0, 30.2, 29.8, 30.1, 29.9]), 1)]
    rows = [_result("E", 2.10, 4.92, bleu={"valid": {"bleu": 29.0}}, paired_bs={"p": 0.01, "delta": -1.0}),
            _result("A-h1", 2.05, 5.29, bleu={"valid": {"bleu": 29.5}}, paired_bs={"p": 0.01, "delta": -0.5})]
    verdicts = judge_all(seed_tests(refs, rows))
    table = bleu_power_table(verdicts)
    e = next(v for v in verdicts if v.r["row"] == "E")
    assert f"| E | no change | 1 | {e.bleu.delta:+.2f} | {min_detectable(e.bleu, 0.05, 0.8):.2f} / " \
           f"{min_detectable(e.bleu, 0.05 / 2, 0.8):.2f} |" in table
    nll = "\n".join(power_table(verdicts, {"main": REF}))
    assert "none would let it agree at the change it showed (\\|ΔNLL\\| 0.1000 beyond the margin 0.02)" in nll


def test_every_family_bleu_comparison_carries_its_brevity_penalty_and_chrf_test():
    """Beside each ΔBLEU: the mean BP of both sides and chrF's own difference, tested as BLEU's is."""
    from aiayn.evidence.families import comparison_words

    def run(bleu, bp, chrf, nll=1.7):
        return {"row": "x", "valid_nll": nll, "bleu": {"valid": {"bleu": bleu, "bp": bp, "chrf": chrf}}}

    base = [run(39.0, 0.93, 61.0), run(39.4, 0.92, 61.4), run(39.2, 0.94, 61.2)]
    fam = [run(40.0, 0.98, 61.1), run(40.4, 0.99, 61.3), run(40.2, 0.97, 61.2)]
    words = comparison_words(fam, base, ("valid BLEU",))
    want = scipy_stats.ttest_ind([61.1, 61.3, 61.2], [61.0, 61.4, 61.2]).pvalue
    assert words.startswith("valid BLEU 40.20 (+1.00 ± ") and "[BP 0.980 against 0.930; chrF 61.20 (+0.00 ± " in words
    assert words.endswith(f"p {want:.3f})]")
    assert "chrF" not in comparison_words([{**fam[0], "bleu": {"valid": {"bleu": 40.0, "bp": 0.98}}}], base,
                                          ("valid BLEU",))


def test_an_unfinished_suite_names_each_familys_reference_seeds_as_its_files_hold_them():
    """The 5,000 suite's summary says how many reference seeds each family has, counted here from the
    committed result files (group "ref", by family), not from the summary's own code."""
    from aiayn.evidence.summary import brief

    folder = Path(__file__).resolve().parents[2] / "results" / "reproduction-5000" / "table3"
    rs = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    count = {f: sum(r["group"] == "ref" and r.get("family", "main") == f for r in rs) for f in ("main", "depth")}
    same = count["main"] == count["depth"]
    want = str(count["main"]) if same else f"{count['main']} (main) and {count['depth']} (depth)"
    if min(count.values()) < 5:
        assert f"unfinished, {want} of 5 reference seeds" in brief(rs)
    else:  # the references complete: what may still keep it unfinished is second seeds, tested above
        assert "of 5 reference seeds" not in brief(rs)


def test_the_decode_section_shows_each_runs_tuned_setting_and_both_bleus_and_the_summary_waits_for_seeds():
    """The decode suite's table: a run's chosen beam and α, its BLEU (BP) at that setting then at beam 4,
    α 0.6, its NLL beside the tune suite's; the comparison over seeds at the tuned settings; the summary's
    sentence (test BLEU, family minus Transformer) only once every family has the Transformer's seeds."""
    from aiayn.evidence.families import decoded_section, decoded_words

    def decoded(rs: list[dict], beam: int, alpha: float) -> list[dict]:
        grid = [{"beam": b, "alpha": a, "bleu": 30.0, "bp": 1.0} for b in (2, 4, 6) for a in (0.0, 0.6, 2.0)]
        return [{**r, "decode": {"beam": beam, "alpha": alpha, "tuned": {"points": grid}},
                 "bleu": {k: {**v, "bp": 0.97} for k, v in r["bleu"].items()},
                 "bleu_paper": {k: {"bleu": v["bleu"] - 0.5, "bp": 0.93} for k, v in r["bleu"].items()}} for r in rs]

    base = decoded(_seeds("transformer-lr0.002-clip1", "transformer", [1.66, 1.67, 1.68], [39.0, 39.2, 39.4]), 6, 1.5)
    luong = decoded(_seeds("luong-lr0.008-clip1", "luong", [1.64, 1.63], [40.0, 40.4]), 4, 0.6)
    tune = [{**r, "valid_nll": r["valid_nll"] + 1e-5} for r in base]
    text = "\n".join(decoded_section(base + luong, tune))
    assert "beams 2, 4, 6 × α 0, 0.6, 2" in text
    assert "| transformer-lr0.002-clip1 | transformer | 6, 1.5 | 1.6600 (1.6600) | 39.00 (0.97) / 38.50 (0.93) | " \
           "38.00 (0.97) / 37.50 (0.93) | – |" in text
    assert "3 runs reach the tune suite's validation NLL within 1e-05 nats" in text
    assert "- **luong-lr0.008-clip1** (luong), 2 seeds, 2,750 updates: valid NLL 1.6350 (-0.0350" in text
    assert decoded_words(base + luong, tune) == ""  # luong has 2 of the Transformer's 3 seeds
    luong += decoded(_seeds("luong-lr0.008-clip1", "luong", [1.64, 1.63, 1.65], [40.0, 40.4, 40.2]), 4, 0.6)[2:]
    words = decoded_words(base + luong, tune)
    assert words.startswith("Each family decoded at the beam and α chosen on its own validation set")
    assert "luong, 3 seeds: test2016 BLEU 39.20 (+1.00" in words and "valid NLL" not in words
    # the runs at the Transformer's training FLOPs: the sentence waits for every one the tune suite has
    flops = [{**r, "updates": 3064} for r in _seeds("luong-lr0.008-clip1-flops", "luong", [1.62, 1.63],
                                                    [40.6, 40.8], family="flops")]
    tune_all = tune + luong + flops
    assert decoded_words(base + luong + decoded(flops, 4, 1.0)[:1], tune_all) == ""
    words = decoded_words(base + luong + decoded(flops, 4, 1.0), tune_all)
    assert "luong at the Transformer's training FLOPs (3,064 updates), 2 seeds: test2016 BLEU 39.70 (+1.50" in words
    # once it is complete, the summary's BLEU is each family's own decoding's, not beam 4, alpha 0.6 for all
    summary = " ".join(summary_section({"tune": tune_all, "decode": base + luong + decoded(flops, 4, 1.0)}))
    tuned_sentence = summary[summary.index("Every family tuned"):summary.index("Each family decoded")]
    assert "valid NLL" in tuned_sentence and "BLEU" not in tuned_sentence
    before = " ".join(summary_section({"tune": tune_all, "decode": base + luong}))
    assert "valid BLEU" in before[before.index("Every family tuned"):] and "Each family decoded" not in before


def test_the_families_test_nll_is_compared_like_bleu_where_every_run_recorded_it():
    """Test-set NLL (length-free) beside test BLEU: family minus Transformer over seeds, scipy's pooled t
    test; a family one of whose runs lacks it gets no test NLL at all, never a mean of the rest."""
    from scipy import stats

    from aiayn.evidence.families import comparison_words

    def with_nll(rs: list[dict], nlls: list[float]) -> list[dict]:
        return [{**r, "test_nll": {"test_2016_flickr": v}} for r, v in zip(rs, nlls)]

    base = with_nll(_seeds("t", "transformer", [1.66, 1.67, 1.68], [39.0, 39.2, 39.4]), [1.64, 1.65, 1.67])
    luong = with_nll(_seeds("l", "luong", [1.64, 1.63, 1.65], [40.0, 40.4, 40.2]), [1.60, 1.62, 1.61])
    words = comparison_words(luong, base)
    t = stats.ttest_ind([1.60, 1.62, 1.61], [1.64, 1.65, 1.67])
    assert f"test2016 NLL 1.6100 ({1.61 - 1.6533333:+.4f} ± " in words and f"p {t.pvalue:.3f})" in words
    assert "test2017 NLL" not in words  # no run recorded it
    luong[1] = {k: v for k, v in luong[1].items() if k != "test_nll"}
    assert "test2016 NLL" not in comparison_words(luong, base)
