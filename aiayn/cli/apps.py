"""`aiayn plot`, `serve`, `export`: the ways out of a trained model."""

from __future__ import annotations

import argparse
import logging
import math
import os
from pathlib import Path

from ..files import check_output_file, check_output_folder
from .common import (
    UserError,
    refuse_parser,
)

log = logging.getLogger("aiayn")


def cmd_plot(args: argparse.Namespace, extra: list[str]) -> None:
    """Attention maps (Figures 3-5) or training curves."""
    from ..analysis.plot import plot_attention, plot_curves
    from ..decode.translator import attention_data

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
    data = attention_data(model, tokenizer, args.src, args.tgt, cfg.decode)
    files = plot_attention(data, Path(args.output))
    print(f"target: {data.translation}")
    print(f"wrote {len(files)} files to {args.output}")


def cmd_heads(args: argparse.Namespace, extra: list[str]) -> None:
    """What the attention heads do: importance, roles, pruning (validation split only)."""
    from ..analysis.heads_report import HEADS, measure, write

    for name in ("sentences", "bleu_sentences"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    check_output_folder(args.output, HEADS)  # before minutes of measuring
    if not Path(args.checkpoint).is_file():
        raise UserError(f"--checkpoint {args.checkpoint}: no such file")
    try:
        result = measure(Path(args.checkpoint), Path(args.data), args.sentences, args.bleu_sentences, args.seed,
                         Path(args.treebank) if args.treebank else None)
    except (ValueError, OSError) as e:
        raise UserError(str(e)) from None
    out = write(result, Path(args.output))
    r = result["removable_at_0.5_bleu"]
    print(f"full model: valid NLL {result['valid_nll']:.4f}, BLEU {result['pruning']['importance'][0]['bleu']:.2f} "
          f"({result['bleu_sentences']} sentences); heads removable at <= 0.5 BLEU: {r['importance']} by importance, "
          f"{r['random']} at random; rank correlation of ablation and gradient importance "
          f"{result['spearman_ablation_gradient']:.2f}")
    if result["syntactic"]:
        s = result["syntactic"]
        best = max(max(row) for row in s["accuracy"])
        print(f"syntactic role: the best encoder head finds the head word of {best:.1%} of {s['arcs']} dependents; "
              f"the best fixed offset ({s['baseline_offset']:+d}) {s['baseline_accuracy']:.1%}")
    print(f"wrote {out}")


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> None:
    """HTTP API (FastAPI) and a page to try the model."""
    from ..serve.app import Limits, serve, serving_hosts

    names = ("max_sentences", "max_chars", "max_subwords", "max_queue", "max_work", "max_attention_subwords",
             "timeout", "read_timeout", "header_timeout", "limit_concurrency", "keep_alive")
    for name in names:
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)) and not (name == "max_subwords" and value == 0):
            raise UserError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    if not 0 < args.client_share <= 1:
        raise UserError(f"--client-share must be in (0, 1], got {args.client_share}")
    for name in args.allow_host or []:
        if "*" in name[1:] or (name.startswith("*") and name != "*" and not name.startswith("*.")):
            raise UserError(f"--allow-host {name!r}: a name, an address, '*' or '*.example.com'")
    limits = Limits(max_sentences=args.max_sentences, max_chars=args.max_chars, max_subwords=args.max_subwords,
                    max_queue=args.max_queue, max_work=args.max_work, client_share=args.client_share,
                    max_attention_subwords=args.max_attention_subwords, timeout_s=args.timeout,
                    read_timeout_s=args.read_timeout, header_timeout_s=args.header_timeout,
                    limit_concurrency=args.limit_concurrency,
                    keep_alive_s=args.keep_alive, allowed_hosts=serving_hosts(args.host, args.allow_host or []),
                    token=args.token or os.environ.get("AIAYN_SERVE_TOKEN") or None)
    refuse_parser(args.checkpoint, "serve")
    serve(args.checkpoint, args.host, args.port, args.device, limits, args.precision, args.compile, args.shortlist)


