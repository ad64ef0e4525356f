"""Shared by the verbs: one-line errors, config overrides, reading input files."""

from __future__ import annotations

import argparse
import logging
import sys
import unicodedata
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

from ..config import Config
from ..errors import AiaynError
from ..overrides import apply_overrides, load_yaml, preset

log = logging.getLogger("aiayn")


class UserError(AiaynError):
    """An error caused by the user's input; printed as one line, exit status 2."""


def refuse_parser(paths: str | Path | list, verb: str) -> None:
    """A §6.3 parsing checkpoint given to a translation verb: refused in one line, pointing at `aiayn parse`."""
    from ..checkpoint import CheckpointError, read_task

    for p in [paths] if isinstance(paths, (str, Path)) else paths:
        try:
            task = read_task(Path(p)) if Path(p).is_file() else {}
        except CheckpointError:
            continue  # the loader names what is wrong with it
        if task.get("task") == "parse":
            raise UserError(f"{p}: a parsing model (its metadata names the task 'parse'); `aiayn {verb}` is for "
                            f"translation models: parse with `aiayn parse --checkpoint {p}`")


def checkpoint_problem(path: str, folders: bool = False) -> str | None:
    """What is wrong with a --checkpoint argument, read before any model loads: a name that does not
    exist, a run folder or a folder of checkpoints (which file to give instead; `folders`: a folder
    of .safetensors files is what `serve` takes). A folder with a config.json is a pretrained
    Marian model (pretrained.py reads it)."""
    p = Path(path)
    if not p.exists():
        return f"--checkpoint {path}: no such file (checkpoint not found)"
    if not p.is_dir() or (p / "config.json").is_file():
        return None
    if folders and any(p.glob("*.safetensors")):
        return None
    ckpts = p / "checkpoints" if (p / "run.json").is_file() else p
    if (p / "run.json").is_file() or any(ckpts.glob("*.safetensors")):
        names = [n for n in ("best.safetensors", "last.safetensors") if (ckpts / n).is_file()] or \
            sorted(x.name for x in ckpts.glob("*.safetensors"))[-1:]
        which = " or ".join(str(ckpts / n) for n in names) or str(ckpts / "best.safetensors")
        whose, run = ("a folder of checkpoints", p.parent) if ckpts == p else ("a training run", p)
        return (f"--checkpoint {path}: a folder, not a checkpoint file ({whose}'s: give {which} (best: the best "
                f"on validation; last: the newest), or average the last ones, §6.1: aiayn average {run} -o "
                "avg.safetensors)")
    return (f"--checkpoint {path}: a folder without checkpoints (*.safetensors) or a pretrained model's "
            "config.json: give a checkpoint file")


def input_problem(path: str | None) -> str | None:
    """What is wrong with an --input file, read before any model loads (`-` or none: stdin)."""
    if path in (None, "-"):
        return None
    p = Path(path)
    if p.is_dir():
        return f"--input {path}: a folder, not a text file (one sentence per line)"
    return None if p.exists() else f"--input {path}: no such file"


def parse_overrides(extra: list[str]) -> dict[str, str]:
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
    return apply_overrides(cfg, parse_overrides(extra)).validate()


def read_input(path: str | None) -> list[str]:
    """All the lines of a file or stdin (`-` or None), as `input_chunks` reads them."""
    return [x for chunk in input_chunks(path, 1 << 62) for x in chunk]


def input_chunks(path: str | None, size: int) -> Iterator[list[str]]:
    """The lines of a file or stdin (`-` or None), split at "\\n" alone, a trailing "\\r" dropped, NFC,
    `size` at a time, each chunk given as soon as it has been read (a pipe's first lines are
    translated before its writer has finished); invalid UTF-8 is one error naming its line."""
    if path not in (None, "-"):
        p = Path(path)
        if not p.exists() or p.is_dir():
            raise UserError(f"input file not found: {path}")
    name = "<stdin>" if path in (None, "-") else path
    with (open(path, "rb") if path not in (None, "-") else nullcontext(sys.stdin.buffer)) as f:
        chunk: list[str] = []
        for n, raw in enumerate(f, 1):  # split at b"\n" only, as str.split("\n"): never inside a UTF-8 sequence
            try:
                text = raw.removesuffix(b"\n").decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{name}:{n}: invalid UTF-8") from None
            chunk.append(unicodedata.normalize("NFC", text.rstrip("\r")))
            if len(chunk) == size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


def score_lines(hyps: list[str], refs: list[str], hyp_name: str, ref_name: str) -> str:
    from ..score import score

    if len(hyps) != len(refs):
        raise UserError(f"{hyp_name} has {len(hyps)} lines but {ref_name} has {len(refs)}")
    return score(hyps, refs)


def name_the_flag(message: str, flags: dict[str, str]) -> str:
    """Put the flag the user typed in front of an error about the config key behind it."""
    for key, flag in flags.items():
        if message.startswith(key + " ") or message.startswith(key + ":"):
            return f"{flag}: {message}"
    return message


def parse_numbers(text: str, kind: type, flag: str) -> tuple:
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise UserError(f"{flag}: no values in {text!r}")
    return values


def config_epilog(name: str | None = None) -> str:
    """Every config key with its value and one line on what it does, by section, for `--help`: the
    defaults (the paper's base model), or a preset's values when `--preset NAME` is on the line."""
    import textwrap

    from ..overrides import config_keys, descriptions
    from ..presets import PRESETS

    cfg = preset(name) if name in PRESETS else Config()
    whose = f"--preset {name}'s values" if name in PRESETS else "the defaults (the base model; add --preset NAME " \
        "to see a preset's)"
    lines, section, about = [f"config keys, {whose}; override one with --KEY VALUE (e.g. --train.lr_scale 2), "
                             "`aiayn config` prints them as YAML:"], "", descriptions()
    for key, value in config_keys(cfg).items():
        if key.split(".")[0] != section:
            section = key.split(".")[0]
            lines.append(f"  {section}:")
        head = f"    {key} = {value!r}"
        text = textwrap.wrap(about.get(key, ""), 110 - 40) or [""]
        lines.append(f"{head:<40}{text[0]}" if len(head) < 40 else f"{head}\n{'':<40}{text[0]}")
        lines += [f"{'':<40}{x}" for x in text[1:]]
    return "\n".join(lines)


def preset_flag(p: argparse.ArgumentParser) -> None:
    """--preset NAME, its names listed once (a wrong name is one line with the closest: overrides.preset)."""
    from ..presets import PRESETS

    p.add_argument("--preset", metavar="NAME", help=f"a named config: {', '.join(PRESETS)} (presets.py); "
                   "quick: a small model that translates after a few minutes on a laptop")
