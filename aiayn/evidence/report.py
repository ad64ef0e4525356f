"""The reproduction report (REPORT.md and its plots), rendered only from the suites' result files.

Verdicts compare the sign of our change against the reference row with the paper's (Table 3),
on validation scores only; a change smaller than the spread of the reference row's seeds is
"within noise". Re-rendering never trains, and no number is typed by hand.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from ..files import atomic_write
from .figures import _plot_bleu_params, _plot_curves, _plot_schedule, _plot_table1, _valid_bleu

PAPER_BLEU_STEP = 0.2  # Table 3 prints one decimal: smaller BLEU changes count as "no change"
PAPER_PPL_STEP = 0.05  # and two decimals for perplexity


def is_report(folder: Path) -> bool:
    """A folder this report writes into: REPORT.md, img/, results/ (and a README), nothing else."""
    return all(p.name in ("REPORT.md", "README.md", "img", "results") for p in folder.iterdir())


def load_results(results: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(results).glob("*/*.json")):
        try:
            out.setdefault(path.parent.name, []).append(json.loads(path.read_text()))
        except json.JSONDecodeError:
            continue
    return out


def _sign(x: float, step: float) -> int:
    # The paper's values have one or two decimals: 26.0 - 25.8 is 0.2 (a change), not 0.19999…
    return 0 if abs(x) < step - 1e-9 else (1 if x > 0 else -1)


def verdict(ours: float, noise: float | None, paper: float, paper_step: float, higher_is_better: bool) -> str:
    """Direction of our change vs the paper's: reproduced / not reproduced / within noise."""
    if noise is None:
        return "no noise estimate"
    p = _sign(paper, paper_step)
    o = 0 if abs(ours) <= noise else (1 if ours > 0 else -1)
    word = {1: "better", -1: "worse", 0: "no change"}
    good = 1 if higher_is_better else -1
    if p == 0 and o == 0:
        return "reproduced (no change)"
    if o == 0:
        return f"within noise (paper: {word[p * good]})"
    if p == 0:
        return f"not reproduced (ours {word[o * good]}, paper: no change)"
    return "direction reproduced" if o == p else f"not reproduced (ours {word[o * good]})"


def diverged(r: dict, factor: float = 2.0) -> str | None:
    """A run whose final validation perplexity is more than `factor` times its own best along
    the way did not converge: its scores say nothing about the row's change, only that training
    failed (with the suite's schedule). Returns what happened, or None."""
    curve = [(int(c[0]), float(c[1])) for c in r.get("curve", [])]
    if not curve:
        return None
    best_step, best = min(curve, key=lambda c: c[1])
    if r["valid_ppl"] > factor * best:
        return (f"diverged: validation PPL {best:,.0f} at update {best_step:,}, "
                f"{r['valid_ppl']:,.0f} at the end")
    return None


def _test_bleu(r: dict, split: str = "test_2016_flickr") -> str:
    b = r["bleu"].get(split)
    return f"{b['bleu']:.2f}" if b else "–"


def _fmt_machine(rs: list[dict]) -> str:
    seen = []
    for r in rs:
        m = r.get("machine", {})
        desc = f"{m.get('gpu') or m.get('cpu', '?')} ({r.get('device', '?')}, {m.get('threads', '?')} threads, " \
               f"torch {m.get('torch', '?')})"
        if desc not in seen:
            seen.append(desc)
    return "; ".join(seen) or "–"


def reference_stats(rs: list[dict]) -> tuple[float, float, float | None, float | None]:
    """Mean validation BLEU and PPL of a suite's reference seeds, and their ranges (the noise band;
    None until two seeds have run)."""
    refs = [r for r in rs if r["group"] == "ref"]
    bleus, ppls = [_valid_bleu(r) for r in refs], [r["valid_ppl"] for r in refs]
    return (statistics.mean(bleus), statistics.mean(ppls), max(bleus) - min(bleus) if len(refs) > 1 else None,
            max(ppls) - min(ppls) if len(refs) > 1 else None)


