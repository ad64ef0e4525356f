"""What word alignments cost at decode time: beam search over test2016 with and without them.

Three ways, same checkpoint, same sentences, one process, alternating (A B C A B C ...), medians:
- `plain`: `Translator.translate_ids` as `aiayn translate` runs it;
- `in-search`: with alignments taken during the search (the fused step's argmax of the alignment
  head), then `Translator.align` turning them into word links, as `translate --alignments` does;
- `after`: the search as in `plain`, then one teacher-forced pass over the chosen translations
  (the way alignments were computed before, and still are for models without the fused step).

    .venv/bin/python bench/align/align_speed.py [--checkpoint runs/multi30k-en-de/averaged.safetensors]
        [--precision auto] [--reps 3] [--out bench/align/2026-11-26_align_speed.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import CHECKPOINT, ROOT, cpu_meta, switches, trained_checkpoint  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default=str(CHECKPOINT))
    p.add_argument("--src", default=str(ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en.gz"))
    p.add_argument("--precision", default="auto")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/align/2026-11-26_align_speed.json")
    args = p.parse_args()
    from aiayn.decode.translator import Translator

    torch.set_num_threads(args.threads)
    t = Translator.load(trained_checkpoint(Path(args.checkpoint)), precision=args.precision)
    with gzip.open(args.src, "rt", encoding="utf-8") as f:
        ids = t.encode_sources(f.read().splitlines())

    def plain():
        t.translate_ids(ids)

    def in_search():
        t.align(ids, t.translate_ids(ids, alignments=True))

    def after():
        hyps = t.translate_ids(ids)
        for h in hyps:  # what the fused step did not keep: the pass computes it
            if h:
                h[0].attended = None
        t.align(ids, hyps)

    ways = {"plain": plain, "in-search": in_search, "after": after}
    plain()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.reps):
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["plain"])
    rows = {k: {"seconds": statistics.median(v), "runs": v, "overhead": statistics.median(v) / base - 1}
            for k, v in times.items()}
    print(f"{len(ids)} sentences, beam {t.decode_cfg.beam}, {t.precision}, {cpu_meta()['label']}")
    for k, r in rows.items():
        runs = ", ".join(f"{x:.2f}" for x in r["runs"])
        print(f"  {k:<10}{r['seconds']:>7.2f} s  {100 * r['overhead']:>+6.1f} %  ({runs})")
    meta = {"checkpoint": str(args.checkpoint), "sentences": len(ids), "precision": t.precision,
            "threads": args.threads, "cpu": cpu_meta(), "switches": switches(t), "date": time.strftime("%Y-%m-%d")}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
