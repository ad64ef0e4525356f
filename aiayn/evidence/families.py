"""The families against the Transformer over seeds (§6.1, Table 2's comparison at small scale): each
model's seeds pooled, family minus Transformer by the pooled t test, with its 95 % interval, on the
validation NLL and on validation and test BLEU; the tune suite's choices (lowest validation NLL)."""

from __future__ import annotations

import math
import statistics

from .plan import diverged
from .stats import SeedTest, p_text, seed_test
from .verdicts import with_repeats

# What is compared: (label, BLEU split or None for the validation NLL, decimals)
SCORES = (("valid NLL", None, 4), ("valid BLEU", "valid", 2), ("test2016 BLEU", "test_2016_flickr", 2),
          ("test2017 BLEU", "test_2017_flickr", 2), ("test2016 NLL", "nll:test_2016_flickr", 4),
          ("test2017 NLL", "nll:test_2017_flickr", 4))  # test NLL: length-free, where a run recorded it
SCORES_TEST = ("test2016 BLEU", "test2017 BLEU")  # the sets no setting was chosen on
FLOPS = "flops"  # the family of the runs trained to the Transformer's training FLOPs (tune suite)


def score(r: dict, split: str | None) -> float | None:
    """A run's validation NLL (split None), its NLL on a test set ("nll:SET") or its BLEU on a split; None
    where it was not scored."""
    if split is None:
        return float(r["valid_nll"])
    if split.startswith("nll:"):
        nll = r.get("test_nll", {}).get(split[4:])
        return None if nll is None else float(nll)
    b = r.get("bleu", {}).get(split)
    return float(b["bleu"]) if b else None


def compare(runs: list[dict], base: list[dict]) -> dict[str, tuple[float, SeedTest | None]]:
    """Each score's mean over `runs` and the test of runs minus `base` (the Transformer's seeds; one
    run: seed_test's prediction test); the test is None with fewer than two base seeds."""
    out = {}
    for label, split, _ in SCORES:
        xs, ys = [score(r, split) for r in runs], [score(r, split) for r in base]
        if None in xs or not xs:
            continue
        ys = [y for y in ys if y is not None]
        out[label] = (statistics.mean(xs), seed_test(xs, ys) if len(ys) > 1 else None)
    return out


def comparison_words(runs: list[dict], base: list[dict], labels: tuple[str, ...] | None = None) -> str:
    """"valid NLL 1.9192 (+0.2453 ± 0.0297, p < 0.001); valid BLEU ...": mean, Δ ± 95 % interval, p."""
    parts, tests = [], compare(runs, base)
    for label, split, digits in SCORES:
        got = tests.get(label)
        if got is None or (labels and label not in labels):
            continue
        mean, t = got
        sd = [score(r, split) for r in runs]
        spread = f" (sd {statistics.stdev(sd):.{digits}f})" if len(sd) > 1 and not base else ""
        parts.append(f"{label} {mean:.{digits}f}{spread}" + (
            f" ({t.delta:+.{digits}f} ± {t.pi95:.{digits}f}, p {p_text(t.p)})" if t else "")
            + _length_words(runs, base, split))
    return "; ".join(parts)


def _length_words(runs: list[dict], base: list[dict], split: str | None) -> str:
    """Beside a BLEU: the mean brevity penalty (and the base's), and chrF (its Δ and test against the
    base) where every run recorded it, so that a BLEU difference made by output length shows."""
    if split is None or split.startswith("nll:"):
        return ""
    bp = [r["bleu"][split].get("bp") for r in runs]
    if None in bp:
        return ""
    words = f" [BP {statistics.mean(bp):.3f}"
    base_bp = [r["bleu"].get(split, {}).get("bp") for r in base]
    if base and None not in base_bp:
        words += f" against {statistics.mean(base_bp):.3f}"
    chrf = [r["bleu"][split].get("chrf") for r in runs]
    base_chrf = [r["bleu"].get(split, {}).get("chrf") for r in base]
    if None not in chrf:
        words += f"; chrF {statistics.mean(chrf):.2f}"
        if len(base) > 1 and None not in base_chrf:
            t = seed_test(chrf, base_chrf)
            words += f" ({t.delta:+.2f} ± {t.pi95:.2f}, p {p_text(t.p)})"
    return words + "]"


