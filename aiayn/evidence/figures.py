"""The report's plots: validation curves, BLEU against parameters, the Eq. 3 schedule."""

from __future__ import annotations

from pathlib import Path

from ..extras import figure
from ..training.optim import noam_lr


def row_valid_bleu(r: dict) -> float:
    return r["bleu"].get("valid", {}).get("bleu", float("nan"))


def plot_suite_curves(rs: list[dict], path: Path, title: str, by_time: bool) -> None:
    fig = figure(figsize=(8, 5))
    ax = fig.subplots()
    for r in rs:
        c = r.get("curve") or []
        if not c:
            continue
        xs = [p[2] if by_time and len(p) > 2 else p[0] for p in c]
        ax.plot(xs, [p[1] for p in c], marker=".", label=r["row"])
    ax.set_yscale("log")
    ax.set_xlabel("training minutes" if by_time else "update")
    ax.set_ylabel("validation perplexity")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, ncol=2)
    _save(fig, path)


def plot_bleu_params(results: dict[str, list[dict]], path: Path) -> None:
    fig = figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for suite, marker in (("table3", "o"), ("arch", "s")):
        for r in (r for r in results.get(suite, []) if r.get("family") != "stability"):
            ax.scatter(r["params"] / 1e6, row_valid_bleu(r), marker=marker)
            ax.annotate(r["row"], (r["params"] / 1e6, row_valid_bleu(r)), fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("parameters (millions)")
    ax.set_ylabel("validation BLEU (beam 4, averaged)")
    ax.set_title("BLEU against parameters (circles: Table 3 rows, squares: arch suite)")
    ax.grid(alpha=0.3)
    _save(fig, path)


def plot_schedule(path: Path, settings: list[tuple[str, dict]]) -> None:
    """Eq. 3 for the paper's base model and for each (label, recorded config) given."""
    fig = figure(figsize=(7, 4))
    ax = fig.subplots()
    curves = [("paper base: d_model 512, warm-up 4000", 512, 4000, 1.0, 0.0)]
    curves += [(label, c["model"]["d_model"], c["train"]["warmup_steps"], c["train"]["lr_scale"],
                c["train"].get("peak_lr", 0.0)) for label, c in settings]
    for label, d, warmup, scale, peak in curves:
        steps = list(range(1, max(4 * warmup, 2000)))
        ax.plot(steps, [noam_lr(s, d, warmup, scale, peak) for s in steps], label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title("Eq. 3: d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, path)


def plot_budget(curve: list[tuple[int, float]], at: int | None, path: Path) -> None:
    """The reference's validation NLL against updates, and where the budget rule stops."""
    fig = figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot([c[0] for c in curve], [c[1] for c in curve], marker=".")
    if at:
        ax.axvline(at, color="k", ls="--", label=f"budget: {at:,} updates")
        ax.legend()
    ax.set_xlabel("update")
    ax.set_ylabel("validation NLL per token")
    ax.set_title("The reference's validation curve and the update budget")
    ax.grid(alpha=0.3)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_table1(t1: dict, path: Path) -> None:
    """Table 1 measured: time and activation memory per layer against n, log-log."""
    fig = figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    for name, L in t1["layers"].items():
        axes[0].loglog(t1["ns"], L["time_ms"], "o-", label=f"{name} (slope {L['slope_time']:.2f})")
        axes[1].loglog(t1["ns"], L["memory_bytes"], "o-", label=f"{name} (slope {L['slope_memory']:.2f})")
    axes[0].set_title("forward + backward time (ms)")
    axes[1].set_title("activation memory (bytes)")
    for ax in axes:
        ax.set_xlabel("sequence length n")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    _save(fig, path)
