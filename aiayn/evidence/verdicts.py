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
from .figures import _plot_curves, _valid_bleu
from .plan import BLEU_MARGIN, NLL_MARGIN, diverged, unstable
from .stats import SeedTest, Verdict, holm, judge, p_text, prediction_halfwidth, seed_test


@dataclass
class RowVerdict:
    """One row's tests and verdicts (NLL and BLEU) against its family's reference."""

    r: dict
    nll: SeedTest | None
    bleu: SeedTest | None
    p_nll: float | None = None  # Holm-adjusted
    p_bleu: float | None = None
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


def analyse(refs: list[dict], rows: list[dict]) -> list[RowVerdict]:
    """Seed tests of every row, Holm's correction over the non-diverged rows, then the verdicts."""
    ref_nll, ref_bleu = [r["valid_nll"] for r in refs], [_valid_bleu(r) for r in refs]
    out = [RowVerdict(rs[0], seed_test([r["valid_nll"] for r in rs], ref_nll),
                      seed_test([_valid_bleu(r) for r in rs], ref_bleu),
                      failed=next((f for f in map(diverged, rs) if f), None), runs=rs) for rs in with_repeats(rows)]
    tested = [v for v in out if not v.failed and v.nll is not None]
    for v, p in zip(tested, holm([v.nll.p for v in tested])):
        v.p_nll = p
    bleu_p = [max(v.bleu.p, _paired_p(v.runs)) for v in tested]
    for v, p in zip(tested, holm(bleu_p)):
        v.p_bleu = p
    for v in out:
        p = v.r.get("paper")
        if v.failed or not p:
            continue
        d_nll, d_bleu = paper_deltas(p)
        v.v_nll = judge(d_nll, NLL_MARGIN, v.nll, v.p_nll, NLL_MARGIN, higher_is_better=False)
        v.v_bleu = judge(d_bleu, BLEU_MARGIN, v.bleu, v.p_bleu, BLEU_MARGIN, higher_is_better=True)
    return out


def _cell_test(t: SeedTest | None, p: float | None, fmt: str) -> str:
    if t is None:
        return "–"
    return f"{t.delta:{fmt}} ± {t.pi95:{fmt[1:]}}" + (f" (p {p_text(p)})" if p is not None else "")


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
    verdicts = (("diverged: no verdict",) * 2 if v.failed else
                tuple(x.word if x else "–" for x in (v.v_nll, v.v_bleu)))
    name = r["row"] + (f" ({len(runs)} seeds, mean)" if len(runs) > 1 else "")
    nll = statistics.mean(x["valid_nll"] for x in runs)
    return (f"| {name} | {r['change']} | {r['params'] / 1e6:.2f}M | {nll:.4f} | "
            f"{_cell_test(v.nll, v.p_nll, '+.4f')} | {bleu:.2f} ({bp:.2f}) | "
            f"{_cell_test(v.bleu, v.p_bleu, '+.2f')} | {pbs_cell} | {paper} | {verdicts[0]} | {verdicts[1]} |")


def family_table(refs: list[dict], rows: list[dict]) -> tuple[list[str], list[RowVerdict]]:
    """The table of one family (rows sharing a reference and a schedule)."""
    out = ["| row | change | params | valid NLL | ΔNLL ± 95 % PI (Holm p) | valid BLEU (BP) | "
           "ΔBLEU ± 95 % PI (Holm p) | paired bootstrap ΔBLEU (p) | paper: ΔNLL / ΔBLEU | verdict NLL | "
           "verdict BLEU |", "|---|---|--:|--:|--:|--:|--:|--:|---|---|---|"]
    for r in sorted(refs, key=lambda r: r["seed"]):
        b = r["bleu"].get("valid", {})
        out.append(f"| {r['row']} | reference (seed {r['seed']}) | {r['params'] / 1e6:.2f}M | {r['valid_nll']:.4f} | "
                   f"| {b.get('bleu', float('nan')):.2f} ({b.get('bp', 0):.2f}) | | | base | | |")
    verdicts = analyse(refs, sorted(rows, key=lambda r: (r["group"], r["row"])))
    out += [_row_line(v) for v in verdicts]
    return out, verdicts


