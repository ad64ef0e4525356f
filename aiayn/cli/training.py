"""`aiayn params`, `train`, `average`, `config`: the model's size, training (§5), averaging (§6.1)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..config import ConfigError
from ..overrides import load_yaml, preset
from ..presets import PAPER_PARAMS_M, PRESETS
from .common import (
    UserError,
    build_config,
    name_the_flag,
    parse_overrides,
    preset_flag,
)

log = logging.getLogger("aiayn")


def count_parameters(name: str, vocab_size: int) -> int:
    """Exact trainable-parameter count of a preset at a vocabulary size (built on the meta device)."""
    from ..models.build import shapes_only
    from ..parsing.model import build_any

    cfg = preset(name).model
    cfg.vocab_size = vocab_size
    with shapes_only():
        model = build_any(cfg)
    return sum(p.numel() for p in model.parameters())


def cmd_params(args: argparse.Namespace, extra: list[str]) -> None:
    """Parameter counts of the paper's configurations beside Table 3."""
    model = preset("base").model
    model.vocab_size = args.vocab_size
    try:
        model.validate()  # the vocabulary checked once (positive, presets.py's MODEL_LIMITS), naming the flag
    except ConfigError as e:
        raise UserError(name_the_flag(str(e), {"model.vocab_size": "--vocab-size"})) from None
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


def cmd_train(args: argparse.Namespace, extra: list[str]) -> None:
    """Train (§5), or continue a run with --resume RUN_DIR (flags and config checked before torch loads)."""
    if args.resume:
        overrides = parse_overrides(extra)
        from ..training.session import train

        train(None, Path(args.data) if args.data else None, Path(args.resume), resume=True, device=args.device,
              overrides=overrides, force_batching=args.force_batching)
        return
    cfg = build_config(args, extra)  # a mistyped preset or key first: it is the first thing on the line
    if not args.data or not args.run:
        raise UserError("train needs --data PREPARED_DIR and --run-dir RUN_DIR (or --resume RUN_DIR)")
    if args.init_from:
        from ..checkpoint import refuse_folder

        refuse_folder(args.init_from)
        if not Path(args.init_from).is_file():
            raise UserError(f"--init-from {args.init_from}: no such checkpoint")
        cfg.train.init_from = str(args.init_from)
    from ..training.session import train

    train(cfg, Path(args.data), Path(args.run), device=args.device)


def cmd_average(args: argparse.Namespace, extra: list[str]) -> None:
    """§6.1: average the last N checkpoints of a run into one model file."""
    from ..checkpoint import check_safetensors_output, list_checkpoints, write_averaged

    if not args.run_dir:
        raise UserError("average needs a run folder: aiayn average RUN_DIR -o OUT (or --run-dir RUN_DIR)")
    paths = list_checkpoints(Path(args.run_dir))
    if not paths:
        raise UserError(f"{args.run_dir}: no checkpoints found (expected checkpoints/step-*.safetensors)")
    if args.last is None:  # the run's own rotation: 5 for base, 20 for big (§6.1)
        try:
            args.last = load_yaml(Path(args.run_dir) / "config.yaml").train.keep_last
        except ConfigError:
            args.last = 5
    if args.last < 1:
        raise UserError(f"--last must be >= 1, got {args.last}")
    if len(paths) < args.last:
        log.warning("only %d checkpoint%s in %s; averaging all of them", len(paths), "s" * (len(paths) > 1),
                    args.run_dir)
    chosen = paths[-args.last:]
    check_safetensors_output(args.output, inputs=tuple(chosen))
    write_averaged(chosen, Path(args.output), progress=True)
    print(f"averaged {len(chosen)} checkpoint{'s' * (len(chosen) > 1)} ({chosen[0].name} .. {chosen[-1].name}) "
          f"-> {args.output}")


def cmd_config(args: argparse.Namespace, extra: list[str]) -> None:
    """Print the resolved config (preset, YAML, overrides) as YAML, usable as --config, each key explained."""
    from ..overrides import commented_yaml

    cfg = build_config(args, extra)
    what = f"--preset {args.preset}" if args.preset else "the defaults (the paper's base model)"
    sys.stdout.write(commented_yaml(cfg, f"aiayn config: {what}{', --config ' + args.config if args.config else ''}"
                                    f"{' and overrides' if extra else ''}; edit it and give it to train --config"))


def add_params(sub) -> None:
    """`aiayn params` and its flags."""
    p = sub.add_parser("params", help="parameter counts of base, big and every Table 3 row")
    p.add_argument("--preset", metavar="NAME", help="one preset (aiayn train --help lists them); prints the exact "
                   "count last")
    p.add_argument("--vocab-size", type=int, default=37000)
    p.set_defaults(func=cmd_params)


def add_train(sub) -> None:
    """`aiayn train` and its flags."""
    p = sub.add_parser("train", help="train a model (config overrides: --train.lr_scale 2 ...)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # epilog: cli.main, by --preset
    p.add_argument("--data", help="prepared data folder (from `aiayn prepare`)")
    p.add_argument("--run-dir", "--run", dest="run",
                   help="run folder for config, logs, metrics and checkpoints (under torchrun, spell it --run-dir)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--init-from", metavar="CKPT",
                   help="fine-tune: start from this checkpoint's model and weights (trained, averaged or imported; "
                        "prepare the data with --tokenizer-from CKPT); e.g. --train.schedule constant "
                        "--train.peak_lr 5e-5 --train.warmup_steps 50")
    preset_flag(p)
    p.add_argument("--config", help="YAML config")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--force-batching", action="store_true",
                   help="with --resume: accept changed data.max_tokens / train.seed / data by continuing from the "
                        "start of the next epoch (otherwise such a resume is refused)")
    p.set_defaults(func=cmd_train, overrides=True)  # --section.key VALUE


def add_average(sub) -> None:
    """`aiayn average` and its flags."""
    p = sub.add_parser("average", help="average the last checkpoints of a run (§6.1)")
    p.add_argument("run_dir", nargs="?", help="run folder (or --run-dir)")
    p.add_argument("--run-dir", "--run", dest="run_dir_flag", help="run folder")
    p.add_argument("--last", type=int, help="how many of the last checkpoints (default: the run's train.keep_last, "
                   "5 for base and 20 for big, §6.1)")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_average)


def add_config(sub) -> None:
    """`aiayn config` and its flags."""
    p = sub.add_parser("config", help="print a resolved config as YAML (usable as --config)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # epilog: cli.main, by --preset
    preset_flag(p)
    p.add_argument("--config", help="YAML config to start from")
    p.set_defaults(func=cmd_config, overrides=True)  # --section.key VALUE
