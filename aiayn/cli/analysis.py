"""`aiayn plot`, `heads`, `align`: what a trained model attends to, what its heads do (Figures 3-5),
and which head aligns words."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..files import check_output_file, check_output_folder
from .common import (
    UserError,
)

log = logging.getLogger("aiayn")


def cmd_plot(args: argparse.Namespace, extra: list[str]) -> None:
    """Attention maps (Figures 3-5) or training curves."""
    from ..analysis.plot import plot_attention, plot_curves
    from ..decode.maps import attention_data
    from ..decode.translator import Translator

    if args.what == "curves":
        if not args.run_dir:
            raise UserError("plot curves needs a RUN_DIR")
        check_output_file(args.output)
        try:
            out = plot_curves(Path(args.run_dir), Path(args.output))
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from None
        print(f"wrote {out}")
        return
    if not args.checkpoint or args.src is None:
        raise UserError("plot attention needs --checkpoint FILE and --src SENTENCE")
    if not args.src.strip():
        raise UserError("--src is empty")
    from ..analysis.plot import ATTENTION_MAPS
    from ..checkpoint import load_checkpoint
    from ..parsing.model import build_any

    check_output_folder(args.output, ATTENTION_MAPS)  # before the model is loaded and run
    model, cfg, tokenizer, _ = load_checkpoint(Path(args.checkpoint), build=build_any)
    search = None if args.tgt is not None else Translator(model, tokenizer, cfg.decode, precision="fp32")
    data = attention_data(model, tokenizer, args.src, args.tgt, cfg.decode, search)
    files = plot_attention(data, Path(args.output))
    print(f"target: {data.translation}")
    print(f"wrote {len(files)} files to {args.output}")


def _nll_at(result: dict, removed: int) -> float:
    """The importance order's NLL with `removed` heads gone."""
    return next(r["nll"] for r in result["pruning"]["importance"] if r["removed"] == removed)


def cmd_heads(args: argparse.Namespace, extra: list[str]) -> None:
    """What the attention heads do: importance, roles, pruning (validation split only)."""
    from ..analysis.heads_report import HEADS, measure, write

    if args.random_orders < 0:
        raise UserError(f"--random-orders must be >= 0, got {args.random_orders}")
    for name in ("sentences", "bleu_sentences"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    check_output_folder(args.output, HEADS)  # before minutes of measuring
    _checkpoint_file(args.checkpoint)
    try:
        result = measure(Path(args.checkpoint), Path(args.data), args.sentences, args.bleu_sentences, args.seed,
                         Path(args.treebank) if args.treebank else None, args.random_orders)
    except (ValueError, OSError) as e:
        raise UserError(str(e)) from None
    out = write(result, Path(args.output))
    r, band = result["removable_at_0.5_bleu"], result["pruning"]["random_band"]
    at = (f"; after {band[0]['removed']} removed, NLL {_nll_at(result, band[0]['removed']):.3f} by importance, "
          f"random orders {band[0]['median']:.3f} ({band[0]['lo']:.3f}-{band[0]['hi']:.3f})") if band else ""
    print(f"full model (odd-numbered validation sentences): valid NLL {result['valid_nll']:.4f}, BLEU "
          f"{result['pruning']['importance'][0]['bleu']:.2f} ({result['bleu_sentences']} sentences); heads removable "
          f"at <= 0.5 BLEU by importance: {r['importance']}{at}; rank correlation of ablation and gradient importance "
          f"{result['spearman_ablation_gradient']:.2f}")
    if result["syntactic"]:
        s = result["syntactic"]
        best = max(max(row) for row in s["accuracy"])
        print(f"syntactic role: the best encoder head finds the head word of {best:.1%} of {s['arcs']} dependents; "
              f"the best fixed offset ({s['baseline_offset']:+d}) {s['baseline_accuracy']:.1%}")
    print(f"wrote {out}")


def add_plot(sub) -> None:
    """`aiayn plot` and its flags."""
    p = sub.add_parser("plot", help="attention maps or training curves")
    p.add_argument("what", choices=["attention", "curves"])
    p.add_argument("run_dir", nargs="?", help="run folder (curves; or --run-dir)")
    p.add_argument("--run-dir", "--run", dest="run_dir_flag", help="run folder (curves)")
    p.add_argument("--checkpoint", help="model file (attention)")
    p.add_argument("--src", help="source sentence (attention)")
    p.add_argument("--tgt", help="force this target (teacher forcing); default: the model's translation")
    p.add_argument("-o", "--output", required=True, help="folder (attention) or .png file (curves)")
    p.set_defaults(func=cmd_plot)


def add_heads(sub) -> None:
    """`aiayn heads` and its flags."""
    p = sub.add_parser("heads", help="what the attention heads do: importance, roles, pruning (validation)")
    p.add_argument("--checkpoint", required=True, help="model file (.safetensors)")
    p.add_argument("--data", required=True, help="prepared data folder (its validation split is used)")
    p.add_argument("--sentences", type=int, default=200, help="validation sentences for the role statistics")
    p.add_argument("--bleu-sentences", type=int, default=100, help="validation sentences for BLEU while pruning")
    p.add_argument("--seed", type=int, default=1, help="the first random pruning order (the control)")
    p.add_argument("--random-orders", type=int, default=20, help="random pruning orders, the control (default 20)")
    p.add_argument("--treebank", help="Penn Treebank .mrg folder or NLTK's treebank.zip: the encoder's syntactic "
                                      "role against dependency arcs of its development trees (English sources)")
    p.add_argument("-o", "--output", required=True, help="folder for heads.json and pictures")
    p.set_defaults(func=cmd_heads)


def cmd_align(args: argparse.Namespace, extra: list[str]) -> None:
    """Choose the encoder-decoder head that aligns words best (AER on validation pairs)."""
    from ..analysis.alignment_head import choose_head, report
    from ..decode.align import head_name

    if args.pairs < 1:
        raise UserError(f"--pairs must be at least 1, got {args.pairs}")
    _checkpoint_file(args.checkpoint)
    from ..checkpoint import check_safetensors_output

    out = check_safetensors_output(args.output, inputs=(args.checkpoint,))
    best, scores = choose_head(Path(args.checkpoint), Path(args.data), out, args.pairs)
    print(report(scores))
    print(f"chosen: {head_name(best)} (AER {scores[best]:.3f} against the reference aligner) -> {out} "
          "(translate --alignments FILE reads it)")


def add_align(sub) -> None:
    """`aiayn align` and its flags."""
    p = sub.add_parser("align", help="choose the attention head that aligns words (AER on validation pairs)")
    p.add_argument("--checkpoint", required=True, help="model file (.safetensors)")
    p.add_argument("--data", required=True, help="prepared data folder (training text for the reference aligner, "
                                                 "validation pairs to score on)")
    p.add_argument("--pairs", type=int, default=500, help="validation pairs to score the heads on")
    p.add_argument("-o", "--output", required=True, help="a copy of the checkpoint that names the chosen head")
    p.set_defaults(func=cmd_align)


def _checkpoint_file(path: str) -> None:
    """One line for a --checkpoint that is no file: a folder (checkpoint.refuse_folder), or missing."""
    from ..checkpoint import refuse_folder

    refuse_folder(path)
    if not Path(path).is_file():
        raise UserError(f"--checkpoint {path}: no such file")