def seed_lines(rs: list[dict], base_name: str, heading: str) -> list[str]:
    """One line per model: its seeds' means and each against `base_name`'s seeds (family minus Transformer)."""
    groups = {g[0]["row"]: g for g in with_repeats(rs)}
    base = groups.get(base_name, [])
    out = []
    for name, g in groups.items():
        if name == base_name:
            out.append(f"- **{name}**, {len(g)} seed{'s' * (len(g) > 1)}: " + comparison_words(g, []) + ".")
        elif len(base) > 1:
            out.append(f"- **{name}**, {len(g)} seed{'s' * (len(g) > 1)}, against the {len(base)} of {base_name}: "
                       + comparison_words(g, base) + ".")
    return ["", heading, ""] + out if len(out) > 1 else []


def grid_run(r: dict) -> bool:
    """A tune grid's run (its first seed, trained to the suite's budget): not a repeat, not a -flops run."""
    return r.get("of", r["row"]) == r["row"] and r.get("family", "main") == "main"


def chosen(rs: list[dict]) -> dict[str, dict]:
    """The tune suite's choice per family: the grid run (first seed, trained to the suite's budget) with
    the lowest validation NLL; a run that diverged or ended non-finite is never chosen."""
    out: dict[str, dict] = {}
    for r in rs:
        if not grid_run(r):
            continue
        if not math.isfinite(r["valid_nll"]) or diverged(r):
            continue
        if r["group"] not in out or r["valid_nll"] < out[r["group"]]["valid_nll"]:
            out[r["group"]] = r
    return out


def tuned_groups(rs: list[dict]) -> tuple[list[dict], dict[str, list[dict]], dict[str, list[dict]]]:
    """The tune suite's chosen Transformer's seeds, and each other family's chosen seeds at equal updates
    and at the Transformer's FLOPs (the NAME-flops runs), by family."""
    groups = {g[0]["row"]: g for g in with_repeats(rs)}
    picks = chosen(rs)
    base = groups.get(picks["transformer"]["row"], []) if "transformer" in picks else []
    updates = {f: groups[r["row"]] for f, r in picks.items() if f != "transformer"}
    flops = {f: groups[f"{r['row']}-{FLOPS}"] for f, r in picks.items() if f"{r['row']}-{FLOPS}" in groups}
    return base, updates, flops


def _rate(r: dict) -> float | None:
    return (r.get("overrides") or {}).get("train.peak_lr")


def grid_edges(rs: list[dict]) -> dict[str, str]:
    """Families whose choice has the highest or the lowest peak rate their grid ran ("highest" /
    "lowest"): a choice at an edge is the best of the grid, and the best rate may lie beyond it."""
    out = {}
    for f, pick in chosen(rs).items():
        rates = {_rate(r) for r in rs if r["group"] == f and grid_run(r)} - {None}
        if len(rates) > 1 and _rate(pick) in (max(rates), min(rates)):
            out[f] = "highest" if _rate(pick) == max(rates) else "lowest"
    return out


def _edge_words(rs: list[dict]) -> str:
    edges = grid_edges(rs)
    if not edges:
        return ""
    return (" At an edge of its grid's peak rates: " + ", ".join(f"{f} ({e})" for f, e in sorted(edges.items()))
            + ": the best rate may lie beyond the grid, so such a choice is the best of this grid, not an optimum.")


def tuned_lines(rs: list[dict]) -> list[str]:
    """The tune section's comparison: the choices, then over seeds at equal updates and equal FLOPs."""
    picks = chosen(rs)
    if not picks:
        return []
    ran = {f: sum(1 for r in rs if r["group"] == f and grid_run(r)) for f in picks}
    out = ["", "Each family's choice (lowest validation NLL of its grid, one seed a setting; the settings run so "
           "far): " + "; ".join(f"{f} **{r['row']}** ({r['valid_nll']:.4f}; of {ran[f]})"
                                for f, r in sorted(picks.items())) + "." + _edge_words(rs)]
    base, updates, flops = tuned_groups(rs)
    if len(base) < 2:
        return out
    out += ["", f"At the choices, over seeds (family minus the Transformer's {len(base)} seeds of "
            f"{base[0]['row']}: mean, Δ ± 95 % interval of the difference, p of the pooled t test):", "",
            f"- **{base[0]['row']}** (Transformer), {len(base)} seeds: {comparison_words(base, [])}."]
    for f, g in sorted(updates.items()):
        out.append(f"- **{g[0]['row']}** ({f}), {len(g)} seed{'s' * (len(g) > 1)}, {g[0]['updates']:,} updates: "
                   f"{comparison_words(g, base)}.")
    for f, g in sorted(flops.items()):
        out.append(f"- **{g[0]['row']}** ({f} at the Transformer's training FLOPs), {len(g)} seed{'s' * (len(g) > 1)}, "
                   f"{g[0]['updates']:,} updates: {comparison_words(g, base)}.")
    return out


