"""`aiayn heads`: what the attention heads of a trained model do (§3.2.2, Figures 3-5, measured).

On the validation split only, ranked on one half and measured on the other: every head's importance
(NLL with the head removed, and Michel et al.'s gradient proxy, with their rank correlation) on the
even-numbered sentences, its roles (heads.py), and on the odd-numbered sentences the pruning curve
(heads removed least important first: NLL and beam-4 BLEU after each removal) against 20 random
orders as the control (NLL at five counts, their median and 95 % range). Writes heads.json and pictures to a folder.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import sacrebleu
import torch

from ..checkpoint import (
    load_checkpoint,
    model_tensors,
    read_weights,
    save_weights,
)
from ..data.batches import TokenData
from ..data.prepare import check_vocabulary, load_manifest, read_text
from ..data.tokenizer import EOS, Tokenizer
from ..decode.maps import attention_data
from ..decode.translator import Translator
from ..device import TRAIN_PRECISIONS, resolve_precision
from ..extras import figure, need
from ..files import atomic_write, new_folder
from ..parsing.model import build_any
from ..parsing.trees import SPLITS, clean, read_treebank
from .heads import (
    SUBLAYERS,
    ablation_importance,
    eval_batches,
    gradient_importance,
    nll_per_token,
    prune,
    prune_order,
    pruning_curve,
    random_band,
    role_table,
    syntactic_agreement,
)
from .plot import colour_bar, heatmap

log = logging.getLogger("aiayn")
FILES = ("heads.json", "importance.png", "roles.png", "pruning.png", "examples.png", "pruned.safetensors")
_PUNCT = set(".,!?;:")
HEADS = "heads"  # the kind in the output folder's marker (files.MARKER)


def _facts(data_dir: Path, tokenizer: Tokenizer) -> dict:
    """Sinks (EOS and sentence punctuation) and the training counts of every id, per side."""
    train = TokenData(data_dir, "train")
    pieces = tokenizer.id_to_piece(list(range(len(tokenizer))))
    sinks = {EOS} | {i for i, p in enumerate(pieces) if p.replace("\u2581", "") in _PUNCT}
    count = lambda tok: dict(enumerate(np.bincount(np.asarray(tok), minlength=len(tokenizer)).tolist()))  # noqa: E731
    return {"sinks": sinks, "src_freq": count(train.src_tok), "tgt_freq": count(train.tgt_tok)}


RANKED, MEASURED = 0, 1  # heads ranked on the even-numbered validation sentences, curves measured on the odd


def _evaluators(model, tokenizer: Tokenizer, cfg, valid: TokenData, src: list[str], ref: list[str]):
    """Two functions of the model as it is now, on the MEASURED half of the validation split: NLL
    and beam-4 BLEU (on `src`, its first sentences), and NLL alone (the random orders' control)."""
    device = torch.device("cpu")
    batches = eval_batches(valid, cfg, part=MEASURED)
    translator = Translator(model, tokenizer, cfg.decode, device, cfg.train.precision)

    @torch.no_grad()
    def nll() -> dict:
        return {"nll": float(nll_per_token(model, batches, cfg, device))}

    @torch.no_grad()
    def nll_and_bleu() -> dict:
        translator.model = model  # a fresh bf16 copy: it carries the gates' hooks now on the model
        hyps = translator.translate(src, beam=4)
        return {**nll(), "bleu": sacrebleu.corpus_bleu(hyps, [ref]).score}
    return nll_and_bleu, nll


def _pruning(model, order: list, evaluators, orders: int, seed: int) -> dict:
    """The importance order's curve (NLL and BLEU after every removal) and `orders` random orders' (NLL
    at five counts of heads removed, the last the curve's end: kept few, as they cost the most), with
    the random orders' median and 2.5-97.5 % range."""
    both, nll = evaluators
    curves: dict = {"importance": pruning_curve(model, order, both)}
    k = curves["importance"][-1]["removed"]
    at = {max(1, round(k * i / 5)) for i in range(1, 6)} if k else set()
    shuffles = [random.Random(seed + s).sample(order, len(order)) for s in range(orders)]
    curves["random"] = [pruning_curve(model, s, nll, at) for s in shuffles]
    curves["random_band"] = random_band(curves["random"]) if orders else []
    return curves


def _removable(curve: list[dict], cost: float = 0.5) -> int:
    """Heads removed before BLEU first falls more than `cost` below the full model's."""
    full = curve[0]["bleu"]
    for row in curve[1:]:
        if row["bleu"] < full - cost:
            return row["removed"] - 1
    return curve[-1]["removed"]


def dev_trees(treebank: Path, limit: int) -> list:
    """The first `limit` cleaned trees of the treebank's development files (parse.SPLITS["valid"])."""
    import re


    lo, hi = SPLITS["valid"]
    trees = [c for name, ts in read_treebank(treebank).items()
             if (m := re.search(r"(\d+)", name)) and lo <= int(m.group(1)) <= hi
             for c in (clean(t) for t in ts) if c is not None]
    if not trees:
        raise ValueError(f"{treebank}: no trees in the development files {lo:04d}-{hi:04d}")
    return trees[:limit]


def _trees(settings: dict, treebank: Path | None, sentences: int) -> list | None:
    """The development trees, read (and refused) before minutes of measuring."""
    if treebank is None:
        return None
    if settings["src"] != "en":
        raise ValueError(f"--treebank: the trees are English and this model's source is {settings['src']!r}")
    return dev_trees(treebank, sentences)


def _syntactic(model, tokenizer: Tokenizer, cfg, trees: list, treebank: Path) -> dict:
    log.info("syntactic role: encoder self-attention against dependency arcs of %s", treebank)
    s = syntactic_agreement(model, tokenizer, trees, cfg.data.max_len)
    return {**s, "accuracy": s["accuracy"].tolist(), "treebank": str(treebank)}


def measure(checkpoint: Path, data_dir: Path, sentences: int = 200, bleu_sentences: int = 100,
            seed: int = 1, treebank: Path | None = None, random_orders: int = 20) -> dict:
    """Every measurement of `aiayn heads`, as plain data: heads ranked (ablation, gradient) on half the
    validation sentences, the pruning curves measured on the other half."""
    model, cfg, tokenizer, _ = load_checkpoint(checkpoint, build=build_any)
    model.eval()
    # in this CPU's precision, not the training machine's: bf16 emulated on an AVX2 CPU took > 10 minutes
    cfg.train.precision, why = resolve_precision("auto", torch.device("cpu"), choices=TRAIN_PRECISIONS)
    log.info("measuring in %s (%s)", cfg.train.precision, why)
    settings = load_manifest(data_dir)["settings"]
    check_vocabulary(tokenizer.proto, data_dir)
    trees = _trees(settings, treebank, sentences)
    valid = TokenData(data_dir, "valid")
    src = read_text(data_dir, "valid", "src")[MEASURED::2][:bleu_sentences]
    ref = read_text(data_dir, "valid", "tgt")[MEASURED::2][:bleu_sentences]
    device = torch.device("cpu")
    log.info("importance by ablation (one validation per head, the even-numbered sentences)")
    _, ablation = ablation_importance(model, valid, cfg, device, part=RANKED)
    log.info("importance by the gate's gradient")
    grad = gradient_importance(model, valid, cfg, device, part=RANKED)
    a = torch.cat([ablation[n].flatten() for n in SUBLAYERS]).numpy()
    g = torch.cat([grad[n].flatten() for n in SUBLAYERS]).numpy()
    log.info("roles over %d validation sentences", sentences)
    roles = role_table(model, valid, _facts(data_dir, tokenizer), sentences)
    syntactic = _syntactic(model, tokenizer, cfg, trees, treebank) if trees is not None else None
    if syntactic:
        roles["encoder_self"]["syntactic"] = torch.tensor(syntactic["accuracy"])
    order = prune_order(ablation)
    examples = _examples(model, tokenizer, ablation, src, ref)  # the whole model's maps, before any pruning
    log.info("pruning curves (%d heads): by importance, and %d random orders", len(order), random_orders)
    curves = _pruning(model, order, _evaluators(model, tokenizer, cfg, valid, src, ref), random_orders, seed)
    as_list = lambda d: {k: v.tolist() for k, v in d.items()}  # noqa: E731
    removable = {"importance": _removable(curves["importance"])}
    return {"checkpoint": str(checkpoint), "data": str(data_dir), "valid_nll": curves["importance"][0]["nll"],
            "split": "heads ranked on the even-numbered validation sentences, curves measured on the odd-numbered",
            "bleu_sentences": len(src), "role_sentences": min(sentences, len(valid)), "seed": seed,
            "ablation": as_list(ablation), "gradient": as_list(grad),
            "spearman_ablation_gradient": float(need("scipy.stats", "evidence").spearmanr(a, g).statistic),
            "roles": {n: as_list(r) for n, r in roles.items()}, "syntactic": syntactic, "pruning": curves,
            "removable_at_0.5_bleu": removable,
            "pruned_heads": [r["head"] for r in curves["importance"][1:removable["importance"] + 1]],
            "examples": examples}


# Where AttentionData keeps each sublayer's maps, and the tokens of their queries and keys.
_MAPS = {"encoder_self": ("encoder_self", "src_tokens", "src_tokens"),
         "decoder_self": ("decoder_self", "tgt_out_tokens", "tgt_in_tokens"),
         "cross": ("cross", "tgt_out_tokens", "src_tokens")}


def _examples(model, tokenizer: Tokenizer, ablation: dict, src: list[str], ref: list[str], n: int = 2,
              max_words: int = 12) -> list[dict]:
    """Figures 3-5 for the heads that matter: the most important head of each sublayer (by ablation) on
    the first `n` validation sentences of at most `max_words` source words, teacher-forced on the reference."""
    chosen = [i for i, s in enumerate(src) if len(s.split()) <= max_words][:n] or [0]
    maps = [attention_data(model, tokenizer, src[i], ref[i]) for i in chosen]
    out = []
    for name in SUBLAYERS:
        layer, head = divmod(int(ablation[name].argmax()), ablation[name].size(1))
        field, rows, cols = _MAPS[name]
        for i, data in zip(chosen, maps):
            out.append({"sublayer": name, "layer": layer, "head": head, "sentence": i, "rows": getattr(data, rows),
                        "cols": getattr(data, cols), "weights": getattr(data, field)[layer, head].round(4).tolist()})
    return out


def _importance_figure(result: dict, path: Path) -> None:
    fig = figure(figsize=(11, 5.5))
    axes = fig.subplots(2, 3, squeeze=False)
    for row, (key, label) in enumerate([("ablation", "ΔNLL with the head removed"),
                                        ("gradient", "E|∂L/∂gate| (Michel et al.)")]):
        for col, name in enumerate(SUBLAYERS):
            t = np.array(result[key][name])
            ax = axes[row][col]
            im = ax.imshow(t, cmap="magma", aspect="auto")
            ax.set_title(f"{name}: {label}", fontsize=8)
            ax.set_xlabel("head", fontsize=7)
            ax.set_ylabel("layer", fontsize=7)
            ax.set_xticks(range(t.shape[1]), [str(j + 1) for j in range(t.shape[1])], fontsize=7)
            ax.set_yticks(range(t.shape[0]), [str(i + 1) for i in range(t.shape[0])], fontsize=7)
            fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _roles_figure(result: dict, path: Path) -> None:
    panels = [(n, r) for n in SUBLAYERS for r in result["roles"].get(n, {})]
    fig = figure(figsize=(1.6 * len(panels), 2.8))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (name, role) in zip(axes[0], panels):
        t = np.array(result["roles"][name][role])
        ax.imshow(t, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(t):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=5, color="w")
        ax.set_title(f"{name}\n{role}", fontsize=6)
        ax.set_xticks([])
        ax.set_yticks(range(t.shape[0]), [f"L{i + 1}" for i in range(t.shape[0])], fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _pruning_figure(result: dict, path: Path) -> None:
    fig = figure(figsize=(10, 3.6))
    axes = fig.subplots(1, 2)
    c = result["pruning"]["importance"]
    x = [r["removed"] for r in c]
    axes[0].plot(x, [r["nll"] for r in c], "-o", ms=3, label="importance order")
    axes[1].plot(x, [r["bleu"] for r in c], "-o", ms=3, label="importance order")
    band = result["pruning"].get("random_band")
    if band:
        xb = [b["removed"] for b in band]
        axes[0].fill_between(xb, [b["lo"] for b in band], [b["hi"] for b in band], alpha=0.25, color="grey",
                             label=f"{len(result['pruning']['random'])} random orders, 95 % range")
        axes[0].plot(xb, [b["median"] for b in band], "--", color="grey", label="random orders, median")
    axes[1].axhline(result["pruning"]["importance"][0]["bleu"] - 0.5, color="grey", lw=0.8, label="full − 0.5 BLEU")
    labels = ("validation NLL per token", f"beam-4 BLEU, {result['bleu_sentences']} valid sentences")
    for ax, label in zip(axes, labels):
        ax.set_xlabel("heads removed")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _save_pruned(result: dict, path: Path) -> None:
    """The checkpoint without the heads that go at <= 0.5 BLEU (importance order), W^O columns zeroed;
    its metadata kept (a parser's task label and tagger)."""

    model, cfg, tokenizer, step = load_checkpoint(Path(result["checkpoint"]), build=build_any)
    prune(model, [tuple(h) for h in result["pruned_heads"]])
    extra = json.loads(read_weights(Path(result["checkpoint"]))[1].get("extra", "{}"))
    save_weights(path, model_tensors(model), cfg, tokenizer, step, {**extra, "pruned_heads": result["pruned_heads"]})


def write(result: dict, out: Path) -> Path:
    """heads.json, the four pictures and the pruned checkpoint, replacing an earlier `aiayn heads`
    folder whole."""
    with new_folder(out, HEADS) as tmp:
        _save_pruned(result, tmp / "pruned.safetensors")
        atomic_write(tmp / "heads.json", json.dumps(result, indent=1).encode())
        _importance_figure(result, tmp / "importance.png")
        _roles_figure(result, tmp / "roles.png")
        _pruning_figure(result, tmp / "pruning.png")
        _examples_figure(result, tmp / "examples.png")
    return Path(out)


def _examples_figure(result: dict, path: Path) -> None:
    """The most important head of each sublayer on the example sentences: one row per sublayer."""
    ex = result["examples"]
    per_row = max(1, len(ex) // len(SUBLAYERS))
    size = 1.2 + 0.2 * max(max(len(e["rows"]), len(e["cols"])) for e in ex)
    fig = figure(figsize=(per_row * size + 1.0, len(SUBLAYERS) * size), layout="constrained")
    axes = fig.subplots(len(SUBLAYERS), per_row, squeeze=False)
    for ax, e in zip(axes.flat, ex):
        image = heatmap(ax, np.array(e["weights"]), e["rows"], e["cols"],
                        f"{e['sublayer']} L{e['layer'] + 1} H{e['head'] + 1}, sentence {e['sentence'] + 1}")
    colour_bar(fig, image, axes)
    fig.savefig(path, dpi=110)
