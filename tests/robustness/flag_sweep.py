"""Every flag of the command line, and every config key, given odd values: does each end in one line?

    .venv/bin/python tests/robustness/flag_sweep.py [--verbs translate,tune] [--short] [--out
        results/robustness/2026-11-29_flag_sweep.json]

Builds a small workspace (400 Multi30k pairs prepared with a 100-subword vocabulary, a 4-update
model), then runs `aiayn VERB BASE-ARGS --FLAG VALUE` for every flag of every swept verb and each
odd value (empty, -1, 0, 1e309, nan, a 30-digit number, a missing path, a folder, /dev/null, a binary
file), every config key through `aiayn config`, and the keys that only matter at run time through a
1-update `aiayn train`. Each is a process of its own (tests/cli_forks.py: forks of one that imported
torch once). A case passes when it exits 0, or 2 with no traceback; a timeout is reported apart
(a slow but valid run). Prints a table by verb, writes the failures as JSON, exits 1 if any.
`serve` runs with --port 0 under a 10 s alarm: a case that reached "Uvicorn running on" counts as run.
`marian`: `aiayn import hf` of an exported MarianMTModel folder whose config.json / tokenizer_config.json
has one key set to an odd JSON value (or removed), as a downloaded folder may. `ckpt`: each metadata field
of the model (and of the run's last checkpoint) set to an odd string, under every verb that reads one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from cli_forks import run_many  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from aiayn import cli  # noqa: E402
from aiayn.overrides import config_keys  # noqa: E402

ODD = ["", "-1", "0", "1e309", "nan", "9" * 30, "{w}/nothere", "{w}", "/dev/null", "{w}/prep/train.src.tok.npy"]
ODD_KEY = ["-1", "0", "1e309", "nan", "9" * 30, "", "true", "[1, 2]", "{a: 1}"]
TINY = ["--model.d_model", "32", "--model.d_ff", "64", "--model.h", "4", "--model.N", "2", "--train.max_steps", "1",
        "--train.precision", "fp32", "--train.tokens_per_update", "0", "--data.max_tokens", "400",
        "--train.valid_every", "0", "--train.threads", "1", "--data.vocab_size", "100", "--model.vocab_size", "100"]
RUNTIME = ["data.max_tokens", "data.max_len", "train.threads", "train.log_every", "train.keep_last",
           "train.valid_bleu_sentences", "train.update_freq", "train.warmup_steps", "model.max_positions",
           "train.save_every", "train.guided_layer", "train.guided_head", "model.pad_id", "train.seed",
           "train.max_epochs", "train.patience", "decode.max_len_b", "decode.beam", "model.d_k", "model.N_dec"]
M, PREP = "{w}/m.safetensors", "{w}/prep"
BASE = {  # a valid command line per verb; each flag is then given each odd value
    "translate": ["--checkpoint", M, "--input", "{w}/in.txt", "--output", "{w}/o.txt"],
    "score": ["--hyp", "{w}/h.txt", "--ref", "{w}/r.txt"],
    "average": ["{w}/run", "-o", "{w}/avg.safetensors"],
    "tune": ["--checkpoint", M, "--data", PREP, "--output", "{w}/t.safetensors", "--sentences", "5"],
    "shortlist": ["--data", PREP, "-o", "{w}/sl.safetensors"],
    "align": ["--checkpoint", M, "--data", PREP, "-o", "{w}/al.safetensors"],
    "params": ["--preset", "base"],
    "prepare": ["--data-dir", "{w}", "--src", "en", "--tgt", "de", "--train", "train", "--valid", "valid", "-o",
                "{w}/prep2", "--data.vocab_size", "100"],
    "heads": ["--checkpoint", M, "--data", PREP, "-o", "{w}/heads", "--sentences", "5", "--bleu-sentences", "5"],
    "parse": ["--checkpoint", M, "--input", "{w}/in.txt"],
    "plot": ["attention", "--checkpoint", M, "--src", "a dog", "-o", "{w}/pl"],
    "export": ["hf", "--checkpoint", M, "-o", "{w}/ex"],
    "reproduce": ["--suite", "table1", "--report", "{w}/rep", "--render-only"],
    "import": ["hf", "{w}/hf", "-o", "{w}/imp.safetensors"],
    "serve": ["--checkpoint", M, "--port", "0"],  # port 0: the system picks one, so cases never collide
}
SERVE_S = 10  # a valid serve case serves until this alarm; it counts as run once uvicorn said it listens
META_ODD = ["", "-1", "1e999", "9" * 30, "[" * 100_000 + "]" * 100_000, "[1, 2]", '{"a": 1}', "null", "nan"]
META_READERS = [["translate", *BASE["translate"]], ["tune", *BASE["tune"]], ["align", *BASE["align"]],
                ["export", *BASE["export"]], ["plot", *BASE["plot"]], ["average", *BASE["average"]],
                ["parse", *BASE["parse"]], ["train", "--resume", "{w}/run", "--train.max_steps", "5"],
                ["train", "--data", PREP, "--run-dir", "{w}/ft", "--init-from", M, *TINY]]
ODD_JSON = [-1, 0, 1e308, 10 ** 30, "", None, True, [1, 2], {"a": 1}, "nan", "<drop>"]  # "<drop>": key removed
SKIP = {"--device", "--mirror", "--corpus"}  # devices this machine lacks; the network


def workspace(w: Path, multi30k: Path) -> None:
    """400 training and 20 validation pairs, prepared; a 4-update model; small text files."""
    w.mkdir(parents=True)
    for split, name, n in (("train", "train", 400), ("valid", "val", 20)):
        for lang in ("en", "de"):
            with gzip.open(multi30k / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                (w / f"{split}.{lang}").write_text("".join(next(f) for _ in range(n)))
    aiayn = [sys.executable, "-m", "aiayn"]
    for argv in (["prepare", "--data-dir", w, "--src", "en", "--tgt", "de", "--train", "train", "--valid", "valid",
                  "-o", w / "prep", "--data.vocab_size", "100"],
                 ["train", "--data", w / "prep", "--run-dir", w / "run", *TINY[:-2], "--train.max_steps", "4",
                  "--train.save_every", "2"]):
        subprocess.run([*aiayn, *map(str, argv)], check=True, capture_output=True, cwd=w)
    shutil.copy(w / "run/checkpoints/step-00000004.safetensors", w / "m.safetensors")
    subprocess.run([*aiayn, "export", "hf", "--checkpoint", str(w / "m.safetensors"), "-o", str(w / "hf")],
                   check=True, capture_output=True, cwd=w)
    (w / "in.txt").write_text("a dog runs\ntwo men\n")
    for name in ("h.txt", "r.txt"):
        (w / name).write_text("".join((w / "valid.de").read_text().splitlines(keepends=True)[:5]))


def flags(verb: str) -> list[tuple[str | None, str]]:
    """(sub-verb or None, the flag's longest spelling) for every flag of a verb that takes a value."""
    parser = argparse.ArgumentParser(prog="aiayn")
    cli.VERBS[verb](parser.add_subparsers(dest="command"))
    out = []
    for action in parser._subparsers._group_actions[0].choices[verb]._actions:
        nested = action.choices.items() if isinstance(action, argparse._SubParsersAction) else [(None, None)]
        for sub, p in nested:
            for a in (p._actions if p else [action]):
                if a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction):
                    out.append((sub, max(a.option_strings, key=len)))
    return out