def beats_reference(rs: list[dict]) -> list[dict]:
    """Table 3 rows whose validation BLEU beats the reference's mean by more than the seed band
    (diverged rows excluded): the candidates for the `multi30k` preset."""
    if not any(r["group"] == "ref" for r in rs):
        return []
    ref_bleu, _, noise_bleu, _ = reference_stats(rs)
    if noise_bleu is None:
        return []
    return [r for r in sorted(rs, key=lambda r: (r["group"], r["row"]))
            if r["group"] != "ref" and not diverged(r) and _valid_bleu(r) - ref_bleu > noise_bleu]


def _table3_line(r: dict, ref_bleu: float, ref_ppl: float, noise_bleu: float | None, noise_ppl: float | None
                 ) -> tuple[str, str | None]:
    """One row of the Table 3 section, and why it failed (diverged) if it did."""
    p = r.get("paper")
    d_bleu, d_ppl = _valid_bleu(r) - ref_bleu, r["valid_ppl"] - ref_ppl
    failed = diverged(r)
    v_b = v_p = ""
    paper_cells = " | "
    if p:
        pb, pp = p["bleu"] - p["ref_bleu"], p["ppl"] - p["ref_ppl"]
        v_b = verdict(d_bleu, noise_bleu, pb, PAPER_BLEU_STEP, True)
        v_p = verdict(d_ppl, noise_ppl, pp, PAPER_PPL_STEP, False)
        paper_cells = f"{p['label']}: {p['ppl']:.2f} / {p['bleu']:.1f} | {pp:+.2f} / {pb:+.1f}"
    if failed:
        v_b = v_p = "diverged: no verdict"
    return (f"| {r['row']} | {r['change']} | {r['params'] / 1e6:.2f}M | {r['updates']} | {r['valid_ppl']:.3f} | "
            f"{_valid_bleu(r):.2f} | {_test_bleu(r)} | {paper_cells} | {d_ppl:+.3f} / {d_bleu:+.2f} | {v_b} | {v_p} |",
            failed)


def table3_section(rs: list[dict], img: Path) -> list[str]:
    refs = [r for r in rs if r["group"] == "ref"]
    rows = sorted((r for r in rs if r["group"] != "ref"), key=lambda r: (r["group"], r["row"]))
    if not refs:
        return ["## Table 3 at small scale", "", "No reference run has finished yet.", ""]
    ref_bleu, ref_ppl, noise_bleu, noise_ppl = reference_stats(rs)
    common = refs[0]["common"]
    out = ["## Table 3 at small scale", "",
           f"Every row trains for {common['train.max_steps']:,} updates (warm-up {common['train.warmup_steps']}, "
           f"Eq. 3) on Multi30k from the `{refs[0]['preset']}` reference, changing one thing as the paper's row "
           "does; the last 5 checkpoints are averaged (§6.1) and decoded with beam 4, α 0.6. Verdicts compare "
           "validation scores only (PPL and beam-4 BLEU on the full validation set); test2016 BLEU is shown, "
           "never used to decide.", "",
           f"Made by `aiayn reproduce --suite table3 --steps {common['train.max_steps']} --warmup "
           f"{common['train.warmup_steps']}` (`bash scripts/reproduce.sh table3`).", "",
           f"Reference: {len(refs)} seed(s), validation PPL {ref_ppl:.3f}, BLEU {ref_bleu:.2f}; noise band = "
           + (f"the seeds' range: BLEU ±{noise_bleu:.2f}, PPL ±{noise_ppl:.3f}." if noise_bleu is not None
              else "not known until a second seed has run."), "",
           "| row | change | params | updates | valid PPL | valid BLEU | test2016 BLEU | paper row: PPL / BLEU | "
           "paper ΔPPL / ΔBLEU | ours ΔPPL / ΔBLEU | verdict BLEU | verdict PPL |",
           "|---|---|--:|--:|--:|--:|--:|---|--:|--:|---|---|"]
    for r in refs:
        out.append(f"| {r['row']} | reference (seed {r['seed']}) | {r['params'] / 1e6:.2f}M | {r['updates']} | "
                   f"{r['valid_ppl']:.3f} | {_valid_bleu(r):.2f} | {_test_bleu(r)} | base: 4.92 / 25.8 | | | | |")
    failures = []
    for r in rows:
        line, failed = _table3_line(r, ref_bleu, ref_ppl, noise_bleu, noise_ppl)
        out.append(line)
        failures += [f"- {r['row']} ({r['change']}) {failed}."] if failed else []
    out.append("")
    if failures:
        out += ["Rows whose training failed under the suite's schedule (their scores measure that, not the "
                "change):", *failures, ""]
    verdicts = [verdict(_valid_bleu(r) - ref_bleu, noise_bleu, r["paper"]["bleu"] - r["paper"]["ref_bleu"],
                        PAPER_BLEU_STEP, True) for r in rows if r.get("paper") and not diverged(r)]
    if verdicts:
        held = sum(v.startswith(("direction reproduced", "reproduced")) for v in verdicts)
        out.append(f"BLEU direction reproduced in {held} of {len(verdicts)} rows; "
                   f"{sum(v.startswith('within noise') for v in verdicts)} within noise; "
                   f"{sum(v.startswith('not reproduced') for v in verdicts)} not reproduced"
                   + (f"; {len(failures)} diverged." if failures else "."))
        out.append("")
    beats = beats_reference(rs)
    if beats:
        out.append("Rows that beat the reference on validation BLEU beyond the noise: "
                   + ", ".join(f"**{r['row']}** ({_valid_bleu(r) - ref_bleu:+.2f})" for r in beats)
                   + ". The `confirm` suite retrains them at the main job's budget before the `multi30k` preset "
                   "follows (below).")
    elif noise_bleu is not None:
        out.append("No row beats the reference on validation BLEU beyond the noise.")
    out += ["", f"Machine: {_fmt_machine(refs + rows)}.", ""]
    _plot_curves(refs + rows, img / "table3_curves.png", "Table 3 rows: validation perplexity", by_time=False)
    out += ["![validation curves](img/table3_curves.png)", ""]
    return out


