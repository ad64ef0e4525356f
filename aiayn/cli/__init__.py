"""`aiayn` command line: one entry point, a verb per stage of the data flow (each verb's flags
live beside its command, in the module of its stage)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..errors import AiaynError
from . import analysis, decoding, evidence, preparing, serving, training

log = logging.getLogger("aiayn")
__all__ = ["VERBS", "main"]

# every verb, in the order `aiayn --help` lists them; its flags live beside its command
VERBS = {
    "params": training.add_params, "prepare": preparing.add_prepare, "train": training.add_train,
    "average": training.add_average, "translate": decoding.add_translate, "tune": decoding.add_tune,
    "shortlist": preparing.add_shortlist, "score": decoding.add_score, "parse": decoding.add_parse,
    "plot": analysis.add_plot, "heads": analysis.add_heads, "align": analysis.add_align,
    "serve": serving.add_serve, "export": serving.add_export, "import": serving.add_import,
    "config": training.add_config, "reproduce": evidence.add_reproduce,
}


def _torch_version() -> str:
    """torch's version from its package metadata (importing torch costs 2 s); a torch without
    metadata (a source checkout on the path) still gets a CLI."""
    try:
        return version("torch")
    except PackageNotFoundError:
        return "version unknown: no package metadata"


def main(argv: list[str] | None = None) -> int:
    from ..version import __version__

    parser = argparse.ArgumentParser(prog="aiayn", description="The Transformer of Attention Is All You Need.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"aiayn {__version__} (torch {_torch_version()})")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in VERBS.values():
        add(sub)

    args, extra = parser.parse_known_args(argv)
    if getattr(args, "run_dir_flag", None):  # positional and --run-dir spell the same thing
        if args.run_dir and args.run_dir != args.run_dir_flag:
            parser.error(f"two run folders given: {args.run_dir} and --run-dir {args.run_dir_flag}")
        args.run_dir = args.run_dir_flag
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    if extra and not getattr(args, "overrides", False):  # only prepare, train and config take --section.key
        print(f"aiayn {args.command}: error: unrecognized arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    missing = [p for p in _listed(getattr(args, "checkpoint", None)) if not Path(p).exists()]
    if missing:  # before the verb imports torch (1-4 s): a mistyped name is answered at once
        print(f"aiayn {args.command}: error: --checkpoint {missing[0]}: no such file (checkpoint not found)",
              file=sys.stderr)
        return 2
    try:
        args.func(args, extra)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `aiayn score ... | head -1`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:
        if not meant_for_the_user(e):
            raise
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


def _listed(value: str | list[str] | None) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def meant_for_the_user(e: Exception) -> bool:
    """Whether an error's message is the whole story (it names what and where): no traceback then.
    Every such error is an AiaynError (errors.py)."""
    return isinstance(e, AiaynError)


if __name__ == "__main__":
    sys.exit(main())