def cases(verbs: list[str], short: bool, template: Path) -> list[tuple[str, list[str], tuple | None]]:
    """(verb, argv, edit) per case; edit is (file, key, JSON value) to write into the case's copy first."""
    odd, odd_key = (ODD[:3], ODD_KEY[:3]) if short else (ODD, ODD_KEY)
    out = []
    for verb in [v for v in verbs if v in BASE]:
        for sub, flag in flags(verb):
            if flag in SKIP or (sub and sub != BASE[verb][0]):
                continue
            for value in odd:
                argv = list(BASE[verb])
                if flag in argv:
                    argv[argv.index(flag) + 1] = value
                else:
                    argv += [flag, value]
                out.append((verb, [verb, *argv], None))
    if "config" in verbs:
        out += [("config", ["config", f"--{key}", v], None) for key in config_keys() for v in odd_key]
    if "train" in verbs:
        out += [("train", ["train", "--data", PREP, "--run-dir", "{w}/nr", *TINY, f"--{key}", v], None)
                for key in RUNTIME for v in ["9" * 30, "-1", "0", "1e309", "1000000"][:3 if short else 5]]
    if "ckpt" in verbs:  # a checkpoint's header is untrusted: each metadata field, odd, under each reader
        with safe_open(str(template / "m.safetensors"), "pt") as f:
            keys = list(f.metadata())
        out += [("ckpt", argv, ("<meta>", key, v)) for key in keys for v in (META_ODD[:3] if short else META_ODD)
                for argv in META_READERS]
    if "marian" in verbs:  # a downloaded MarianMTModel folder is untrusted: each key of its JSON files, odd
        for name in ("config.json", "tokenizer_config.json"):
            keys = json.loads((template / "hf" / name).read_text())
            out += [("marian", ["import", *BASE["import"]], (name, key, v))
                    for key in keys for v in (ODD_JSON[:3] if short else ODD_JSON)]
    return out