def rnn_section(rs: list[dict], img: Path) -> list[str]:
    rs = sorted(rs, key=lambda r: (r["group"] != "transformer", r["row"]))
    minutes = rs[0]["common"].get("train.max_minutes", 0)
    out = ["## Transformer vs recurrent attention (Table 2's comparison at small scale)", "",
           f"Each model trains for the same wall-clock budget ({minutes:g} minutes) on Multi30k, alone on the "
           "machine; then the last 5 checkpoints are averaged and decoded with beam 4, α 0.6. FLOPs per target "
           "token count one training step (forward and backward) with PyTorch's FlopCounterMode.", "",
           f"Made by `aiayn reproduce --suite rnn --minutes {minutes:g}` (`bash scripts/reproduce.sh rnn`).", "",
           "| model | architecture | params | updates | minutes | train tgt tok/s | training FLOPs / tok | "
           "valid PPL | valid BLEU | test2016 BLEU | test2017 BLEU |",
           "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rs:
        out.append(f"| {r['row']} | {r['change']} | {r['params'] / 1e6:.2f}M | {r['updates']} | "
                   f"{r['train_minutes']:.1f} | {r['tgt_tok_s']:.0f} | {r['flops_per_token'] / 1e6:.1f}M | "
                   f"{r['valid_ppl']:.3f} | {_valid_bleu(r):.2f} | {_test_bleu(r)} | "
                   f"{_test_bleu(r, 'test_2017_flickr')} |")
    t = [r for r in rs if r["group"] == "transformer"]
    rnn = [r for r in rs if r["group"] == "rnn"]
    if t and rnn:
        best = max(rnn, key=_valid_bleu)
        out += ["", f"At {minutes:g} minutes the Transformer's validation BLEU is {_valid_bleu(t[0]):.2f} against "
                f"{_valid_bleu(best):.2f} for the best recurrent model ({best['row']}): "
                f"{_valid_bleu(t[0]) - _valid_bleu(best):+.2f}. The paper's claim (Table 2): better BLEU than "
                "recurrent attention at a fraction of the training cost."]
    out += ["", f"Machine: {_fmt_machine(rs)}.", ""]
    _plot_curves(rs, img / "rnn_curves.png", "Validation perplexity against training time", by_time=True)
    out += ["![validation curves](img/rnn_curves.png)", ""]
    return out


def confirm_section(rs: list[dict], t3: list[dict], img: Path | None = None) -> list[str]:
    """The candidates from Table 3 retrained at the main job's own budget, and what the preset does."""
    from ..config import config_keys, preset

    refs = [r for r in rs if r["group"] == "ref"]
    cands = sorted((r for r in rs if r["group"] != "ref"), key=lambda r: r["row"])
    out = ["## Does the preset follow the evidence? (`confirm`: the main job's budget)", "",
           "Rows that beat the reference after 1,000 updates are retrained with the `multi30k` preset's own "
           "budget, as the main job runs it (one seed each, beside the reference), then averaged and decoded "
           "as above. A candidate wins only if its validation BLEU beats the reference's by more than the Table 3 "
           "seed band; test sets are shown, never used to decide.", "",
           "Made by `aiayn reproduce --suite confirm` (`bash scripts/reproduce.sh confirm`).", ""]
    if not refs:
        return out + ["The reference has not finished yet.", ""]
    ref = refs[0]
    noise = reference_stats(t3)[2] if any(r["group"] == "ref" for r in t3) else None
    out += ["| row | change | params | updates | minutes | valid PPL | valid BLEU | Δ valid BLEU | test2016 BLEU | "
            "test2017 BLEU | verdict |", "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    winners = []
    for r in [ref, *cands]:
        d = _valid_bleu(r) - _valid_bleu(ref)
        if r is ref:
            v, cell = "", ""
        elif noise is None:
            v, cell = "no noise estimate", f"{d:+.2f}"
        else:
            v = "beats the reference" if d > noise else ("worse" if d < -noise else "within noise")
            cell = f"{d:+.2f}"
            if d > noise:
                winners.append(r)
        out.append(f"| {r['row']} | {r['change']} | {r['params'] / 1e6:.2f}M | {r['updates']:,} | "
                   f"{r['train_minutes']:.1f} | {r['valid_ppl']:.3f} | {_valid_bleu(r):.2f} | {cell} | "
                   f"{_test_bleu(r)} | {_test_bleu(r, 'test_2017_flickr')} | {v} |")
    out.append("")
    if noise is not None:
        out.append(f"Noise band: the Table 3 reference seeds' range, ±{noise:.2f} BLEU.")
    current = config_keys(preset("multi30k"))
    if winners:
        best = max(winners, key=_valid_bleu)
        adopted = all(current.get(k) == v for k, v in best["overrides"].items())
        out.append(f"**{best['row']}** ({best['change']}) wins at the main job's budget; the `multi30k` preset "
                   + ("has adopted it." if adopted else "does not have it yet: it should follow."))
    elif cands:
        out.append("No candidate beats the reference at the main job's budget: the advantage seen after 1,000 "
                   "updates did not last, and the `multi30k` preset keeps its settings.")
    out += ["", f"Machine: {_fmt_machine(rs)}.", ""]
    if img is not None:
        _plot_curves(rs, img / "confirm_curves.png", "Reference and candidates at the main job's budget",
                     by_time=True)
        out += ["![validation curves](img/confirm_curves.png)", ""]
    return out


def table1_section(t1: dict, img: Path) -> list[str]:
    top = max(t1["ns"])
    mid = t1["d"] if t1["d"] in t1["ns"] else t1["ns"][len(t1["ns"]) // 2]
    out = ["## Table 1: cost of one layer against sequence length", "",
           f"One layer of each type at d = {t1['d']}, batch {t1['batch']}, n = {min(t1['ns'])} … {max(t1['ns'])}; "
           f"forward + backward time (median of {t1['repeats']}), activation memory saved for the backward pass, "
           "sequential steps (operations that must wait for the previous one), and the maximum path length "
           "between positions 0 and n - 1 (counted on the layer's connections, checked by autograd). Slopes are "
           f"fitted on log-log for n ≥ {t1['fit_from']}. Made by `aiayn reproduce --suite table1`.", "",
           f"| layer | Table 1: complexity / sequential / path | ms at n={mid} | ms at n={top} | time slope | "
           f"memory slope | sequential steps at n={top} | path length at n={top} |",
           "|---|---|--:|--:|--:|--:|--:|--:|"]
    i_mid, i_top = t1["ns"].index(mid), t1["ns"].index(top)
    for name, L in t1["layers"].items():
        out.append(f"| {name} | {L['paper']} | {L['time_ms'][i_mid]:.1f} | {L['time_ms'][i_top]:.1f} | "
                   f"{L['slope_time']:.2f} | {L['slope_memory']:.2f} | {L['sequential'][-1]} | "
                   f"{L['path_length'][-1]} |")
    out += ["", f"Table 1's point in numbers: a self-attention layer costs n²·d against the recurrent layer's n·d², "
            f"so it is the cheaper one while n < d (here d = {t1['d']}; at n = {mid} it takes "
            f"{t1['layers']['self-attention']['time_ms'][i_mid]:.1f} ms against "
            f"{t1['layers']['recurrent (LSTM)']['time_ms'][i_mid]:.1f} ms), and it needs one sequential step "
            f"where the recurrence needs n."]
    out += ["", f"Machine: {t1['machine'].get('gpu') or t1['machine'].get('cpu')} ({t1['device']}).", "",
            "![Table 1 costs](img/table1.png)", ""]
    _plot_table1(t1, img / "table1.png")
    return out


def render(report_dir: Path, command: str = "", planned: dict[str, int] | None = None) -> Path:
    """Write REPORT.md and img/*.png in report_dir from report_dir/results/*/*.json; `planned`: the
    number of rows each suite has (passed in by the suites, which this module does not import)."""
    report_dir = Path(report_dir)
    results = load_results(report_dir / "results")
    img = report_dir / "img"
    out = ["# Reproducing *Attention Is All You Need* at small scale", "",
           "Generated by `aiayn reproduce` from the result files in `results/` (one JSON per run); "
           "re-render with `aiayn reproduce --suite table3 --render-only`. BLEU is sacreBLEU on detokenized, "
           "cased text (signature below), not the paper's tokenized BLEU, and Multi30k is not WMT14: compare "
           "directions, not values.", ""]
    planned = planned or {}
    t1_done = (report_dir / "results" / "table1" / "table1.json").exists()
    done = {s: f"{len(results.get(s, []))} of {planned[s]}" if s in planned else str(len(results.get(s, [])))
            for s in ("table3", "rnn", "confirm")}
    out += [f"Progress: table3 {done['table3']} rows, rnn {done['rnn']}, confirm {done['confirm']}, "
            f"table1 {'done' if t1_done else 'not run'}. "
            "A suite resumes where it stopped when its command is run again.", ""]
    if command and "--render-only" not in command:
        out += [f"Last command: `{command}`", ""]
    if "table3" in results:
        out += table3_section(results["table3"], img)
    if "rnn" in results:
        out += rnn_section(results["rnn"], img)
    if "confirm" in results:
        out += confirm_section(results["confirm"], results.get("table3", []), img)
    t1_files = sorted((report_dir / "results" / "table1").glob("*.json")) if (report_dir / "results").exists() else []
    if t1_files:
        out += table1_section(json.loads(t1_files[0].read_text()), img)
    trained = results.get("table3", []) + results.get("rnn", [])
    if trained:
        _plot_bleu_params(results, img / "bleu_params.png")
        out += ["## BLEU against parameters", "", "![BLEU vs parameters](img/bleu_params.png)", ""]
        r0 = trained[0]
        settings = [("paper base: d_model 512, warm-up 4000", 512, 4000, 1.0)]
        if "table3" in results:
            c = results["table3"][0]["common"]
            settings.append((f"table3 rows: d_model 256, warm-up {c['train.warmup_steps']}, ×0.8", 256,
                             c["train.warmup_steps"], 0.8))
        settings.append(("multi30k preset: d_model 256, warm-up 800, ×0.8", 256, 800, 0.8))
        _plot_schedule(img / "schedule.png", settings)
        out += ["## The learning-rate schedule (Eq. 3)", "", "![Eq. 3](img/schedule.png)", "",
                f"sacreBLEU signature: `{r0.get('signature', '?')}`", ""]
    if not trained and not t1_files:
        out += ["No suite has finished a run yet.", ""]
    path = report_dir / "REPORT.md"
    atomic_write(path, "\n".join(out).encode())
    return path
