"""The report in one paragraph: which of Table 3's claims (§6.2) held at this scale, which did not, which
are inconclusive and how many more seeds would settle them; the Transformer against each family (§6.1)."""

from __future__ import annotations

from .claims import SAME, judged
from .families import comparison_words, decoded_words, tuned_complete, tuned_words
from .plan import DESIGNS, FULL_REFERENCE_SEEDS, NLL_MARGIN
from .power import POWER, judged_count
from .stats import seeds_to_settle
from .verdicts import RowVerdict, analyse_all, families, second_seed_state, with_repeats


def _judged(rs: list[dict]) -> list[tuple[RowVerdict, list[float]]]:
    """Every Table 3 row's verdict (main and depth families, judged together) with its reference's NLL."""
    fam = families(rs)
    return [(v, [r["valid_nll"] for r in fam[f][0]]) for f, vs in analyse_all(rs).items() for v in vs]


def _settle(v: RowVerdict, ref_nll: list[float], alpha: float) -> tuple[str, int | None]:
    """How many more seeds would settle an inconclusive row, with 80 % power, at the NLL change it showed."""
    no_change = judged(v.claim, "nll") == SAME
    m = seeds_to_settle(v.nll.delta, ref_nll, NLL_MARGIN if no_change else None, alpha, power=POWER)
    if m is None:
        return f"{v.r['row']} more than 20 with {len(ref_nll)} reference seeds (ΔNLL {v.nll.delta:+.4f})", None
    if m <= v.nll.m:  # enough seeds, had they spread as the reference's: its own spread wider
        return (f"{v.r['row']} 1 or more (its {v.nll.m} seeds spread wider than the reference's, at whose spread "
                f"{m} would do)"), 1
    return f"{v.r['row']} {m - v.nll.m}", m - v.nll.m


def _against(v: RowVerdict) -> str:
    """A contradicted row in words: what ours showed and what the paper claimed."""
    claim = judged(v.claim, "nll")
    ours = ("within the margin" if claim != SAME and v.p_nll.diff >= 0.05 else
            ("better" if v.nll.delta < 0 else "worse"))
    return f"{v.r['row']} (ours {ours}, paper {claim})"


def _seed_counts(judged_rows: list[tuple[RowVerdict, list[float]]]) -> str:
    """How many seeds each family's reference has: "3" when all have as many, else "3 (main) and 2 (depth)"."""
    by = {v.r.get("family", "main"): len(ref) for v, ref in judged_rows}
    if len(set(by.values())) == 1:
        return str(next(iter(by.values())))
    return " and ".join(f"{n} ({family})" for family, n in by.items())


def _unfinished(rs: list[dict], judged_rows: list[tuple[RowVerdict, list[float]]]) -> tuple[str, str] | None:
    """Why a confirmatory suite's tally is not yet a verdict, long and short (None when it is one, or the suite
    is exploratory): its references short of FULL_REFERENCE_SEEDS seeds, or second seeds its rule picks unrun."""
    if DESIGNS.get(judged_rows[0][0].r["updates"], ("exploratory",))[0] != "confirmatory":
        return None
    if min(len(ref) for _, ref in judged_rows) < FULL_REFERENCE_SEEDS:
        counts = _seed_counts(judged_rows)
        return (f"its references have {counts} of the {FULL_REFERENCE_SEEDS} seeds its tests need",
                f"{counts} of {FULL_REFERENCE_SEEDS} reference seeds")
    once = ", ".join(row for row, _ in second_seed_state(families(rs))[1])
    return (f"the second seeds its seed rule picks ({once}) have not run", f"second seeds of {once} to run"
            ) if once else None


def _are(n: int) -> str:
    return "is" if n == 1 else "are"


def _n(n: int, verb: str) -> str:
    """"1 agrees", "2 agree"."""
    return f"{n} {verb}s" if n == 1 else f"{n} {verb}"


def _named(rows: list[str]) -> str:
    return f" ({', '.join(rows)})" if rows else ""