def _summary(verdicts: list[RowVerdict]) -> list[str]:
    out = []
    for metric in ("nll", "bleu"):
        vs = [getattr(v, f"v_{metric}") for v in verdicts if getattr(v, f"v_{metric}")]
        if vs:
            out.append(f"- {metric.upper()}: reproduced in {sum(v.reproduced is True for v in vs)} of {len(vs)} "
                       f"rows, contradicted in {sum(v.reproduced is False for v in vs)}, inconclusive in "
                       f"{sum(v.reproduced is None for v in vs)}.")
    failed = [v for v in verdicts if v.failed]
    out += [f"- {v.r['row']} ({v.r['change']}) {v.failed}." for v in failed]
    unpaired = [v.r["row"] for v in verdicts if not v.failed and any("paired_bs" not in r for r in v.runs or [v.r])]
    if unpaired:
        out.append(f"- No paired bootstrap for {', '.join(unpaired)} (their hypotheses were not kept): their BLEU "
                   "cannot be significant.")
    return out


def _commits(rs: list[dict]) -> str:
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
                            ("BLEU", [_valid_bleu(r) for r in refs], ".2f")):
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


def table3_section(rs: list[dict], img: Path, machine_words) -> list[str]:
    """Table 3's section: the protocol, one table per family, the verdict counts, provenance."""
    fam = families(rs)
    refs = fam["main"][0]
    if not refs:
        return ["## Table 3 at small scale", "", "No reference run has finished yet.", ""]
    r0 = refs[0]
    out = ["## Table 3 at small scale", "",
           f"Every row trains {r0['updates']:,} updates on {data_words(r0)} from the `{r0['preset']}` reference "
           f"({schedule_words(r0)}), changing one thing as the paper's row does; the last 5 checkpoints are "
           "averaged (§6.1) and decoded with beam 4, α 0.6. Verdicts use validation only; the primary statistic is "
           "NLL per token (the paper's ΔPPL read as Δln PPL). A row is tested against the 95 % prediction interval "
           "of one new reference run (t with n−1 degrees of freedom over the reference seeds). A row whose NLL change "
           "lands between 1 and 2.5 interval half-widths gets a second seed, and a row of m seeds is tested by its "
           "mean (pooled two-sample t, n+m−2 degrees of freedom). BLEU additionally needs sacreBLEU's paired "
           "bootstrap (1,000 resamples) against the seed-matched reference, for every seed; p-values are "
           f"Holm-corrected over the table's rows. A paper row with |ΔBLEU| < {BLEU_MARGIN} or |ΔNLL| < "
           f"{NLL_MARGIN} claims no change, reproduced only when our 90 % interval lies inside ±{BLEU_MARGIN} BLEU "
           f"or ±{NLL_MARGIN} nats. BP is the brevity penalty.", "",
           f"Made by `aiayn reproduce --suite table3 --steps {r0['common']['train.max_steps']}`.", ""]
    stab_refs, stab = fam["stability"]
    if stab:
        out += ["Stability check (N=6 at the suite's schedule before the depth rows): "
                + "; ".join(f"{r['row']}: {unstable(r) or 'trained'}"
                            for r in sorted(stab, key=lambda r: -r["config"]["train"]["lr_scale"]))
                + ".", ""]
    verdicts: list[RowVerdict] = []
    for f, title in (("main", None), ("depth", "Depth rows at their own rate")):
        f_refs, f_rows = fam[f]
        if not (f_refs or f_rows):
            continue
        if title:
            out += [f"### {title}", "", "N=6 did not train at the suite's rate, so the depth rows (N = 1, 2, 6) and a "
                    f"reference of their own (N = 3) train at a lower one ({schedule_words((f_refs or f_rows)[0])}); "
                    "they are compared only with that reference.", ""]
        lines, vs = family_table(f_refs, f_rows)
        out += lines + [""] + ([reference_words(f_refs), ""] if len(f_refs) > 1 else [])
        if len(f_refs) < 2:
            out += ["Fewer than two reference seeds: no interval, no verdict yet.", ""]
        verdicts += vs
    summary = _summary(verdicts)
    out += summary + [""] if summary else []
    better = [v.r["row"] for v in verdicts if v.p_nll is not None and v.p_nll < 0.05 and v.nll.delta < 0]
    out += [("Rows with a significantly lower validation NLL than their reference (candidates for the preset): "
             + ", ".join(better) + ".") if better else "No row has a significantly lower validation NLL than its "
            "reference.", "", _commits(refs + fam["main"][1] + fam["depth"][0] + fam["depth"][1]),
            f"Machine: {machine_words(rs)}.", ""]
    _plot_curves([r for r in rs if r.get("family") != "stability"], img / "table3_curves.png",
                 "Table 3 rows: validation perplexity", by_time=False)
    return out + ["![validation curves](img/table3_curves.png)", ""]
