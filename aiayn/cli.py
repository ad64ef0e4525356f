"""`aiayn` command line: prepare, train, translate, score, average, params."""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from .config import PAPER_PARAMS_M, PRESETS, Config, ConfigError, apply_overrides, load_yaml, preset

log = logging.getLogger("aiayn")


class UserError(Exception):
    """An error caused by the user's input; printed as one line, exit status 2."""


# -- helpers -------------------------------------------------------------------------------
def _parse_overrides(extra: list[str]) -> dict[str, str]:
    """`--train.lr_scale 2 --model.N=4` -> {"train.lr_scale": "2", "model.N": "4"}."""
    out: dict[str, str] = {}
    i = 0
    while i < len(extra):
        arg = extra[i]
        if not arg.startswith("--") or "." not in arg:
            raise UserError(f"unrecognized argument {arg!r} (config overrides look like --train.lr_scale 2)")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        else:
            if i + 1 >= len(extra):
                raise UserError(f"override {arg} needs a value")
            i += 1
            value = extra[i]
        out[key] = value
        i += 1
    return out


def build_config(args: argparse.Namespace, extra: list[str]) -> Config:
    cfg = preset(args.preset) if getattr(args, "preset", None) else Config()
    if getattr(args, "config", None):
        cfg = load_yaml(args.config, cfg)
    return apply_overrides(cfg, _parse_overrides(extra)).validate()


def count_parameters(name: str, vocab_size: int) -> int:
    """Exact trainable-parameter count of a preset at a vocabulary size (built on the meta device)."""
    from .model import Transformer

    cfg = preset(name).model
    cfg.vocab_size = vocab_size
    with torch.device("meta"):
        model = Transformer(cfg)
    return sum(p.numel() for p in model.parameters())


# -- commands ------------------------------------------------------------------------------
def cmd_params(args: argparse.Namespace, extra: list[str]) -> None:
    """Parameter counts of the paper's configurations beside Table 3."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    if args.vocab_size <= 0:
        raise UserError(f"--vocab-size must be positive, got {args.vocab_size}")
    if args.preset:
        n = count_parameters(args.preset, args.vocab_size)
        paper = PAPER_PARAMS_M.get(args.preset)
        if paper:
            print(f"{args.preset}: {n / 1e6:.1f}M (paper {paper}M, {100 * (n / 1e6 - paper) / paper:+.1f}%)")
        print(n)
        return
    names = [n for n in PRESETS if n == "base" or n == "big" or n.startswith("table3")]
    print(f"parameters at a shared vocabulary of {args.vocab_size} (tied embeddings, biased projections)")
    print(f"{'preset':<22}{'params':>14}{'M':>9}{'paper M':>9}{'diff':>8}")
    for name in names:
        n = count_parameters(name, args.vocab_size)
        paper = PAPER_PARAMS_M.get(name)
        diff = f"{100 * (n / 1e6 - paper) / paper:+.1f}%" if paper else ""
        print(f"{name:<22}{n:>14,}{n / 1e6:>9.1f}{paper if paper else '':>9}{diff:>8}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aiayn", description="The Transformer of Attention Is All You Need.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("params", help="parameter counts of base, big and every Table 3 row")
    p.add_argument("--preset", choices=list(PRESETS), help="one preset; prints the exact count last")
    p.add_argument("--vocab-size", type=int, default=37000)
    p.set_defaults(func=cmd_params)

    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        args.func(args, extra)
    except (UserError, ConfigError) as e:
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
