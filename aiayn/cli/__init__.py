"""`aiayn` command line: one entry point, a verb per stage of the data flow (each verb's flags
live beside its command, in the module of its stage)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from ..errors import AiaynError
from . import analysis, decoding, distilling, evidence, preparing, scoring, serving, training
from .common import checkpoint_problem, config_epilog, input_problem

log = logging.getLogger("aiayn")
__all__ = ["VERBS", "main"]

# every verb, in the order `aiayn --help` lists them; its flags live beside its command
VERBS = {
    "params": training.add_params, "prepare": preparing.add_prepare, "train": training.add_train,
    "average": training.add_average, "translate": decoding.add_translate, "tune": decoding.add_tune,
    "shortlist": preparing.add_shortlist, "distill": distilling.add_distill, "score": scoring.add_score,
    "parse": decoding.add_parse,
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
    argv = sys.argv[1:] if argv is None else list(argv)
    verb = next((x for x in argv if not x.startswith("-")), None)
    if verb is not None and verb not in VERBS:  # a mistyped verb: one line with the closest
        import difflib

        close = difflib.get_close_matches(verb, VERBS, n=1)
        print(f"aiayn: error: no verb {verb!r}" + (f"; did you mean {close[0]}?" if close else "")
              + f" (verbs: {', '.join(VERBS)})", file=sys.stderr)
        return 2
    chosen = _preset_on(argv)
    for verb in ("train", "config"):  # their --help shows the values of the preset on the line
        sub.choices[verb].epilog = config_epilog(chosen)
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "run_dir_flag", None):  # positional and --run-dir spell the same thing
        if args.run_dir and args.run_dir != args.run_dir_flag:
            parser.error(f"two run folders given: {args.run_dir} and --run-dir {args.run_dir_flag}")
        args.run_dir = args.run_dir_flag
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    unknown = _not_overrides(extra) if getattr(args, "overrides", False) else extra
    flags = [x for x in unknown if x.startswith("-")]
    if flags or (unknown and not getattr(args, "overrides", False)):  # only prepare, train, config: --section.key
        print(f"aiayn {args.command}: error: unrecognized argument{'s' * (len(unknown) > 1)}: {' '.join(unknown)}"
              + suggestion(flags[0] if flags else "", sub.choices[args.command], getattr(args, "overrides", False)),
              file=sys.stderr)
        return 2
    served = args.command == "serve"  # a folder of checkpoints: one server for them all
    problem = next(filter(None, (checkpoint_problem(c, served) for c in _listed(getattr(args, "checkpoint", None)))),
                   None)
    problem = problem or input_problem(getattr(args, "input", None))
    if problem:  # before the verb imports torch (1-4 s) and loads a model: a mistyped name is answered at once
        print(f"aiayn {args.command}: error: {problem}", file=sys.stderr)
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


def _not_overrides(extra: list[str]) -> list[str]:
    """What is left of a verb's extra arguments once its --section.key VALUE pairs are taken out."""
    out, i = [], 0
    while i < len(extra):
        if extra[i].startswith("--") and "." in extra[i].split("=", 1)[0]:
            i += 1 if "=" in extra[i] else 2  # the key's value, whatever it looks like (-1, --)
            continue
        out.append(extra[i])
        i += 1
    return out


def _preset_on(argv: list[str]) -> str | None:
    """The value of --preset NAME / --preset=NAME on a command line, before it is parsed."""
    for i, x in enumerate(argv):
        if x.startswith("--preset="):
            return x.split("=", 1)[1]
        if x == "--preset" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def suggestion(flag: str, verb: argparse.ArgumentParser, overrides: bool) -> str:
    """"; did you mean --beam?" for a flag the verb does not take: the closest of its own flags, and
    for verbs that take config overrides, of the dotted keys (--vocab-size: --data.vocab_size)."""
    import difflib

    from ..overrides import config_keys

    name = flag.split("=", 1)[0]
    if not name.startswith("--"):
        return ""
    options = [o for o in verb._option_string_actions if o.startswith("--")]
    keys = [f"--{k}" for k in config_keys()] if overrides else []
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    if not close and keys:  # --vocab-size: the key whose last part matches, spelled with _ or -
        bare = name[2:].replace("-", "_")
        order = ("--data.", "--train.", "--decode.", "--model.")  # model.vocab_size follows the data's
        same = [k for k in keys if k.rsplit(".", 1)[1] == bare]
        close = sorted(same, key=lambda k: order.index(k[:k.index(".") + 1]))
        close = close[:1] or difflib.get_close_matches(name, keys, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else f" (aiayn {verb.prog.split()[-1]} --help lists its flags)"


def _listed(value: str | list[str] | None) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def meant_for_the_user(e: Exception) -> bool:
    """Whether an error's message is the whole story (it names what and where): no traceback then.
    Every such error is an AiaynError (errors.py)."""
    return isinstance(e, AiaynError)


if __name__ == "__main__":
    sys.exit(main())
