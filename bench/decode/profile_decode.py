"""Where beam-4 decoding's time goes: one pass over the test sentences per precision under
`torch.profiler`, each in a process of its own, reported as the operators' shares of the pass's
self CPU time (the products, attention, the search's bookkeeping), with sentences/s of the same
pass (profiling costs some: compare the shares, and take speed from decode_speed.py).

    .venv/bin/python bench/decode/profile_decode.py --checkpoint CKPT --src test.en \
        --precisions fp32,int8 --sentences 400 --out bench/decode/DATE_CLASS_profile.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata
from benchdata import CHECKPOINT, DATA, cpu_meta  # noqa: E402


def worker(args: argparse.Namespace) -> dict:
    from aiayn.decode.translator import Translator

    torch.set_num_threads(args.threads)
    src = Path(args.src).read_text(encoding="utf-8").split("\n")[:args.sentences]
    t = Translator.load(args.checkpoint, precision=args.worker)
    ids = t.encode_sources(src)
    t.translate_ids(ids[:50], beam=4, alpha=0.6)  # warm-up: kernels, caches, allocator
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        t.translate_ids(ids, beam=4, alpha=0.6)
        seconds = time.perf_counter() - start
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]
    return {"precision": t.precision, "sentences": len(src), "seconds": round(seconds, 3),
            "sentences_per_s": round(len(src) / seconds, 1), "self_cpu_s": round(total / 1e6, 3),
            "operators": [{"name": e.key, "calls": e.count, "share": round(e.self_cpu_time_total / total, 4)}
                          for e in top]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    p.add_argument("--src", type=Path, default=DATA / "test_2016_flickr.en.txt")
    p.add_argument("--precisions", default="fp32,int8")
    p.add_argument("--sentences", type=int, default=400)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args)))
        return
    if not args.checkpoint.is_file() or not args.src.is_file():
        raise SystemExit(f"no such file: {args.checkpoint if not args.checkpoint.is_file() else args.src}")
    if args.sentences < 1 or args.threads < 1 or args.top < 1:
        raise SystemExit("--sentences, --threads and --top must be at least 1")
    rows = []
    for precision in args.precisions.split(","):
        cmd = [sys.executable, __file__, "--worker", precision, "--checkpoint", str(args.checkpoint), "--src",
               str(args.src), "--sentences", str(args.sentences), "--threads", str(args.threads), "--top",
               str(args.top)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in res.stdout.split("\n") if x.startswith("RESULT ")), None)
        if res.returncode or line is None:
            raise SystemExit(f"{precision} failed:\n{res.stderr[-3000:]}")
        row = json.loads(line[len("RESULT "):])
        rows.append(row)
        print(f"{precision} (ran {row['precision']}): {row['sentences_per_s']} sentences/s profiled")
        for op in row["operators"]:
            print(f"  {100 * op['share']:5.1f} %  {op['calls']:7d}  {op['name']}")
    if args.out:
        out = {"cpu": cpu_meta(), "torch": torch.__version__, "threads": args.threads,
               "checkpoint": str(args.checkpoint), "rows": rows}
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
