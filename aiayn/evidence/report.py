"""The reproduction report (REPORT.md and its plots), rendered only from the suites' result files.

Sections: the update budget (budget suite), Table 3 (verdicts.py), the architecture families
(arch and tune suites) and Table 1. Re-rendering never trains, and no number is typed by hand:
every figure, setting and plot parameter is read from results/.
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any

from ..files import atomic_write, read_json
from .curves import curve_section
from .families import chosen, decoded_section, seed_lines, tuned_lines
from .figures import plot_bleu_params, plot_budget, plot_schedule, plot_suite_curves, plot_table1
from .machine import compute_section, coverage_lines, machine_words
from .plan import converged_at, diverged
from .stats import p_text
from .summary import summary_section
from .table1 import path_length, quadratic_fit, sequential_steps
from .verdicts import commits_words, data_words, schedule_words, table3_section


def is_report(folder: Path) -> bool:
    """A folder this report writes into: REPORT.md, img/, results/ (and a README), nothing else."""
    return all(p.name in ("REPORT.md", "README.md", "img", "results") for p in folder.iterdir())


RESULT_FOLDERS = ("budget", "table3", "arch", "tune", "decode", "table1", "heads", "parse", "ensemble")


def is_results(folder: Path) -> bool:
    """A results folder the suites write into: one folder per suite (and a README), nothing else."""
    return all(p.name == "README.md" or (p.is_dir() and p.name in RESULT_FOLDERS) for p in folder.iterdir())


def load_results(results: Path) -> dict[str, list[dict[str, Any]]]:
    """Every row's result, by suite (results/SUITE/ROW.json; the throughput and table1 files aside)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(results).glob("*/*.json")):  # a damaged one is one line, never a row left out
        out.setdefault(path.parent.name, []).append(read_json(path, fix="restore it (git checkout) or re-run its row"))
    return out


def _test_bleu(r: dict, split: str = "test_2016_flickr") -> str:
    b = r["bleu"].get(split)
    return f"{b['bleu']:.2f}" if b else "–"


def _fmt_machine(rs: list[dict]) -> str:
    """Each machine the runs ran on (CPU family, model and class where recorded); with several, the
    runs of each; a run resumed on another processor is named with each it trained on."""
    seen: dict[str, list[str]] = {}
    for r in rs:
        m = r.get("machine", {})
        desc = f"{machine_words(m)} ({r.get('device', '?')}, {m.get('threads', '?')} threads, " \
               f"torch {m.get('torch', '?')})"
        seen.setdefault(desc, []).append(r.get("row", "?"))
    moved = [f"{r.get('row', '?')} trained on {' then '.join(r['trained_on'])}" for r in rs
             if len(r.get("trained_on") or []) > 1]
    moved_words = f" (resumed on another machine: {'; '.join(moved)})" if moved else ""
    if len(seen) < 2:
        return ("; ".join(seen) or "–") + moved_words
    return "; ".join(f"{d}: {', '.join(rows)}" for d, rows in seen.items()) + moved_words


def budget_section(rs: list[dict], img: Path) -> list[str]:
    """How the suites' update budget was chosen: the reference's own validation curve."""
    r = rs[0]
    curve = [(int(c[0]), math.log(c[1])) for c in r["curve"]]
    at = converged_at(curve)
    out = ["## The update budget", "",
           f"The `{r['preset']}` reference trained {r['updates']:,} updates ({schedule_words(r)}), validated every "
           f"{r['common']['train.valid_every']} updates. The budget is the first update from which the validation "
           "NLL improves by less than 2 % over every further 10 % of updates: "
           + (f"**{at:,} updates** (NLL {dict(curve)[at]:.3f})." if at else "not reached within this run.")
           + " Its best validation NLL: {:.3f} at update {:,}.".format(*min((v, s) for s, v in curve))
           + " Every suite trains that many updates (`--steps`, default in `aiayn/evidence/plan.py`).", "",
           "Made by `aiayn reproduce --suite budget --steps " f"{r['common']['train.max_steps']}` at commit "
           f"{(r.get('machine', {}).get('git') or 'not recorded')[:7]}.", ""]
    plot_budget(curve, at, img / "budget.png")
    return out + ["![budget](img/budget.png)", ""]


