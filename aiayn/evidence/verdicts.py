"""Table 3's verdicts: each row against its reference's seeds, Holm-corrected, beside the paper's.

Primary statistic: validation NLL per token (the paper's PPL is exp of it, so the paper's change
is ln PPL_row − ln PPL_base). BLEU is secondary: a BLEU change is significant only when both the
seed interval and sacreBLEU's paired bootstrap against the seed-matched reference say so (the
larger of the two p-values, an intersection-union test), Holm-corrected over the table's rows.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..training.optim import noam_lr
from .claims import SAME, SIGN_RULE, Claim, claim_of, judged
from .figures import plot_suite_curves, row_valid_bleu
from .plan import BLEU_MARGIN, NLL_MARGIN, diverged, second_seed_distance, unstable
from .power import bleu_power_table, claims_table, power_table
from .stats import (
    SeedTest,
    Tests,
    Verdict,
    holm,
    judge,
    margin_ps,
    p_text,
    prediction_halfwidth,
    seed_test,
)


@dataclass
class RowVerdict:
    """One row's tests and verdicts (NLL and BLEU) against its family's reference, under its claim."""

    r: dict
    nll: SeedTest | None
    bleu: SeedTest | None
    claim: Claim | None = None
    p_nll: Tests | None = None  # Holm-adjusted, over the judged rows of every family
    p_bleu: Tests | None = None
    v_nll: Verdict | None = None
    v_bleu: Verdict | None = None
    failed: str | None = None
    runs: list[dict] | None = None  # every seed of the row (r is the first)


def with_repeats(rows: list[dict]) -> list[list[dict]]:
    """Each row's runs: its first seed and its repeats (results whose `of` names it), by seed."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r.get("of") or r["row"], []).append(r)
    return [sorted(rs, key=lambda r: r.get("seed", 1)) for rs in out.values()]


def _paired_p(runs: list[dict]) -> float:
    """The paired bootstrap's p over a row's seeds: the largest (every seed must show the change)."""
    return max(r.get("paired_bs", {}).get("p", 1.0) for r in runs)


def paper_deltas(p: dict) -> tuple[float, float]:
    return math.log(p["ppl"]) - math.log(p["ref_ppl"]), p["bleu"] - p["ref_bleu"]


def seed_tests(refs: list[dict], rows: list[dict]) -> list[RowVerdict]:
    """Every row's seed tests against one family's reference, before any correction or verdict."""
    ref_nll, ref_bleu = [r["valid_nll"] for r in refs], [row_valid_bleu(r) for r in refs]
    return [RowVerdict(rs[0], seed_test([r["valid_nll"] for r in rs], ref_nll),
                       seed_test([row_valid_bleu(r) for r in rs], ref_bleu), claim_of(rs[0]["row"]),
                       failed=next((f for f in map(diverged, rs) if f), None), runs=rs) for rs in with_repeats(rows)]


def judge_all(verdicts: list[RowVerdict]) -> list[RowVerdict]:
    """Holm's correction over the judged rows (of every family given), per metric, then the verdicts.
    Every claim has an arm that can agree and one that can contradict: a change claim the difference
    test and the equivalence test, a no-change claim the equivalence and the minimum-effect test. The
    agreeing arms of all judged rows are one Holm family and the contradicting arms another of the same
    size, so a claim can agree as easily as it can be contradicted. A BLEU difference (the difference
    test, the minimum-effect test) also needs every seed's paired bootstrap (the larger p)."""
    for metric, margin, higher in (("nll", NLL_MARGIN, False), ("bleu", BLEU_MARGIN, True)):
        rows = [v for v in verdicts if not v.failed and getattr(v, metric) and judged(v.claim, metric)]
        same = [judged(v.claim, metric) == SAME for v in rows]
        diff = [getattr(v, metric).p if metric == "nll" else max(v.bleu.p, _paired_p(v.runs)) for v in rows]
        equiv, outside = zip(*[margin_ps(getattr(v, metric), margin) for v in rows]) if rows else ((), ())
        if metric == "bleu":  # a BLEU difference beyond the margin is a BLEU difference: the bootstrap must show it too
            outside = tuple(max(o, _paired_p(v.runs)) for o, v in zip(outside, rows))
        agree = holm([e if s else d for s, d, e in zip(same, diff, equiv)])
        contradict = holm([o if s else e for s, e, o in zip(same, equiv, outside)])
        for v, s, a, c in zip(rows, same, agree, contradict):
            tests = Tests(1.0, a, c) if s else Tests(a, c, 1.0)
            setattr(v, f"p_{metric}", tests)
            setattr(v, f"v_{metric}", judge(judged(v.claim, metric), getattr(v, metric).delta, tests, higher))
    return verdicts


