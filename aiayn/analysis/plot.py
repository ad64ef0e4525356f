"""Pictures: attention maps (Figures 3-5) and training curves (loss, perplexity, BLEU, Eq. 3)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..decode.maps import AttentionData
from ..extras import figure
from ..files import new_folder
from ..progress import bar
from ..training.run_folder import read_metrics

JOINS = "·"  # before a subword that continues the word before it


def words(pieces: list[str]) -> list[str]:
    """SentencePiece pieces as a reader sees them: "▁dog" -> "dog", a piece that continues the
    word before -> "·s" (JOINS), special tokens as they are."""
    return [p[1:] or "▁" if p.startswith("▁") else p if p.startswith("<") and p.endswith(">") else JOINS + p
            for p in pieces]


def heatmap(ax, w: np.ndarray, rows: list[str], cols: list[str], title: str):
    """One attention map (queries × keys) on `ax` on the fixed scale 0-1 (white to black: near-uniform
    attention is pale, not saturated), its tokens as words (`words`) for tick labels; the image, for
    a colour bar."""
    image = ax.imshow(w, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(cols)), words(cols), rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), words(rows), fontsize=7)
    ax.set_title(title, fontsize=9)
    return image


def colour_bar(fig, image, axes) -> None:
    """The scale of every map on a figure, stated once beside them."""
    bar = fig.colorbar(image, ax=axes, shrink=0.8, pad=0.02)
    bar.set_label("attention weight (rows sum to 1)", fontsize=8)
    bar.ax.tick_params(labelsize=7)


def _grid(maps: np.ndarray, rows: list[str], cols: list[str], title: str, path: Path) -> list[Path]:
    """One figure for one layer: every head, and their mean."""
    h = maps.shape[0]
    panels = [(maps[i], f"head {i + 1}") for i in range(h)] + [(maps.mean(0), "mean of heads")]
    ncol = min(len(panels), 3)
    nrow = math.ceil(len(panels) / ncol)
    size = 1.4 + 0.22 * max(len(rows), len(cols))
    fig = figure(figsize=(ncol * size + 1.0, nrow * size + 0.6), layout="constrained")
    axes = fig.subplots(nrow, ncol, squeeze=False)
    for ax, (w, name) in zip(axes.flat, panels):
        image = heatmap(ax, w, rows, cols, name)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    colour_bar(fig, image, axes)
    fig.suptitle(f"{title} (rows: queries, columns: keys; {JOINS} joins a subword to the one before)", fontsize=10)
    out = [path.with_suffix(".png"), path.with_suffix(".svg")]
    for p in out:
        fig.savefig(p, dpi=110)
    return out


ATTENTION_MAPS = "plot attention"  # the kind in the folder's marker (files.MARKER)


def plot_attention(data: AttentionData, out_dir: Path) -> list[Path]:
    """PNG and SVG heatmaps: per layer (every head + mean) for the three kinds of attention
    (§3.2.3), and the cross-attention averaged over layers and heads. The folder is built beside
    `out_dir` and renamed into place; a folder holding other files is refused."""
    with new_folder(out_dir, ATTENTION_MAPS) as tmp:
        names = [p.name for p in _plot_attention(data, tmp)]
    return [Path(out_dir) / n for n in names]


def _plot_attention(data: AttentionData, out_dir: Path) -> list[Path]:
    kinds = [
        ("encoder-self", data.encoder_self, data.src_tokens, data.src_tokens),
        ("decoder-self", data.decoder_self, data.tgt_out_tokens, data.tgt_in_tokens),
        ("cross", data.cross, data.tgt_out_tokens, data.src_tokens),
    ]
    written: list[Path] = []
    shown = bar(sum(maps.shape[0] for _, maps, _, _ in kinds) + 1, "figure", "drawing attention maps")
    for name, maps, rows, cols in kinds:
        for layer in range(maps.shape[0]):
            written += _grid(maps[layer], rows, cols, f"{name} attention, layer {layer + 1}",
                             out_dir / f"{name}-layer{layer + 1}")
            shown.update(1)
    mean = data.cross.mean((0, 1))
    size = 2.0 + 0.3 * max(mean.shape)
    fig = figure(figsize=(size + 1.2, size), layout="constrained")
    ax = fig.subplots()
    image = heatmap(ax, mean, data.tgt_out_tokens, data.src_tokens, "encoder-decoder attention, mean of layers "
                    "and heads")
    ax.set_xlabel(f"source ({JOINS} joins a subword to the one before)")
    ax.set_ylabel("output, in the order it is written")
    colour_bar(fig, image, ax)
    for p in (out_dir / "cross-mean.png", out_dir / "cross-mean.svg"):
        fig.savefig(p, dpi=130)
        written.append(p)
    shown.update(1)
    shown.close()
    return written


def plot_curves(run_dir: Path, out: Path) -> Path:
    """Training and validation loss, perplexity, validation BLEU and the learning rate (Eq. 3)."""
    if not (Path(run_dir) / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{Path(run_dir) / 'metrics.jsonl'} not found (is {run_dir} a run directory?)")
    rows = read_metrics(run_dir)
    train = [r for r in rows if "loss" in r]
    valid = [r for r in rows if "valid_loss" in r]
    if not train and not valid:
        raise ValueError(f"{run_dir}: metrics.jsonl has no training or validation records yet")
    fig = figure(figsize=(11, 7))
    axes = fig.subplots(2, 2)
    (a_loss, a_ppl), (a_bleu, a_lr) = axes

    def line(ax, recs, key, label):
        recs = [r for r in recs if key in r]
        if recs:  # validation points marked: a run validates a few times only
            ax.plot([r["step"] for r in recs], [r[key] for r in recs], label=label,
                    marker="o" if key.startswith("valid") else None, markersize=4)

    line(a_loss, train, "loss", "train (label-smoothed)")
    line(a_loss, valid, "valid_loss", "valid (label-smoothed)")
    a_loss.set_title("loss per token")
    line(a_ppl, train, "ppl", "train")
    line(a_ppl, valid, "valid_ppl", "valid")
    a_ppl.set_yscale("log")
    a_ppl.set_title("perplexity")
    per = sorted({k for r in valid for k in r if k.startswith("valid_bleu_")})  # many directions: each, and the mean
    line(a_bleu, valid, "valid_bleu", "valid greedy BLEU" + (" (mean)" if per else ""))
    for key in per:
        line(a_bleu, valid, key, key.removeprefix("valid_bleu_"))
    a_bleu.set_title("validation BLEU (sacreBLEU)")
    line(a_lr, train, "lr", "Eq. 3")
    a_lr.set_title("learning rate")
    for ax in axes.flat:
        ax.set_xlabel("update")
        if ax.lines:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    last = max(r["step"] for r in rows)
    fig.suptitle(f"{Path(run_dir).resolve().name}: {len(train)} training records, {len(valid)} validations, "
                 f"update {last:,}")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
