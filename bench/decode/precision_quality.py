"""Does bf16 autocast train as well as fp32? Same preset, seed, data order and number of updates;
compares the validation loss and perplexity at the end (the target: within 1 %).

    .venv/bin/python bench/decode/precision_quality.py --data work/multi30k-en-de --steps 400
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from aiayn.overrides import preset
from aiayn.training.session import train


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="work/multi30k-en-de")
    p.add_argument("--preset", default="multi30k")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--out", default="bench/decode/2026-11-21_precision_quality.json")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp32", "bf16"):
            cfg = preset(args.preset)
            t = cfg.train
            t.precision, t.max_steps, t.max_minutes = precision, args.steps, 0.0
            t.valid_every, t.valid_bleu_sentences, t.save_every_minutes = 0, 0, 0.0
            start = time.perf_counter()
            train(cfg, Path(args.data), Path(tmp) / precision)
            seconds = time.perf_counter() - start
            metrics = [json.loads(x) for x in (Path(tmp) / precision / "metrics.jsonl").read_text().splitlines()]
            last = [m for m in metrics if "valid_loss" in m][-1]
            rows.append({"precision": precision, "steps": args.steps, "valid_loss": last["valid_loss"],
                         "valid_ppl": last["valid_ppl"], "seconds": seconds})
    fp32, bf16 = rows
    diff = (bf16["valid_loss"] - fp32["valid_loss"]) / fp32["valid_loss"]
    print(f"{'precision':<10}{'steps':>6}{'valid loss':>12}{'valid ppl':>11}{'seconds':>9}")
    for r in rows:
        print(f"{r['precision']:<10}{r['steps']:>6}{r['valid_loss']:>12.4f}{r['valid_ppl']:>11.3f}{r['seconds']:>9.0f}")
    print(f"bf16 validation loss differs from fp32 by {100 * diff:+.2f}%")
    Path(args.out).write_text(json.dumps({"rows": rows, "relative_diff": diff}, indent=1))


if __name__ == "__main__":
    main()