def tuned_complete(rs: list[dict]) -> bool:
    """Whether every family's choice has as many seeds as the Transformer's (the tune suite's seeds are in)."""
    base, updates, _ = tuned_groups(rs)
    return len(base) > 1 and bool(updates) and all(len(g) >= len(base) for g in updates.values())


def tuned_words(rs: list[dict], labels: tuple[str, ...] | None = None) -> str:
    """The summary's sentence on the families, from the tune suite's choices and their seeds (`labels`: the
    scores it gives, all when None)."""
    base, updates, flops = tuned_groups(rs)
    seeded = {f: g for f, g in updates.items() if len(g) > 1}
    if len(base) < 2 or not seeded:
        return ""
    waiting = sorted(f for f, g in updates.items() if len(g) < len(base))  # their seeds not all in yet
    parts = [f"{f}, {len(g)} seeds: {comparison_words(g, base, labels)}" for f, g in sorted(seeded.items())]
    parts += [f"{f} at the Transformer's training FLOPs ({g[0]['updates']:,} updates), {len(g)} seeds: "
              f"{comparison_words(g, base, labels)}"
              for f, g in sorted(flops.items()) if len(g) > 1]
    return (f"Every family tuned on validation (peak rate × clipping, one seed a setting) and run with seeds at its "
            f"choice, family minus the Transformer ({base[0]['row']}, {len(base)} seeds; mean, Δ ± 95 % interval, "
            f"p of the pooled t test) at {base[0]['updates']:,} updates on Multi30k. " + ". ".join(parts) + "."
            + (f" Seeds still to come: {', '.join(waiting)}." if waiting else "") + _edge_words(rs))


def _decoded_cell(r: dict, split: str) -> str:
    """A decode-suite run's BLEU on a split at its tuned setting (BP), then at beam 4, α 0.6."""
    tuned, paper = r["bleu"].get(split), r.get("bleu_paper", {}).get(split)
    if not tuned:
        return "–"
    return f"{tuned['bleu']:.2f} ({tuned['bp']:.2f})" + (f" / {paper['bleu']:.2f} ({paper['bp']:.2f})" if paper else "")