def edit_meta(w: Path, key: str, value: str) -> None:
    """One metadata field of the model file and of the run's last checkpoint set to VALUE."""
    for path in (w / "m.safetensors", w / "run/checkpoints/step-00000004.safetensors"):
        with safe_open(str(path), "pt") as f:
            meta = {**f.metadata(), key: value}
        save_file(load_file(path), path, meta)


def edit_json(path: Path, key: str, value) -> None:
    data = json.loads(path.read_text())
    if value == "<drop>":
        data.pop(key)
    else:
        data[key] = value
    path.write_text(json.dumps(data))


def tally(todo: list, results: dict) -> tuple[dict, list, list, dict]:
    """Each case's kind (ran, one-line error, timeout, traceback) counted by verb; the failures, the
    timeouts and the odd values a verb took without a word (`VERB_accepted`: a flag case's argv, a file
    edit's key and value), kept to be read and to tell two runs apart."""
    table, failures, slow, accepted = {}, [], [], {}
    for i, (verb, argv, edit) in enumerate(todo):
        r = results[i]
        row = table.setdefault(verb, {"cases": 0, "ran": 0, "one_line_errors": 0, "timeouts": 0, "tracebacks": 0})
        row["cases"] += 1
        listening = verb == "serve" and r.returncode == -14 and "Uvicorn running on" in r.stderr
        kind = ("ran" if listening else "timeouts" if r.returncode == -14 else "tracebacks"
                if r.returncode not in (0, 2) or "Traceback" in r.stderr else "ran" if r.returncode == 0
                else "one_line_errors")
        row[kind] += 1
        case = {"argv": argv, **({"edit": list(edit)} if edit else {})}
        if kind == "tracebacks":
            failures.append({**case, "returncode": r.returncode, "stderr_tail": r.stderr[-600:]})
        elif kind == "timeouts":  # kept, to tell a slow valid run from a hang
            slow.append({**case, "stderr_tail": r.stderr[-300:]})
        elif kind == "ran":  # an odd value taken without a word: kept to judge it harmless, and to compare runs
            accepted.setdefault(f"{verb}_accepted", []).append(
                argv if not edit else [*edit, argv[0]] if verb == "ckpt" else list(edit))
    return table, failures, slow, accepted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbs", default=",".join([*BASE, "config", "train", "marian", "ckpt"]))
    ap.add_argument("--multi30k", default=os.environ.get("AIAYN_DATA", str(ROOT.parent / "shared/data/multi30k")))
    ap.add_argument("--short", action="store_true", help="3 values a flag (for the tests)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=90, help="seconds a case may run (a valid one may be slow)")
    ap.add_argument("--out", default=str(ROOT / "results" / "robustness" / "flag_sweep.json"))
    args = ap.parse_args()
    verbs = [v for v in args.verbs.split(",") if v]
    unknown = [v for v in verbs if v not in BASE and v not in ("config", "train", "marian", "ckpt")]
    if unknown:
        print(f"flag_sweep: error: verbs not swept: {', '.join(unknown)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="aiayn-sweep-") as tmp:
        template = Path(tmp) / "template"
        workspace(template, Path(args.multi30k))
        todo = cases(verbs, args.short, template)
        work = []
        for i, (_, argv, edit) in enumerate(todo):  # each case in its own copy: what one writes, another never sees
            w = Path(tmp) / str(i)
            shutil.copytree(template, w, symlinks=True)
            if edit and edit[0] == "<meta>":
                edit_meta(w, edit[1], edit[2])
            elif edit:
                edit_json(w / "hf" / edit[0], edit[1], edit[2])
            work.append(([a.replace("{w}", str(w)) for a in argv], w))
        serving = [i for i, (verb, _, _) in enumerate(todo) if verb == "serve"]
        rest = [i for i in range(len(todo)) if i not in set(serving)]
        results = {}
        for group, timeout in ((rest, args.timeout), (serving, SERVE_S)):
            if group:
                results |= dict(zip(group, run_many([work[i] for i in group], jobs=args.jobs, timeout=timeout)))
    table, failures, slow, accepted = tally(todo, results)
    print(f"{'verb':<10}{'cases':>7}{'ran':>6}{'1-line errors':>15}{'timeouts':>10}{'tracebacks':>12}")
    for verb, row in table.items():
        print(f"{verb:<10}{row['cases']:>7}{row['ran']:>6}{row['one_line_errors']:>15}{row['timeouts']:>10}"
              f"{row['tracebacks']:>12}")
    found = {"by_verb": table, "failures": failures, "timeouts": slow, **accepted}
    Path(args.out).write_text(json.dumps(found, indent=1) + "\n")
    for f in failures:
        last = f["stderr_tail"].strip().splitlines()[-1][:200]
        print("traceback:", " ".join(f["argv"])[:200], f.get("edit", ""), "->", last)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