def analyse_all(rs: list[dict]) -> dict[str, list[RowVerdict]]:
    """Table 3's families (main, depth), each against its own reference, judged as one family of tests."""
    fam = families(rs)
    out = {f: seed_tests(fam[f][0], sorted(fam[f][1], key=lambda r: (r["group"], r["row"])))
           for f in ("main", "depth") if len(fam[f][0]) >= 2}
    judge_all([v for vs in out.values() for v in vs])
    return out


def _cell_test(v: RowVerdict, metric: str, fmt: str) -> str:
    """Δ ± its 95 % interval and every deciding p, Holm-adjusted (judge_all): a change claim's difference
    test and equivalence test, a no-change claim's equivalence and minimum-effect test; a row not judged
    on `metric` shows its difference test's p as it is ("unadjusted")."""
    t, p = getattr(v, metric), getattr(v, f"p_{metric}")
    if t is None:
        return "–"
    head = f"{t.delta:{fmt}} ± {t.pi95:{fmt[1:]}}"
    if p is None:
        return f"{head} (p {p_text(t.p)}, unadjusted)"
    if judged(v.claim, metric) == SAME:
        return f"{head} (Holm p: equivalent {p_text(p.equiv)}, beyond the margin {p_text(p.outside)})"
    return f"{head} (Holm p {p_text(p.diff)}; equivalent {p_text(p.equiv)})"


def not_judged(v: RowVerdict, metric: str) -> str:
    """Why a row has no verdict on `metric`."""
    c = v.claim
    if v.failed:
        return "diverged: no verdict"
    if c is None:
        return "no claim"
    if c.kind == "extension":
        return "not judged: ours (no Table 3 row)"
    if c.kind == "observation":
        return "not judged: an observation"
    return "not judged: no claim (Δ within the margin, the text silent)"


def _verdict_cell(v: RowVerdict, metric: str) -> str:
    verdict = getattr(v, f"v_{metric}")
    return verdict.word if verdict else not_judged(v, metric)


def _row_line(v: RowVerdict) -> str:
    r, p, runs = v.r, v.r.get("paper"), v.runs or [v.r]
    bleu = statistics.mean(x["bleu"].get("valid", {}).get("bleu", float("nan")) for x in runs)
    bp = statistics.mean(x["bleu"].get("valid", {}).get("bp", 0) for x in runs)
    paper = "–"
    if p:
        d_nll, d_bleu = paper_deltas(p)
        paper = f"{p['label']}: {d_nll:+.3f} / {d_bleu:+.1f}"
    pbs = [x["paired_bs"] for x in runs if "paired_bs" in x]
    pbs_cell = ", ".join(f"{b['delta']:+.2f} (p {p_text(b['p'])})" for b in pbs) or "–"
    name = r["row"] + (f" ({len(runs)} seeds, mean)" if len(runs) > 1 else "")
    nll = statistics.mean(x["valid_nll"] for x in runs)
    return (f"| {name} | {r['change']} | {r['params'] / 1e6:.2f}M | {nll:.4f} | "
            f"{_cell_test(v, 'nll', '+.4f')} | {bleu:.2f} ({bp:.2f}) | "
            f"{_cell_test(v, 'bleu', '+.2f')} | {pbs_cell} | {paper} | {_verdict_cell(v, 'nll')} | "
            f"{_verdict_cell(v, 'bleu')} |")