def decoded_section(rs: list[dict], tune: list[dict]) -> list[str]:
    """The decode suite: the tune suite's compared runs trained again, each decoded at the beam and α
    chosen on its validation set; their BLEU beside §6.1's setting, and the comparison over seeds."""
    rs = sorted(rs, key=lambda r: (r["group"] != "transformer", r["row"]))
    tune_nll = {r["row"]: r["valid_nll"] for r in tune}
    grid = rs[0].get("decode", {}).get("tuned", {}).get("points", [])
    beams, alphas = sorted({p["beam"] for p in grid}), sorted({p["alpha"] for p in grid})
    out = ["## Every family decoded at the beam and α chosen on its own validation set", "",
           "The runs the tune suite compares (each family's choice, its seeds, its runs at the Transformer's "
           "training FLOPs) trained again from their configs and seeds, then each decoded at the beam × α of "
           f"`aiayn tune`'s grid (beams {', '.join(map(str, beams))} × α {', '.join(f'{a:g}' for a in alphas)}) "
           "with the best validation BLEU (§6.1: \"chosen after experimentation on the development set\"), as the "
           "main job's model is: no family's BLEU is set by a length penalty chosen for another. Validation is the "
           "set the setting was chosen on (its BLEU is optimistic); the test sets were not read. Made by "
           "`aiayn reproduce --suite decode`.", "",
           "| run | family | beam, α | valid NLL (tune suite's) | valid BLEU (BP) tuned / b4 α 0.6 | "
           "test2016 | test2017 |", "|---|---|---|--:|--:|--:|--:|"]
    for r in rs:
        d = r.get("decode", {})
        again = f" ({tune_nll[r['row']]:.4f})" if r["row"] in tune_nll else ""
        out.append(f"| {r['row']} | {r['group']} | {d.get('beam')}, {d.get('alpha')} | {r['valid_nll']:.4f}{again} | "
                   f"{_decoded_cell(r, 'valid')} | {_decoded_cell(r, 'test_2016_flickr')} | "
                   f"{_decoded_cell(r, 'test_2017_flickr')} |")
    same = [abs(r["valid_nll"] - tune_nll[r["row"]]) for r in rs if r["row"] in tune_nll]
    if same:
        within = "exactly" if max(same) == 0 else f"within {max(same):.2g} nats"
        out += ["", f"Trained again, {len(same)} runs reach the tune suite's validation NLL {within} "
                "(training is deterministic; a difference is another processor's arithmetic)."]
    base, updates, flops = tuned_groups(rs)
    if len(base) > 1:
        out += ["", f"Over seeds at the tuned settings (family minus the Transformer's {len(base)} seeds of "
                f"{base[0]['row']}: mean, Δ ± 95 % interval of the difference, p of the pooled t test):", "",
                f"- **{base[0]['row']}** (Transformer), {len(base)} seeds: {comparison_words(base, [])}."]
        for at, groups in (("", updates), (" at the Transformer's training FLOPs", flops)):
            out += [f"- **{g[0]['row']}** ({f}{at}), {len(g)} seed{'s' * (len(g) > 1)}, {g[0]['updates']:,} updates: "
                    f"{comparison_words(g, base)}." for f, g in sorted(groups.items())]
    return out + [""]


def decoded_complete(rs: list[dict], tune: list[dict]) -> bool:
    """Whether the decode suite holds every family's seeds at equal updates and every run at the
    Transformer's FLOPs that the tune suite has."""
    _, _, flops = tuned_groups(rs)
    _, _, planned = tuned_groups(tune)
    return tuned_complete(rs) and all(len(flops.get(f, [])) >= len(g) for f, g in planned.items())


def decoded_words(rs: list[dict], tune: list[dict]) -> str:
    """The summary's sentence on the families at their own tuned decoding (the decode suite's), test BLEU
    at equal updates and at the Transformer's training FLOPs, once every run the tune suite compares is in."""
    if not decoded_complete(rs, tune):
        return ""
    base, updates, flops = tuned_groups(rs)
    parts = [f"{f}, {len(g)} seeds: {comparison_words(g, base, SCORES_TEST)}" for f, g in sorted(updates.items())]
    parts += [f"{f} at the Transformer's training FLOPs ({g[0]['updates']:,} updates), {len(g)} seeds: "
              f"{comparison_words(g, base, SCORES_TEST)}" for f, g in sorted(flops.items())]
    return (f"Each family decoded at the beam and α chosen on its own validation set (the decode suite), family "
            f"minus the Transformer ({base[0]['row']}, {len(base)} seeds): " + ". ".join(parts) + ".")


def families_cell(decode: list[dict], tune: list[dict]) -> str:
    """The README's figure for the families at their own tuned decoding: test BLEU, family minus the
    Transformer, Δ ± 95 % interval for test2016 / test2017 (tests/test_readme.py); "" before the tune suite."""
    base, updates, flops = tuned_groups(tune)
    planned = len(base) + sum(map(len, updates.values())) + sum(map(len, flops.values()))
    if not planned:
        return ""
    if not decoded_complete(decode, tune):
        return f"unfinished: {len(decode)} of {planned} runs, no comparison"
    base, updates, flops = tuned_groups(decode)

    def deltas(g: list[dict]) -> str:
        tests = compare(g, base)
        return " / ".join(f"{t.delta:+.2f} ± {t.pi95:.2f}" for t in (tests[k][1] for k in SCORES_TEST))

    named = sorted(updates.items()) + [(f"{f} at equal FLOPs", g) for f, g in sorted(flops.items())]
    return (f"test2016 / test2017 BLEU minus the Transformer, {len(base)} seeds each: "
            + "; ".join(f"{name} {deltas(g)}" for name, g in named))