def _unjudged(judged_rows: list[tuple[RowVerdict, list[float]]]) -> str:
    parts = {"paper": [], "extension": [], "observation": []}
    for v, _ in judged_rows:
        if v.claim is not None and not v.v_nll and not v.failed:
            parts[v.claim.kind].append(v.r["row"])
    words = [(parts["paper"], "the paper's Δ within the margins and its text silent"),
             (parts["extension"], "ours, no Table 3 row"), (parts["observation"], "observations")]
    listed = [f"{', '.join(rows)} ({why})" for rows, why in words if rows]
    return f" Not judged: {'; '.join(listed)}." if listed else ""


def table3_words(rs: list[dict]) -> str:
    """Table 3's claims by validation NLL (the primary statistic), named, and the budget of the open ones."""
    judged_rows = _judged(rs)
    vs = [v for v, _ in judged_rows if v.v_nll]
    if not vs:
        return ""
    agree = [v.r["row"] for v in vs if v.v_nll.reproduced is True]
    against = [_against(v) for v in vs if v.v_nll.reproduced is False]
    open_ = [(v, ref) for v, ref in judged_rows if v.v_nll and v.v_nll.reproduced is None]
    bleu = [v.v_bleu for v, _ in judged_rows if v.v_bleu]
    n_open, b_open = len(open_), sum(b.reproduced is None for b in bleu)
    b_rows = {k: [v.r["row"] for v, _ in judged_rows if v.v_bleu and v.v_bleu.reproduced is k] for k in (True, False)}
    updates = vs[0].r["updates"]
    design, why = DESIGNS.get(updates, ("exploratory", "its claims were not fixed before its data"))
    unfinished = _unfinished(rs, judged_rows)
    bold = "" if unfinished else "**"
    text = (f"At {updates:,} updates on Multi30k ({design}: {why}), " + (
                f"the suite is **unfinished**: {unfinished[0]}, so what follows is where each claim stands, "
                "not a verdict. Of" if unfinished else "of")
            + f" the paper's {len(vs)} Table 3 claims on validation "
            f"NLL (the primary statistic; claims and their sources below), {bold}{_n(len(agree), 'agree')}{bold} "
            f"({', '.join(agree) or 'none'}), {bold}{_n(len(against), 'contradict')}{bold} "
            f"({', '.join(against) or 'none'}) and "
            f"{bold}{n_open} {_are(n_open)} inconclusive{bold} ({', '.join(v.r['row'] for v, _ in open_) or 'none'}). "
            f"Of its {len(bleu)} BLEU claims (a difference must also pass the paired bootstrap) "
            f"{_n(len(b_rows[True]), 'agree')}{_named(b_rows[True])}, "
            f"{_n(len(b_rows[False]), 'contradict')}{_named(b_rows[False])} and {b_open} {_are(b_open)} inconclusive.")
    text += _unjudged(judged_rows)
    failed = [v.r["row"] for v, _ in judged_rows if v.failed]
    if failed:
        text += f" Diverged, so not judged: {', '.join(failed)}."
    if open_:
        k = max(judged_count([v for v, _ in judged_rows]), 1)
        settles = [_settle(v, ref, 0.05 / k) for v, ref in open_]
        runs = sum(n for _, n in settles if n)
        text += (" More seeds of each inconclusive row that would settle it with 80 % power, were its change the one "
                 f"it showed and its seeds spread as the reference's (α 0.05/{k}, Holm's first step; a no-change "
                 "claim by equivalence): " + "; ".join(w for w, _ in settles)
                 + f"; in all {runs} runs of {open_[0][0].r['updates']:,} updates.")
    return text