def family_table(refs: list[dict], verdicts: list[RowVerdict], updates: int) -> list[str]:
    """The table of one family (rows sharing a reference and a schedule), its verdicts given."""
    at = f"at {updates:,} updates on Multi30k"
    out = ["| row | change | params | valid NLL | ΔNLL ± 95 % PI (p) | valid BLEU (BP) | "
           "ΔBLEU ± 95 % PI (p) | paired bootstrap ΔBLEU (p) | paper: ΔNLL / ΔBLEU | "
           f"verdict NLL, {at} | verdict BLEU, {at} |", "|---|---|--:|--:|--:|--:|--:|--:|---|---|---|"]
    for r in sorted(refs, key=lambda r: r["seed"]):
        b = r["bleu"].get("valid", {})
        out.append(f"| {r['row']} | reference (seed {r['seed']}) | {r['params'] / 1e6:.2f}M | {r['valid_nll']:.4f} | "
                   f"| {b.get('bleu', float('nan')):.2f} ({b.get('bp', 0):.2f}) | | | base | | |")
    return out + [_row_line(v) for v in verdicts]


def _summary(verdicts: list[RowVerdict]) -> list[str]:
    out = []
    for metric in ("nll", "bleu"):
        vs = [getattr(v, f"v_{metric}") for v in verdicts if getattr(v, f"v_{metric}")]
        if vs:
            out.append(f"- {metric.upper()}: of {len(vs)} claims judged, {sum(v.reproduced is True for v in vs)} "
                       f"agree, {sum(v.reproduced is False for v in vs)} contradict, "
                       f"{sum(v.reproduced is None for v in vs)} inconclusive.")
    failed = [v for v in verdicts if v.failed]
    out += [f"- {v.r['row']} ({v.r['change']}) {v.failed}." for v in failed]
    unpaired = [v.r["row"] for v in verdicts if not v.failed and any("paired_bs" not in r for r in v.runs or [v.r])]
    if unpaired:
        out.append(f"- No paired bootstrap for {', '.join(unpaired)} (their hypotheses were not kept): their BLEU "
                   "cannot be significant.")
    return out


def commits_words(rs: list[dict]) -> str:
    """Which commit made the rows (one, or each of several by its rows); a row without one is named."""
    commits = [r.get("machine", {}).get("git") for r in rs]
    missing = sum(c is None for c in commits)
    seen = sorted({c for c in commits if c})
    if missing:
        return (f"**The commit is not recorded for {missing} of {len(rs)} rows** (results written before "
                "results recorded it): these rows cannot be traced to one code version.")
    if len(seen) == 1:
        return f"All rows from commit {seen[0]}."
    by = {c: [r["row"] for r in rs if r.get("machine", {}).get("git") == c] for c in seen}
    most = max(seen, key=lambda c: len(by[c]))
    parts = [f"{c} ({len(by[c])} row{'s' * (len(by[c]) != 1)}{'' if c == most else ': ' + ', '.join(by[c])})"
             for c in seen]
    return f"**Rows from {len(seen)} commits**, mixed with --allow-mixed-commits: {'; '.join(parts)}."


def data_words(r: dict) -> str:
    """The data a result trained on, as recorded (results before it was recorded: Multi30k EN→DE)."""
    d = r.get("data")
    if not d:
        return "Multi30k EN→DE"
    return f"`{d['dir']}` ({d['src']}→{d['tgt']}, {d['train_pairs']:,} training pairs)"


def reference_words(refs: list[dict]) -> str:
    """The reference seeds' spread: mean, standard deviation and the 95 % prediction half-width."""
    if len(refs) < 2:
        return ""
    parts = []
    for name, vals, fmt in (("NLL", [r["valid_nll"] for r in refs], ".4f"),
                            ("BLEU", [row_valid_bleu(r) for r in refs], ".2f")):
        parts.append(f"{name} {statistics.mean(vals):{fmt}} ± {statistics.stdev(vals):{fmt}} (sd), a new run "
                     f"within ±{prediction_halfwidth(vals):{fmt}} (95 %)")
    return f"Reference, {len(refs)} seeds: " + "; ".join(parts) + "."


