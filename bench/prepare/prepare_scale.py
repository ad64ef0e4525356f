"""`aiayn prepare` on a WMT-sized corpus: wall time, peak resident memory, pairs/s, at two sizes.

The corpus is made here from Multi30k's training set: each line joins two training sentences
(pair k joins sentence k mod n with a partner that changes every n lines, so no two pairs repeat
and deduplication has nothing to hide), giving WMT-like line lengths. Each prepare runs in its
own process (its peak memory is its own) with a 37k vocabulary, as the paper's. The peer is the
same command from an earlier commit (default: the last one before prepare streamed), run on the
same corpus in the same run, so the ratios hold on a noisy shared machine.

    .venv/bin/python bench/prepare/prepare_scale.py [--pairs 1000000,4500000] [--baseline b570e25] [--work DIR]

Corpora and outputs go under --work (default ~/aiayn-work/prepare-scale; about 2 GB at 4.5M pairs).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "multi30k"
CHILD = ("import resource, runpy, sys\n"
         "import aiayn\n"
         "print('CODE', aiayn.__file__, flush=True)\n"
         "sys.argv = ['aiayn', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('aiayn', run_name='__main__')\n"
         "except SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
         "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)\n"
         "sys.exit(code)\n")


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def make_corpus(folder: Path, pairs: int, source: Path) -> Path:
    """train.{en,de} of `pairs` lines (+ valid from Multi30k's validation set); made once."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "done").exists():
        return folder
    en, de = read(source / "train.en.gz"), read(source / "train.de.gz")
    n = len(en)
    for lang, lines in (("en", en), ("de", de)):
        with open(folder / f"train.{lang}", "w", encoding="utf-8") as f:
            for k in range(pairs):
                a = k % n
                b = (a + 1 + k // n) % n
                f.write(f"{lines[a]} {lines[b]}\n")
        shutil.copyfile(source / f"val.{lang}.gz", folder / f"valid.{lang}.gz")
    (folder / "done").write_text("")
    return folder


def baseline_tree(commit: str, work: Path) -> Path:
    """A checkout of `commit` to run the peer from (a git worktree, made once)."""
    tree = work / f"aiayn-{commit}"
    if not (tree / "aiayn").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), commit],
                       check=True, capture_output=True)
    return tree


def run_prepare(code: Path, corpus: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(code)}
    args = ["prepare", "--data-dir", str(corpus), "--src", "en", "--tgt", "de", "--out", str(out),
            "--data.vocab_size", "37000", "--data.max_len", "256"]
    start = time.perf_counter()
    # cwd outside any checkout: `python -c` puts the working directory first on sys.path
    res = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, cwd=out.parent)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"prepare failed ({code}):\n{res.stderr[-3000:]}")
    rss_kb = int(next(x for x in res.stdout.splitlines() if x.startswith("MAXRSS_KB")).split()[1])
    ran = next(x for x in res.stdout.splitlines() if x.startswith("CODE")).split(maxsplit=1)[1]
    if not Path(ran).resolve().is_relative_to(code.resolve()):
        raise SystemExit(f"the child ran {ran}, not the code in {code}")
    manifest = json.loads((out / "manifest.json").read_text())
    tokens = manifest["splits"]["train"]["src_tokens"]
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": round(wall, 1), "peak_rss_gb": round(rss_kb / 2**20, 2), "src_subwords": tokens,
            "train": {k: v for k, v in manifest["splits"]["train"].items() if not k.endswith("tokens")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default="1000000,4500000", help="corpus sizes (comma-separated)")
    p.add_argument("--baseline", default="b570e25", help="the peer's commit; 'none' to skip it")
    p.add_argument("--source", default=os.environ.get("AIAYN_MULTI30K", str(SHARED)), help="Multi30k raw files")
    p.add_argument("--work", default=str(Path.home() / "aiayn-work" / "prepare-scale"))
    p.add_argument("--out", default=str(Path(__file__).with_name("prepare_scale.json")))
    args = p.parse_args()
    work = Path(args.work)
    codes = {"aiayn (this tree)": ROOT}
    if args.baseline != "none":
        codes[f"aiayn {args.baseline}"] = baseline_tree(args.baseline, work)
    rows = []
    for pairs in (int(x) for x in args.pairs.split(",")):
        corpus = make_corpus(work / f"corpus-{pairs}", pairs, Path(args.source))
        for name, code in codes.items():
            r = run_prepare(code, corpus, work / "out")
            r.update(code=name, pairs=pairs, pairs_per_s=round(pairs / r["wall_s"]))
            rows.append(r)
            print(f"{pairs:>9,} pairs  {name:<22} {r['wall_s']:>7.1f} s  {r['peak_rss_gb']:>6.2f} GB peak  "
                  f"{r['pairs_per_s']:>7,} pairs/s  {r['src_subwords'] / 1e6:.0f}M source subwords", flush=True)
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version()},
              "vocab_size": 37000, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