def arch_words(rs: list[dict], tuned: bool) -> str:
    """Each family against the Transformer at the same updates over seeds (family minus Transformer: mean,
    Δ ± 95 % interval, p of the pooled t test; a model run once: the prediction test against the
    Transformer's seeds), validation and test alike; `tuned`: whether the tune suite's choices are in."""
    groups = {g[0]["row"]: g for g in with_repeats(rs)}
    base = groups.get("transformer")
    if not base or len(groups) < 2:
        return ""
    parts = [f"{name}, {len(g)} seed{'s' * (len(g) > 1)}: {comparison_words(g, base)}"
             for name, g in groups.items() if name != "transformer"]
    return (f"The Transformer ({len(base)} seeds: {comparison_words(base, [], ('valid NLL', 'valid BLEU'))}) against "
            f"each family at the same {base[0]['updates']:,} updates, family minus Transformer (mean, Δ ± 95 % "
            "interval, p of the pooled t test; a model run once: the prediction test against the Transformer's "
            "seeds). " + ". ".join(parts) + "." + (" The baselines here train at their presets' rate and clipping; "
            "the tune suite chooses each family's on validation." if tuned else " The baselines train at their "
            "presets' rate and clipping, not chosen on validation (the tune suite has not run)."))


def summary_section(results: dict[str, list[dict]]) -> list[str]:
    """The report's opening summary, from the same results as its tables."""
    tune = results.get("tune", [])
    decoded = decoded_words(results.get("decode", []), tune)  # the same runs, each at its own beam and alpha
    # the fair comparison; the presets' one stays until every family's seeds are in; its BLEU, decoded at
    # beam 4, alpha 0.6 for every family, gives way to each family's own decoding once that is complete
    tuned = tuned_words(tune, ("valid NLL",) if decoded else None)
    arch = "" if tuned and tuned_complete(tune) else arch_words(results.get("arch", []), "tune" in results)
    words = [w for w in (table3_words(results.get("table3", [])), arch, tuned, decoded) if w]
    return ["## Summary", "", " ".join(words), ""] if words else []


def brief(rs: list[dict]) -> str:
    """One suite's Table 3 outcome in two sentences, every ΔNLL ± its interval beside its row's name
    (docs/reproduction.md's summary is this text, generated: tests/test_readme.py)."""
    judged_rows = _judged(rs)
    vs = [v for v, _ in judged_rows if v.v_nll]
    if not vs:
        return ""
    updates, seeds = vs[0].r["updates"], min(len(ref) for _, ref in judged_rows)
    design = DESIGNS.get(updates, ("exploratory", ""))[0]
    unfinished = _unfinished(rs, judged_rows)

    def rows(k: bool | None) -> str:
        return "; ".join(f"{v.r['row']} {v.nll.delta:+.4f} ± {v.nll.pi95:.4f}" for v in vs if v.v_nll.reproduced is k)

    groups = [(True, "agree"), (False, "contradict"), (None, "inconclusive")]
    counts = [(sum(v.v_nll.reproduced is k for v in vs), word, rows(k)) for k, word in groups]
    bleu = [v.v_bleu.reproduced for v, _ in judged_rows if v.v_bleu]
    state = (f"unfinished, {unfinished[1]}: where the claims stand, not a verdict" if unfinished
             else f"{seeds} reference seeds")
    return (f"Table 3 at {updates:,} updates ({design}; {state}): of {len(vs)} claims on valid NLL (ΔNLL ± 95 % "
            "interval), " + ", ".join(f"{n} {word}" + (f" ({named})" if named else "") for n, word, named in counts)
            + f". Of {len(bleu)} BLEU claims {_n(bleu.count(True), 'agree')}, {_n(bleu.count(False), 'contradict')}.")


def readme_cell(rs: list[dict]) -> str:
    """The README's figure for one suite's Table 3 (its results-table row; tests/test_readme.py)."""
    judged_rows = _judged(rs)
    vs = [v for v, _ in judged_rows if v.v_nll]
    if not vs:
        return ""
    unfinished = _unfinished(rs, judged_rows)
    if unfinished:
        return f"unfinished: {unfinished[1]}, no verdict"
    n = [sum(v.v_nll.reproduced is k for v in vs) for k in (True, False, None)]
    return f"{len(vs)} claims on valid NLL: {n[0]} agree, {n[1]} contradict, {n[2]} open"


if __name__ == "__main__":  # docs/reproduction.md's summary from the committed result files
    import sys
    from pathlib import Path

    from ..files import read_json

    for folder in sys.argv[1:] or ["results/reproduction", "results/reproduction-5000"]:
        print(brief([read_json(f) for f in sorted(Path(folder, "table3").glob("*.json"))]))