def schedule_words(r: dict) -> str:
    """The schedule a result trained with, from its recorded config (never from today's presets)."""

    t = (r.get("config") or {}).get("train")
    if not t:
        return f"warm-up {r['common'].get('train.warmup_steps', '?')} (its rate was not recorded)"
    d = r["config"]["model"]["d_model"]
    peak = noam_lr(t["warmup_steps"], d, t["warmup_steps"], t["lr_scale"], t.get("peak_lr", 0.0))
    return (f"warm-up {t['warmup_steps']}, lr_scale {t['lr_scale']:g}, peak rate {peak:.2e}, clipping "
            f"{t['clip_norm'] or 'none'}")


def families(rs: list[dict]) -> dict[str, tuple[list[dict], list[dict]]]:
    """Table 3's results by family (main, depth, stability): its reference seeds and its rows."""
    return {f: ([r for r in rs if r.get("family", "main") == f and r["group"] == "ref"],
                [r for r in rs if r.get("family", "main") == f and r["group"] != "ref"])
            for f in ("main", "depth", "stability")}


def _protocol_words(r0: dict) -> str:
    """How Table 3's rows were trained, tested and judged (the section's first paragraph)."""
    at = f"at {r0['updates']:,} updates on Multi30k"
    return (f"Every row trains {r0['updates']:,} updates on {data_words(r0)} from the `{r0['preset']}` reference "
            f"({schedule_words(r0)}), changing one thing as the paper's row does; the last 5 checkpoints are "
            "averaged (§6.1) and decoded with beam 4, α 0.6. Verdicts use validation only; the primary statistic is "
            "NLL per token (the paper's ΔPPL read as Δln PPL). A row is tested against the 95 % prediction interval "
            "of one new reference run (t with n−1 degrees of freedom over the reference seeds). A row whose NLL change "
            "lands between 1 and 2.5 interval half-widths gets a second seed, and a row of m seeds is tested by its "
            "mean (pooled two-sample t, n+m−2 degrees of freedom). BLEU's difference additionally needs sacreBLEU's "
            "paired bootstrap (1,000 resamples) against the seed-matched reference, for every seed. Each row is judged "
            "against what the paper claims for it (below, with the sentence it rests on; a row whose Table 3 Δ is "
            f"within ±{NLL_MARGIN} nats or ±{BLEU_MARGIN} BLEU and which the text passes over claims nothing and is "
            "reported, not judged). A change claim agrees when ours differs significantly in its direction and is "
            "contradicted when ours differs significantly the other way or is equivalent within the margin (TOST); a "
            "no-change claim agrees when ours is equivalent within the margin and is contradicted when ours differs by "
            "more than the margin (minimum-effect test). Each test is Holm-corrected over the rows it judges, both "
            f"tables together. Every verdict holds {at}, not at the paper's scale. BP is the brevity penalty.")


def second_seed_state(fam: dict[str, tuple[list[dict], list[dict]]]) -> tuple[list[str], list[tuple[str, float]]]:
    """Table 3's seed rule on the results (run once, NLL change 1-2.5 half-widths of its family's reference
    interval): the rows that have their second seed, and those it picks still run once with their half-widths."""
    seeded, once = [], []
    for f in ("main", "depth"):
        refs, rows = fam[f]
        twice, ref_nll = {r.get("of") for r in rows if r.get("seed", 1) > 1}, [x["valid_nll"] for x in refs]
        for r in rows:
            if r["row"] in twice:
                seeded.append(r["row"])
            elif r.get("seed", 1) == 1 and not diverged(r) and second_seed_distance(r["valid_nll"], ref_nll
                                                                                    ) is not None:  # the rule
                t = seed_test(r["valid_nll"], ref_nll)
                once.append((r["row"], abs(t.delta) / t.pi95))
    return seeded, once


def seed_rule_words(fam: dict[str, tuple[list[dict], list[dict]]]) -> str:
    """Which rows the seed rule picked and whether each got its second seed: what `--extra-seeds`' cap
    left out, said ("" before any row has run)."""
    seeded, once = second_seed_state(fam)
    if not (seeded or once or fam["main"][1] or fam["depth"][1]):
        return ""
    return (f"Second seeds (the rule above, nearest the line first, at most `--extra-seeds`): {len(seeded)} rows have "
            f"one ({', '.join(seeded) or 'none'}); " + ("picked by the rule but still run once: "
                                                        + ", ".join(f"{r} ({h:.2f} half-widths)" for r, h in once) + "."
                                                        if once else "every row the rule picks has its second seed."))