def _at_compute(r: dict, ref: dict, cost: dict[str, float] | None = None) -> str:
    """Validation PPL of r at the compute the reference spent, read from r's curve: by default
    training FLOPs (same batches: FLOPs per token × updates); with `cost` (row → measured seconds per
    update), training time. '–' when that lies beyond r's run or the cost is unknown."""
    if cost is None:
        target = ref["updates"] * ref["flops_per_token"] / r["flops_per_token"]
    elif r["row"] in cost and ref["row"] in cost:
        target = ref["updates"] * cost[ref["row"]] / cost[r["row"]]
    else:
        return "–"
    curve = [(c[0], c[1]) for c in r.get("curve", [])]
    if curve and target < curve[0][0]:
        return f"– (at update {target:,.1f}, before the first validation)"
    for (s0, p0), (s1, p1) in zip(curve, curve[1:]):
        if s0 <= target <= s1:
            return f"{math.exp(math.log(p0) + (math.log(p1) - math.log(p0)) * (target - s0) / (s1 - s0)):.2f}" \
                   f" @ {target:,.0f}"
    return f"– (needs {target:,.0f})"


def arch_section(rs: list[dict], throughput: dict | None, img: Path, suite: str = "arch") -> list[str]:
    """The families at one update budget, at equal compute, and their clean throughput."""
    rs = sorted(rs, key=lambda r: (r["group"] != "transformer", r["row"]))
    ref = chosen(rs).get("transformer", rs[0]) if suite == "tune" else next(
        (r for r in rs if r["row"] == "transformer"), rs[0])  # tune: the Transformer's choice
    tp = (throughput or {}).get("models", {})
    title = ("## Transformer, recurrent and convolutional models (Table 2's comparison at small scale)"
             if suite == "arch" else "## Every family's rate and clipping, chosen on validation; seeds at its choice")
    flops = sorted({(r.get("of") or r["row"], r["updates"]) for r in rs if r.get("family") == "flops"})
    longer = (" (" + ", ".join(f"{name} {n:,}" for name, n in flops) + ": to the Transformer's training FLOPs)"
              if flops else "")
    out = [title, "", f"Every model trains {ref['updates']:,} updates{longer} on {data_words(ref)}, the same batches, "
           "checkpoints at the same "
           "spacing, the last 5 averaged, beam 4, α 0.6. Training FLOPs per target token count one forward and "
           "backward step (PyTorch's FlopCounterMode); *at equal FLOPs* reads each model's validation PPL at the "
           f"FLOPs the {ref['row']} row spent, *at equal time* at its training seconds (clean seconds per update × "
           "updates). Seconds per update are measured apart, on the same batches in interleaved rounds, so a busy "
           "machine cannot bias one model.", "",
           f"Made by `aiayn reproduce --suite {suite}`.", "",
           "| model | architecture | schedule | params | FLOPs / tok | s / update / tgt tok/s (clean) | valid PPL | "
           "PPL at equal FLOPs (@ update) | PPL at equal time (@ update) | valid BLEU (BP) | "
           "paired bootstrap ΔBLEU (p) | test2016 | test2017 |", "|---|---|---|" + "--:|" * 10]
    secs = {name: m["s_per_update"] for name, m in tp.items()}
    secs.update({r["row"]: secs[r["of"]] for r in rs if r.get("of") in secs})  # seeds: the same model
    for r in rs:
        b, pbs = r["bleu"].get("valid", {}), r.get("paired_bs")
        s_up = f"{tp[r['row']]['s_per_update']:.3f} / {tp[r['row']]['tgt_tok_s']:,.0f}" if r["row"] in tp else "–"
        out.append(f"| {r['row']} | {r['change']} | {schedule_words(r)} | {r['params'] / 1e6:.2f}M | "
                   f"{r['flops_per_token'] / 1e6:.1f}M | {s_up} | {r['valid_ppl']:.3f} | {_at_compute(r, ref)} | "
                   f"{_at_compute(r, ref, secs)} | "
                   f"{b.get('bleu', float('nan')):.2f} ({b.get('bp', 0):.2f}) | "
                   + (f"{pbs['delta']:+.2f} ({p_text(pbs['p'])})" if pbs else "–")
                   + f" | {_test_bleu(r)} | {_test_bleu(r, 'test_2017_flickr')} |")
    failed = [f"{r['row']} ({diverged(r).removeprefix('diverged: ')})" for r in rs if diverged(r)]
    out += ["", f"Diverged{', so never a choice' * (suite == 'tune')}: {'; '.join(failed)}."] if failed else []
    reused = [f"{r['row']} is {r['reused']}" for r in rs if r.get("reused")]
    out += ["", f"The same training (config, data, commit) was run once and counted twice: {'; '.join(reused)}."] \
        if reused else []
    out += tuned_lines(rs) if suite == "tune" else seed_lines(
        rs, "transformer", "Over seeds (family minus Transformer: mean, Δ ± 95 % interval of the difference, p of "
        "the pooled t test; a model run once: the prediction test against the Transformer's seeds):")
    if throughput:
        out += ["", f"Throughput: {throughput['updates']} updates × {throughput['rounds']} rounds, "
                f"{throughput['tgt_tokens_per_update']:.0f} target tokens per update, {throughput['precision']}."]
    out += ["", f"Machine: {_fmt_machine(rs)}.", "", commits_words(rs), ""]
    plot_suite_curves(rs, img / f"{suite}_curves.png", "Validation perplexity against updates", by_time=False)
    return out + [f"![validation curves](img/{suite}_curves.png)", ""]


