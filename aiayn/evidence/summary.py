"""The report in one paragraph: which of Table 3's claims (§6.2) held at this scale, which did not, which
are inconclusive and how many more seeds would settle them; the Transformer against each family (§6.1)."""

from __future__ import annotations

import statistics

from .plan import NLL_MARGIN
from .stats import p_text, seed_test, seeds_to_settle
from .verdicts import RowVerdict, analyse, families, paper_deltas, with_repeats


def _judged(rs: list[dict]) -> list[tuple[RowVerdict, list[float]]]:
    """Every Table 3 row's verdict (main and depth families) with its reference's NLL values."""
    out = []
    for f in ("main", "depth"):
        refs, rows = families(rs)[f]
        if len(refs) >= 2 and rows:
            ref_nll = [r["valid_nll"] for r in refs]
            out += [(v, ref_nll) for v in analyse(refs, rows)]
    return out


def _settle(v: RowVerdict, ref_nll: list[float], alpha: float) -> tuple[str, int | None]:
    """How many more seeds would settle an inconclusive row at the NLL change it showed."""
    no_change = abs(paper_deltas(v.r["paper"])[0]) < NLL_MARGIN
    m = seeds_to_settle(v.nll.delta, ref_nll, NLL_MARGIN if no_change else None, alpha)
    if m is None:
        return f"{v.r['row']} more than 20 with {len(ref_nll)} reference seeds (ΔNLL {v.nll.delta:+.4f})", None
    return f"{v.r['row']} {max(m - v.nll.m, 0)}", max(m - v.nll.m, 0)


def _against(v: RowVerdict) -> str:
    """A contradicted row in words: our significant direction and the paper's claim."""
    d = paper_deltas(v.r["paper"])[0]
    paper = "no change" if abs(d) < NLL_MARGIN else ("better" if d < 0 else "worse")
    return f"{v.r['row']} (ours {'better' if v.nll.delta < 0 else 'worse'}, paper {paper})"


def _are(n: int) -> str:
    return "is" if n == 1 else "are"


def table3_words(rs: list[dict]) -> str:
    """Table 3's claims by validation NLL (the primary statistic), named, and the budget of the open ones."""
    judged = _judged(rs)
    vs = [v for v, _ in judged if v.v_nll]
    if not vs:
        return ""
    held = [v.r["row"] for v in vs if v.v_nll.reproduced is True]
    against = [_against(v) for v in vs if v.v_nll.reproduced is False]
    open_ = [(v, ref) for v, ref in judged if v.v_nll and v.v_nll.reproduced is None]
    bleu = [v.v_bleu for v in vs if v.v_bleu]
    n_open, b_open = len(open_), sum(b.reproduced is None for b in bleu)
    text = (f"Of the paper's Table 3 claims judged so far by validation NLL (the primary statistic), "
            f"**{len(held)} of {len(vs)} held** ({', '.join(held) or 'none'}), **{len(against)} did not** "
            f"({', '.join(against) or 'none'}) and **{n_open} {_are(n_open)} inconclusive** "
            f"({', '.join(v.r['row'] for v, _ in open_) or 'none'}). By BLEU, which must also pass the paired "
            f"bootstrap, {sum(b.reproduced is True for b in bleu)} held, {sum(b.reproduced is False for b in bleu)} "
            f"did not and {b_open} {_are(b_open)} inconclusive.")
    failed = [v.r["row"] for v, _ in judged if v.failed]
    if failed:
        text += f" Diverged, so not judged: {', '.join(failed)}."
    if open_:
        tested = sum(v.p_nll is not None for v, _ in judged)
        settles = [_settle(v, ref, 0.05 / tested) for v, ref in open_]
        runs = sum(k for _, k in settles if k)
        text += (" More seeds of each inconclusive row that would settle it, were its change the one it showed "
                 f"and its seeds spread as the reference's (5 % over the {tested} tested rows by Bonferroni, which "
                 "bounds Holm's correction; a no-change claim by equivalence): "
                 + "; ".join(w for w, _ in settles) + f"; in all {runs} runs of {open_[0][0].r['updates']:,} updates.")
    return text


def arch_words(rs: list[dict], tuned: bool) -> str:
    """The Transformer against each family: the first seeds' paired bootstrap, and the seeds' t test;
    `tuned`: whether the tune suite's results (the baselines' rate and clipping) are in the report."""
    groups = {g[0]["row"]: g for g in with_repeats(rs)}
    base = groups.get("transformer")
    if not base or len(groups) < 2:
        return ""
    parts = []
    for name, g in groups.items():
        if name == "transformer":
            continue
        pbs = g[0].get("paired_bs")
        part = f"{name} (valid NLL {statistics.mean(r['valid_nll'] for r in g):.4f}) " + (
            f"{-pbs['delta']:+.2f} BLEU (p {p_text(pbs['p'])})" if pbs else "no paired bootstrap yet")
        if len(g) > 1 and len(base) > 1:
            t = seed_test([r["valid_nll"] for r in g], [r["valid_nll"] for r in base])
            part += f", over {len(g)} and {len(base)} seeds ΔNLL {-t.delta:+.4f} (p {p_text(t.p)})"
        parts.append(part)
    nll = statistics.mean(r["valid_nll"] for r in base)
    return (f"The Transformer (valid NLL {nll:.4f}) against each family at the same updates, Transformer minus "
            "family (valid BLEU by sacreBLEU's paired bootstrap of the first seeds; NLL by the pooled t test where "
            "both have seeds): " + "; ".join(parts) + "." + ("" if tuned else " The baselines train at their presets' "
            "rate and clipping, not chosen on validation (the tune suite has not run; the presets' settings are in "
            "its grid), so tuned, their validation NLL can only match or beat the one shown."))


def summary_section(results: dict[str, list[dict]]) -> list[str]:
    """The report's opening summary, from the same results as its tables."""
    arch = arch_words(results.get("arch", []), "tune" in results)
    words = [w for w in (table3_words(results.get("table3", [])), arch) if w]
    return ["## Summary", "", " ".join(words), ""] if words else []