def table3_section(rs: list[dict], img: Path, machine_words, seeds: int = 5,
                   rows: list[str] | None = None) -> list[str]:
    """Table 3's section: the protocol, one table per family, the verdict counts, provenance (the
    command names `--valid-every`, `--seeds` and `--rows` where the run's differ from the defaults)."""
    fam = families(rs)
    refs = fam["main"][0]
    if not refs:
        return ["## Table 3 at small scale", "", "No reference run has finished yet.", ""]
    r0, steps = refs[0], refs[0]["common"]["train.max_steps"]
    every = r0["common"].get("train.valid_every", max(1, steps // 10))
    flags = f" --valid-every {every}" * (every != max(1, steps // 10)) + f" --seeds {seeds}" * (seeds != 5)
    flags += f" --rows {','.join(rows)}" if rows else ""
    out = ["## Table 3 at small scale", "", _protocol_words(r0), "",
           f"Made by `aiayn reproduce --suite table3 --steps {steps}{flags}`.", ""]
    stab_refs, stab = fam["stability"]
    if stab:
        out += ["Stability check (N=6 at the suite's schedule before the depth rows): "
                + "; ".join(f"{r['row']}: {unstable(r) or 'trained'}"
                            for r in sorted(stab, key=lambda r: -r["config"]["train"]["lr_scale"]))
                + ".", ""]
    judged_rows = analyse_all(rs)
    verdicts: list[RowVerdict] = []
    for f, title in (("main", None), ("depth", "Depth rows at their own rate")):
        f_refs, f_rows = fam[f]
        if not (f_refs or f_rows):
            continue
        if title:
            out += [f"### {title}", "", "N=6 did not train at the suite's rate, so the depth rows and a reference "
                    f"of their own (N = 3) train at a lower one ({schedule_words((f_refs or f_rows)[0])}); they are "
                    "compared only with that reference. The paper's step from N=6 to 8 is 1.33×: C-N4 is that step "
                    f"here{'' if any(r['row'] == 'C-N4' for r in f_rows) else ' (not run yet)'}; C-N6 (2×) is an "
                    "observation.", ""]
        vs = judged_rows.get(f, [])
        out += family_table(f_refs, vs, r0["updates"]) + [""] + (
            [reference_words(f_refs), ""] if len(f_refs) > 1 else ["Fewer than two reference seeds: no interval, no "
                                                                   "verdict yet.", ""])
        verdicts += vs
    summary = _summary(verdicts)
    out += summary + [""] if summary else []
    seed_rule = seed_rule_words(fam)
    out += [seed_rule, ""] if seed_rule else []
    better = [v.r["row"] for v in verdicts if v.nll and v.nll.delta < 0 and v.nll.p < 0.05]
    out += [("Rows with a lower validation NLL than their reference, p < 0.05 unadjusted (candidates for the "
             "preset): " + ", ".join(better) + ".") if better else "No row has a lower validation NLL than its "
            "reference at p < 0.05.", "", commits_words(refs + fam["main"][1] + fam["depth"][0] + fam["depth"][1]),
            f"Machine: {machine_words(rs)}.", ""]
    refs_nll = {f: [r["valid_nll"] for r in fam[f][0]] for f in judged_rows}
    out += ["### What the paper claims, row by row", "", SIGN_RULE, ""] + claims_table(verdicts) + [""]
    out += ["### What each row could show", "", "The power of each row's test (NLL): the smallest change its "
            "seeds find at 80 % power, and the seeds that would settle it with that power.", ""]
    out += power_table(verdicts, refs_nll) + [""]
    out += ["The same for validation BLEU (the secondary statistic):", ""] + bleu_power_table(verdicts) + [""]
    plot_suite_curves([r for r in rs if r.get("family") != "stability"], img / "table3_curves.png",
                 "Table 3 rows: validation perplexity", by_time=False)
    return out + ["![validation curves](img/table3_curves.png)", ""]
