"""The files aiayn writes for itself, damaged in place: does each verb that reads one end in one line?

    .venv/bin/python tests/robustness/damaged_files.py [--out results/robustness/2026-11-29_damaged_files.json]

Builds the workspace of tests/robustness/flag_sweep.py (400 Multi30k pairs, a 4-update run), then for each of
a run's metrics.jsonl, run.json, config.yaml and latest training state and a data folder's
manifest.json puts in its place binary bytes, a JSON list, a JSON number, 100,000-deep nesting, a
folder, a FIFO (a read of it waits for a writer forever), a sparse 3 GiB file or a training state of
~200 KB whose deflated records unpack to 200 MiB, and runs each verb that reads that file (plot curves,
train --resume, tune, average, train, prepare), each case a process of its own in its own copy of the
workspace (tests/cli_forks.py). A case passes when it exits 0, or 2 with no traceback; a timeout is a
hang here (every case is a few seconds' work). Prints a table by file, writes JSON, exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parent))  # flag_sweep, beside it
sys.path.insert(0, str(ROOT / "tests"))  # cli_forks
from cli_forks import run_many  # noqa: E402
from flag_sweep import workspace  # noqa: E402

NESTED = "[" * 100_000 + "]" * 100_000


def _sparse(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(3 << 30)  # no block written: 3 GiB to a reader that reads it whole


@functools.cache
def _deflated_state() -> bytes:
    """What torch.save writes for a 200 MiB tensor of zeros, each zip record deflated: ~200 KB that
    torch.load unpacks into 200 MiB (a bigger claim would take the machine's memory)."""
    import torch

    raw, out = io.BytesIO(), io.BytesIO()
    torch.save({"step": 3, "optimizer": torch.zeros(50 << 20)}, raw)
    with zipfile.ZipFile(raw) as z, zipfile.ZipFile(out, "w") as w:
        for info in z.infolist():
            w.writestr(info.filename, z.read(info.filename), compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


DAMAGE = {
    "binary": lambda p: p.write_bytes(bytes(range(256)) * 2),
    "JSON list": lambda p: p.write_text("[1, 2]\n"),
    "JSON number": lambda p: p.write_text("7\n"),
    "nested": lambda p: p.write_text(NESTED),
    "folder": lambda p: p.mkdir(),
    "FIFO": os.mkfifo,
    "sparse 3 GiB": _sparse,
    "deflated 200 MiB": lambda p: p.write_bytes(_deflated_state()),
}
CKPT = "{w}/run/checkpoints/step-00000004.safetensors"
READERS = {  # each damaged file and the command lines that read it
    "run/metrics.jsonl": [["plot", "curves", "{w}/run", "-o", "{w}/c.png"],
                          ["train", "--resume", "{w}/run", "--train.max_steps", "5"]],
    "run/run.json": [["train", "--resume", "{w}/run", "--train.max_steps", "5"],
                     ["tune", "--checkpoint", CKPT, "--output", "{w}/t.safetensors", "--sentences", "3", "--beams", "1",
                      "--alphas", "0.6"]],
    "run/config.yaml": [["train", "--resume", "{w}/run", "--train.max_steps", "5"], ["average", "{w}/run", "-o",
                                                                                     "{w}/a.safetensors"]],
    "run/checkpoints/step-00000004.state.pt": [["train", "--resume", "{w}/run", "--train.max_steps", "5"]],
    "prep/manifest.json": [["train", "--data", "{w}/prep", "--run-dir", "{w}/run2", "--train.max_steps", "1",
                            "--model.d_model", "32", "--model.d_ff", "64", "--model.h", "4", "--model.N", "2"],
                           ["prepare", "--data-dir", "{w}", "--src", "en", "--tgt", "de", "--train", "train", "--valid",
                            "valid", "-o", "{w}/prep", "--data.vocab_size", "100"]],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = ROOT.parent / "shared/data/multi30k"
    ap.add_argument("--multi30k", default=os.environ.get("AIAYN_DATA", str(shared)))
    ap.add_argument("--timeout", type=int, default=120, help="seconds a case may run before it counts as a hang")
    ap.add_argument("--out", default=str(ROOT / "results" / "robustness" / "damaged_files.json"))
    args = ap.parse_args()
    cases = [(target, kind, argv) for target, verbs in READERS.items() for kind in DAMAGE for argv in verbs]
    with tempfile.TemporaryDirectory(prefix="aiayn-damaged-") as tmp:
        template = Path(tmp) / "template"
        workspace(template, Path(args.multi30k))
        work = []
        for i, (target, kind, argv) in enumerate(cases):
            w = Path(tmp) / str(i)
            shutil.copytree(template, w, symlinks=True)
            victim = w / target
            victim.unlink()
            DAMAGE[kind](victim)
            work.append(([a.replace("{w}", str(w)) for a in argv], w))
        results = run_many(work, jobs=2, timeout=args.timeout)
    rows, failures = [], []
    for (target, kind, argv), r in zip(cases, results, strict=True):
        hang, tb = r.returncode == -14, r.returncode not in (0, 2, -14) or "Traceback" in r.stderr
        last = (r.stderr.strip().splitlines() or [""])[-1][:200]
        rows.append({"file": target, "damage": kind, "verb": " ".join(argv[:2]) if argv[0] == "plot" else argv[0],
                     "exit": r.returncode, "hang": hang, "traceback": tb, "last_line": last})
        if hang or tb:
            failures.append(rows[-1])
    print(f"{'file':<40}{'cases':>7}{'ran':>6}{'1-line errors':>15}{'hangs':>7}{'tracebacks':>12}")
    for target in READERS:
        mine = [r for r in rows if r["file"] == target]
        print(f"{target:<40}{len(mine):>7}{sum(r['exit'] == 0 for r in mine):>6}"
              f"{sum(r['exit'] == 2 and not r['traceback'] for r in mine):>15}{sum(r['hang'] for r in mine):>7}"
              f"{sum(r['traceback'] for r in mine):>12}")
    Path(args.out).write_text(json.dumps({"cases": rows, "failures": len(failures)}, indent=1) + "\n")
    for f in failures:
        print("failure:", f["file"], f["damage"], f["verb"], "->", "hang" if f["hang"] else f["last_line"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
