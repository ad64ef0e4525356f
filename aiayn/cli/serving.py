"""`aiayn serve`, `export`, `import`: a trained model over HTTP, as Marian / CTranslate2 files, or
a pretrained Marian model as an aiayn checkpoint."""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
from pathlib import Path

from ..files import check_output_file, check_output_folder
from .common import (
    UserError,
    refuse_parser,
)

log = logging.getLogger("aiayn")


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> None:
    """HTTP API (FastAPI) and a page to try the model."""
    from ..extras import need

    need("fastapi", "serve")
    need("uvicorn", "serve")
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
    paths = _served_checkpoints(args.checkpoint)
    if len(paths) > 1 and args.shortlist:
        raise UserError("--shortlist belongs to one model: not with several checkpoints")
    if not args.max_loaded_mb >= 0:
        raise UserError(f"--max-loaded-mb must be 0 (no bound) or more, got {args.max_loaded_mb}")
    refuse_parser(paths, "serve")
    check_listen(args.host, args.port)
    serve(paths[0] if len(paths) == 1 else paths, args.host, args.port, args.device, limits, args.precision,
          args.compile, args.shortlist, args.step, args.trust_proxy, int(args.max_loaded_mb * 2**20))


def _served_checkpoints(given: list[str]) -> list[str]:
    """--checkpoint's paths: files (or a Marian folder, imported on the fly) as given, a folder of
    .safetensors files as its checkpoints (sorted; `last` and `best` links left out)."""
    out: list[str] = []
    for g in given:
        folder = Path(g)
        if folder.is_dir() and not (folder / "config.json").is_file():
            found = sorted(str(f) for f in folder.glob("*.safetensors") if f.is_file() and not f.is_symlink())
            if not found:
                raise UserError(f"--checkpoint {g}: a folder without .safetensors checkpoints (nor a Marian model)")
            out += found
        else:
            out.append(g)
    return list(dict.fromkeys(out))


def check_listen(host: str, port: int) -> None:
    """Bind HOST:PORT once and let go, before the model loads: a name that does not resolve, an address
    not this machine's, a port out of range or in use is one line, not uvicorn's exit after the load."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
            sock.bind(address)
    except (OSError, UnicodeError, ValueError) as e:  # socket.gaierror is an OSError
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UserError(f"--host {host!r} --port {port}: cannot listen there ({reason})") from None


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


def add_serve(sub) -> None:
    """`aiayn serve` and its flags."""
    p = sub.add_parser("serve", help="translation server with a web page")
    p.add_argument("--checkpoint", required=True, action="append",
                   help="the model; repeated, or a folder of .safetensors checkpoints: one server for them all, each "
                        "request routed by its src and tgt (docs/multilingual.md)")
    p.add_argument("--max-loaded-mb", type=float, default=0.0,
                   help="with several checkpoints: the weights kept loaded at once, in MB; the least recently used "
                        "are unloaded to stay under it (default 0: no bound; a model asked for is always loaded)")
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
                   help="the part of --max-work one client (address) may hold (429 above it; with --trust-proxy, "
                        "the address a proxy on this machine names in X-Forwarded-For)")
    p.add_argument("--trust-proxy", action="store_true",
                   help="behind a reverse proxy on this machine: take the client's address from X-Forwarded-For "
                        "(off: a local client could claim to be many and take many shares)")
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
    p.add_argument("--step", choices=["auto", "modules", "fused", "compiled", "graphed"],
                   help="as for translate: decode.step, the decoder step (default: the checkpoint's)")
    p.set_defaults(func=cmd_serve)


def add_export(sub) -> None:
    """`aiayn export` and its flags."""
    p = sub.add_parser("export", help="export a checkpoint to Hugging Face MarianMTModel or CTranslate2")
    p.add_argument("format", choices=["hf", "ct2"])
    p.add_argument("--quantization", help="ct2 only: int8, int8_float32, float16, ... (CTranslate2's names)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_export)


def cmd_import(args: argparse.Namespace, extra: list[str]) -> None:
    """A MarianMTModel folder (OPUS-MT) -> one aiayn checkpoint (docs/pretrained.md)."""
    from ..checkpoint import CheckpointError, model_tensors, read_extra, save_weights
    from ..pretrained import import_hf

    out = check_output_file(args.output, inputs=(args.folder,))
    try:
        ours = out.exists() and "imported_from" in read_extra(out)
    except CheckpointError:
        ours = False
    if out.exists() and not ours:
        raise UserError(f"--output {out}: exists and is not a checkpoint `aiayn import` wrote; choose a new file")
    model, cfg, tokenizer, provenance = import_hf(Path(args.folder))  # a PretrainedError: one line, exit 2
    save_weights(out, model_tensors(model), cfg, tokenizer, 0, {"task": "translate", **provenance})
    m = cfg.model
    print(f"wrote {out}: d_model {m.d_model}, {m.N}+{m.n_dec} layers, {m.h} heads, activation {m.activation}, "
          f"{m.vocab_size:,} rows (translate with `aiayn translate --checkpoint {out}`)")


def add_import(sub) -> None:
    """`aiayn import` and its flags."""
    p = sub.add_parser("import", help="read a pretrained Hugging Face MarianMTModel (OPUS-MT) into an aiayn checkpoint")
    p.add_argument("format", choices=["hf"])
    p.add_argument("folder", help="a MarianMTModel folder: config.json, model.safetensors, source.spm, target.spm, "
                                  "vocab.json")
    p.add_argument("-o", "--output", required=True, help="the checkpoint to write (.safetensors)")
    p.set_defaults(func=cmd_import)