def cmd_export(args: argparse.Namespace, extra: list[str]) -> None:
    """Write a Hugging Face MarianMTModel directory, or a CTranslate2 model made from it."""
    from ..export import ExportError, export_ct2, export_hf

    if args.quantization and args.format != "ct2":
        raise UserError("--quantization applies to `export ct2` only")
    from ..export import EXPORT

    check_output_folder(args.output, EXPORT)
    try:
        if args.format == "hf":
            out = export_hf(Path(args.checkpoint), Path(args.output))
            print(f"wrote {out} (load with transformers.MarianMTModel / MarianTokenizer .from_pretrained)")
        else:
            out = export_ct2(Path(args.checkpoint), Path(args.output), args.quantization)
            print(f"wrote {out} (load with ctranslate2.Translator; subwords with {out}/source.spm)")
    except ExportError as e:
        raise UserError(str(e)) from None


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
    p.add_argument("--seed", type=int, default=1, help="the random pruning order (the control)")
    p.add_argument("--treebank", help="Penn Treebank .mrg folder or NLTK's treebank.zip: the encoder's syntactic "
                                      "role against dependency arcs of its development trees (English sources)")
    p.add_argument("-o", "--output", required=True, help="folder for heads.json and pictures")
    p.set_defaults(func=cmd_heads)


def add_serve(sub) -> None:
    """`aiayn serve` and its flags."""
    p = sub.add_parser("serve", help="translation server with a web page")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--max-sentences", type=int, default=64, help="per request (413 above)")
    p.add_argument("--max-chars", type=int, default=1000, help="per sentence (413 above)")
    p.add_argument("--max-queue", type=int, default=1024,
                   help="sentences waiting or in translation; above it requests get 503 with Retry-After")
    p.add_argument("--max-subwords", type=int, default=0,
                   help="per sentence (413 above; default 0: the model's training length, data.max_len - 1)")
    p.add_argument("--max-work", type=int, default=1 << 20,
                   help="work of the sentences waiting or in translation, beam x (source subwords + output "
                        "positions, input + 50); above it 503; one client may hold a quarter (429 above it; one "
                        "request above it alone: 413)")
    p.add_argument("--client-share", type=float, default=0.25,
                   help="the part of --max-work one client (address) may hold (429 above it; behind a proxy on "
                        "this machine, the address its X-Forwarded-For names)")
    p.add_argument("--max-attention-subwords", type=int, default=100, help="/attention: subwords of its sentence")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a request may wait and run (504 past it)")
    p.add_argument("--read-timeout", type=float, default=10.0, help="seconds to receive a request body (408 past it)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds from a connection's start, or its last response, to a request's complete headers; "
                        "a connection past it is closed")
    p.add_argument("--limit-concurrency", type=int, default=256,
                   help="connections and requests at once; 503 above it")
    p.add_argument("--keep-alive", type=float, default=5.0, help="seconds an idle keep-alive connection stays open")
    p.add_argument("--allow-host", action="append", metavar="NAME",
                   help="a Host name (or address) clients use, beside the listening address and localhost; "
                        "repeatable; '*' for any (requests naming another host get 400: DNS rebinding)")
    p.add_argument("--token", help="/translate and /attention need 'Authorization: Bearer TOKEN' "
                                   "(default: $AIAYN_SERVE_TOKEN; none: open to whoever reaches the port)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="as for translate (default auto)")
    p.add_argument("--compile", action="store_true",
                   help="as for translate: the decoder step is compiled before the server listens (default: off)")
    p.add_argument("--shortlist", help="as for translate: a file of `aiayn shortlist` (default: the whole vocabulary)")
    p.set_defaults(func=cmd_serve)


def add_export(sub) -> None:
    """`aiayn export` and its flags."""
    p = sub.add_parser("export", help="export a checkpoint to Hugging Face MarianMTModel or CTranslate2")
    p.add_argument("format", choices=["hf", "ct2"])
    p.add_argument("--quantization", help="ct2 only: int8, int8_float32, float16, ... (CTranslate2's names)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_export)