def test_nll_lines(rs: list[dict]) -> list[str]:
    """§6.2's measure on the test sets too, for the rows that recorded it (rows evaluated since it was
    recorded; nothing where none did)."""
    rows = sorted((r for r in rs if r.get("test_nll")), key=lambda r: (r.get("group") != "ref", r["row"]))
    if not rows:
        return []
    splits = sorted({s for r in rows for s in r["test_nll"]})
    out = ["Test-set NLL per token (references force-decoded by the averaged model; never used for a choice):", "",
           "| row | valid NLL | " + " | ".join(splits) + " |", "|---|--:|" + "--:|" * len(splits)]
    for r in rows:
        cells = [f"{r['test_nll'][s]:.4f}" if s in r["test_nll"] else "–" for s in splits]
        out.append(f"| {r['row']} | {r['valid_nll']:.4f} | " + " | ".join(cells) + " |")
    return out + [""]


def _poly(a: float, b: float, c: float) -> str:
    """a·n² + b·n + c with its signs written once (no "+ -")."""
    def term(x: float, fmt: str) -> str:
        return f"{'-' if x < 0 else '+'} {abs(x):{fmt}}"
    return f"{a:.2e}·n² {term(b, '.2e')}·n {term(c, '.2f')}"


def table1_section(t1: dict, img: Path) -> list[str]:
    top = max(t1["ns"])
    mid = t1["d"] if t1["d"] in t1["ns"] else t1["ns"][len(t1["ns"]) // 2]
    out = ["## Table 1: cost of one layer against sequence length", "",
           f"One layer of each type at d = {t1['d']}, batch {t1['batch']}, n = {min(t1['ns'])} … {max(t1['ns'])}; "
           f"forward + backward time (median of {t1['repeats']}, more repeats at small n), activation memory saved "
           "for the backward pass; and two columns that are **formulas, not measurements**: sequential steps "
           "(operations that must wait for the previous one) and the maximum path length between positions 0 and "
           "n - 1 (the formula's hops are checked in the tests against the depth at which autograd first connects "
           f"the two positions in a stack of the layer). Slopes are fitted on log-log for n ≥ {t1['fit_from']}; a "
           "log-log slope mixes terms, so the "
           "time is also fitted as a·n² + b·n + c over every n (relative least squares) and the n² term's share of "
           f"the time at n = {top} is shown. Made by `aiayn reproduce --suite table1`.", "",
           f"| layer | Table 1: complexity / sequential / path | ms at n={mid} | ms at n={top} | time slope | "
           f"a·n² + b·n + c (ms) | n² share at n={top} | memory slope | sequential steps at n={top} (formula) | "
           f"path length at n={top} (formula) |", "|---|---|--:|--:|--:|---|--:|--:|--:|--:|"]
    i_mid, i_top = t1["ns"].index(mid), t1["ns"].index(top)
    for name, L in t1["layers"].items():
        a, b, c = quadratic_fit(t1["ns"], L["time_ms"])
        share = a * top ** 2 / (a * top ** 2 + b * top + c)
        share_text = f"{share:.0%}" if a >= 0 else "none (a < 0)"  # a negative a: the fit found no n² term
        out.append(f"| {name} | {L['paper']} | {L['time_ms'][i_mid]:.1f} | {L['time_ms'][i_top]:.1f} | "
                   f"{L['slope_time']:.2f} | {_poly(a, b, c)} | {share_text} | {L['slope_memory']:.2f} | "
                   f"{sequential_steps(name, top)} | {path_length(name, top)} |")  # counted, not measured
    out += ["", f"Table 1's point in numbers: a self-attention layer costs n²·d against the recurrent layer's n·d², "
            f"so it is the cheaper one while n < d (here d = {t1['d']}; at n = {mid} it takes "
            f"{t1['layers']['self-attention']['time_ms'][i_mid]:.1f} ms against "
            f"{t1['layers']['recurrent (LSTM)']['time_ms'][i_mid]:.1f} ms), and it needs one sequential step "
            f"where the recurrence needs n. At n ≈ d the layer's 4·n·d² projections still outweigh its 2·n²·d "
            "attention, so its log-log slope sits between 1 and 2: that is what O(n²·d) predicts there, not a "
            "different complexity; the attention core alone (when measured) shows the n² term. The fused SDPA "
            "kernel's memory grows linearly because it never stores the n×n weights (a property of the kernel), "
            "while its time keeps the n² term."]
    load = t1.get("load_average")
    seen = (f" Load average (1, 5, 15 min) when the measurement started: {', '.join(f'{x:.2f}' for x in load['start'])}"
            f"; when it ended: {', '.join(f'{x:.2f}' for x in load['end'])} (this machine has "
            f"{t1['machine'].get('threads', '?')} threads; a load near or above that means other work shared it)."
            if load else " The load average was not recorded.")
    out += ["", f"Machine: {t1['machine'].get('gpu') or t1['machine'].get('cpu')} ({t1['device']}).{seen}", "",
            "![Table 1 costs](img/table1.png)", ""]
    plot_table1(t1, img / "table1.png")
    return out


def _where(t: list[list[float]], best=max) -> tuple[float, str]:
    """The extreme value of a (layers, h) table and where it is, as 'L2 H3'."""
    v, i, j = best((v, i, j) for i, row in enumerate(t) for j, v in enumerate(row))
    return v, f"L{i + 1} H{j + 1}"


def _step_noise(r: dict) -> float:
    """Median |ΔBLEU| between neighbouring steps of the first ten of the importance-order curve."""
    c = [row["bleu"] for row in r["pruning"]["importance"][:11]]
    return statistics.median(abs(a - b) for a, b in zip(c, c[1:])) if len(c) > 1 else 0.0


def _pruning_words(r: dict, n_heads: int) -> str:
    """The pruning bullet: heads that go at <= 0.5 BLEU, and the importance order against the random
    orders' 95 % range (results of the older protocol, one random order, say so)."""
    imp, k = r["pruning"]["importance"], r["removable_at_0.5_bleu"]["importance"]
    end = (f"with one head left per attention (the curve's end) NLL is {imp[-1]['nll']:.2f} and BLEU "
           f"{imp[-1]['bleu']:.1f}.")
    band = r["pruning"].get("random_band")
    if not band:
        return (f"- **Pruning** (older protocol: heads ranked and measured on the same sentences, one random order "
                f"as the control): {k} of {n_heads} heads go at a cost of at most 0.5 BLEU when removed least "
                f"important first, {r['removable_at_0.5_bleu']['random']} in the random order; {end}")
    nll = {x["removed"]: x["nll"] for x in imp}
    inner = [b for b in band if 0 < b["removed"] < imp[-1]["removed"]]
    mid = inner[len(inner) // 2] if inner else band[-1]
    below = sum(nll[b["removed"]] < b["lo"] for b in inner)
    return (f"- **Pruning** ({r['split']}): {k} of {n_heads} heads go at a cost of at most 0.5 BLEU when removed "
            f"least important first. With {mid['removed']} removed, NLL is {nll[mid['removed']]:.3f} against "
            f"{len(r['pruning']['random'])} random orders' {mid['median']:.3f} (95 % range {mid['lo']:.3f}-"
            f"{mid['hi']:.3f}); the importance order lies below the random range at {below} of {len(inner)} "
            f"counts between the first and the last; {end}")


def heads_section(rs: list[dict]) -> list[str]:
    """Figures 3-5, measured: `aiayn heads` results (results/heads/NAME.json, pictures beside in img/)."""
    out = ["## Figures 3-5, measured: what the heads do", "",
           "The paper shows attention maps and reads syntax and anaphora into some heads (§6, Figures 3-5). "
           "`aiayn heads` measures instead, on the validation split only: each head's importance (validation NLL "
           "with the head removed; Michel et al.'s gradient proxy beside it), role statistics per head, and the "
           "pruning curve (heads removed least important first; random orders as the control).", ""]
    for r in rs:
        name = r.get("name", Path(r["checkpoint"]).stem)
        full = r["pruning"]["importance"][0]
        n_heads = sum(len(t) * len(t[0]) for t in r["ablation"].values())
        out += [f"### {name}", "", f"{r.get('about', r['checkpoint'])}. Validation NLL {r['valid_nll']:.4f}, "
                f"beam-4 BLEU {full['bleu']:.2f} on the first {r['bleu_sentences']} validation sentences"
                f"{' of the odd-numbered half' if r.get('split') else ''}.", "",
                _pruning_words(r, n_heads) + f" BLEU on {r['bleu_sentences']} sentences moves by "
                f"{_step_noise(r):.2f} (median) between neighbouring steps of the first ten, so read the NLL curve "
                "for the trend.",
                f"- **Importance**: the rank correlation of ablation and gradient importance is "
                f"{r['spearman_ablation_gradient']:.2f} (Spearman, {n_heads} heads). Most important: "
                + ", ".join(f"{sub} {_where(t)[1]} (+{_where(t)[0]:.3f} nats)" for sub, t in r["ablation"].items())
                + "."]
        roles = r["roles"]
        found = [("encoder_self", "previous", "attends to the previous token"),
                 ("encoder_self", "next", "attends to the next token"), ("cross", "sink", "rests on EOS/punctuation"),
                 ("encoder_self", "rare_word", "attends to the rarest word"),
                 ("decoder_self", "current", "attends to the current token")]
        out += ["- **Roles** (mean attention share over "
                f"{r['role_sentences']} sentences; the strongest head of each): "
                + "; ".join(f"{sub} {_where(roles[sub][role])[1]} {words} ({_where(roles[sub][role])[0]:.2f})"
                            for sub, role, words in found if role in roles.get(sub, {})) + "."]
        syn = r.get("syntactic")
        if syn:
            v, at = _where(syn["accuracy"])
            out += [f"- **Syntax**: the encoder head that best finds each word's dependency head ({at}) does so for "
                    f"{v:.1%} of {syn['arcs']:,} arcs of the Penn Treebank sample's development trees (head rules); "
                    f"always guessing the word {syn['baseline_offset']:+d} away gets {syn['baseline_accuracy']:.1%}."]
        # the pictures are `aiayn heads`'s own (importance.png, ...), copied beside the report's as img/heads-NAME-*.png
        kinds = ("importance", "pruning", "roles") + (("examples",) if r.get("examples") else ())
        out += [""] + [f"![{name} {kind}](img/heads-{name}-{kind}.png)" for kind in kinds]
        out += [""]
    return out


def _progress(results: dict[str, list[dict]], planned: dict[str, int], table1: Path) -> str:
    """Rows done of rows planned per suite; Table 3's second seeds (as many as the seed rule asks) apart."""
    done = {}
    for s in ("table3", "arch", "tune"):
        rs = results.get(s, [])
        extra = [r for r in rs if s == "table3" and r.get("of", r["row"]) != r["row"]]
        n = len(rs) - len(extra)
        done[s] = "not run" if not rs else (f"{n} of {planned[s]} rows" if s in planned else f"{n} rows") + (
            f" (+{len(extra)} second seed{'s' * (len(extra) > 1)})" if extra else "")
    t1 = "done" if table1.is_dir() and any(table1.glob("*.json")) else "not run"
    decode = (f"decode {len(results['decode'])} of {planned['decode']} rows, " if "decode" in planned else
              f"decode {len(results['decode'])} rows, ") if results.get("decode") else ""  # said once it has run
    return (f"Progress: budget {'done' if 'budget' in results else 'not run'}, table3 {done['table3']}, "
            f"arch {done['arch']}, tune {done['tune']}, {decode}table1 {t1}. "
            "A suite resumes where it stopped when its command is run again.")


def render(report_dir: Path, command: str = "", planned: dict[str, int] | None = None, seeds: int = 5,
           rows: list[str] | None = None, results_dir: Path | None = None, locations: str = "") -> Path:
    """Write REPORT.md and img/*.png in report_dir from RESULTS_DIR/*/*.json (default
    report_dir/results; the report names it relative to itself); `planned`: the number of rows each
    suite has (passed in by the suites, which this module does not import), for Table 3's `seeds`
    reference seeds and its run's `rows` (named in the commands when not the defaults); `locations`:
    the --report/--results flags its re-render command needs where they are not the defaults."""
    report_dir = Path(report_dir)
    results_dir = Path(results_dir) if results_dir is not None else report_dir / "results"
    where = Path(os.path.relpath(results_dir.resolve(), report_dir.resolve())).as_posix()
    results = load_results(results_dir)
    img = report_dir / "img"
    flags = f" --seeds {seeds}" * (seeds != 5) + (f" --rows {','.join(rows)}" if rows else "")
    rerender = "aiayn reproduce --suite table3 --render-only" + flags + locations
    out = ["# Reproducing *Attention Is All You Need* at small scale", "",
           f"Generated by `aiayn reproduce` from the result files in `{where}/` (one JSON per run, the hypotheses "
           f"beside it); re-render with `{rerender}`. BLEU is sacreBLEU on detokenized, cased text (signature "
           "below), not the paper's tokenized BLEU, and Multi30k is not WMT14: compare directions, not values.", ""]
    out += [_progress(results, planned or {}, results_dir / "table1"), ""]
    if command and "--render-only" not in command:
        out += [f"Last command: `{command}`", ""]
    out += summary_section(results)
    if "budget" in results:
        out += budget_section(results["budget"], img)
    if "table3" in results:
        out += table3_section(results["table3"], img, _fmt_machine, seeds, rows)
        checks = results_dir.parent / "machine-test" / "checks.json"  # beside the suites' folders, where kept
        out += coverage_lines(results["table3"], read_json(checks)["checks"]) if checks.exists() else []
        out += test_nll_lines(results["table3"]) + curve_section(results["table3"])
    for suite in ("arch", "tune"):
        if suite in results:
            tp = results_dir / suite / "throughput" / "throughput.json"
            out += arch_section(results[suite], read_json(tp) if tp.exists() else None, img, suite)
    if "decode" in results:
        out += decoded_section(results["decode"], results.get("tune", [])) + [commits_words(results["decode"]), ""]
    if "heads" in results:
        out += heads_section(results["heads"])
    t1_files = sorted((results_dir / "table1").glob("*.json")) if results_dir.exists() else []
    if t1_files:
        out += table1_section(read_json(t1_files[0]), img)
    trained = [r for s in ("table3", "arch") for r in results.get(s, []) if r.get("family") != "stability"]
    if trained:
        plot_bleu_params(results, img / "bleu_params.png")
        out += ["## BLEU against parameters", "", "![BLEU vs parameters](img/bleu_params.png)", ""]
        schedules = {schedule_words(r): r for r in trained if r.get("config")}
        plot_schedule(img / "schedule.png", [(k, r["config"]) for k, r in schedules.items()])
        out += ["## The learning-rate schedules (Eq. 3)", "",
                "The paper's base schedule beside each schedule the rows above trained with (from their configs).", "",
                "![Eq. 3](img/schedule.png)", "", f"sacreBLEU signature: `{trained[0].get('signature', '?')}`", ""]
    out += compute_section(results)
    if not trained and not t1_files and "budget" not in results:
        out += ["No suite has finished a run yet.", ""]
    path = report_dir / "REPORT.md"
    atomic_write(path, "\n".join(out).encode())
    return path
