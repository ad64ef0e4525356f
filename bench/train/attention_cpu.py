"""Attention on the CPU: explicit matmul path vs F.scaled_dot_product_attention.

Why aiayn picks the path it does on the CPU (aiayn/models/attention.py): training (forward+backward,
self-attention over a batch of sentences) and decoding (no gradient; one query per beam over
the cached self-attention keys, or the 4 beams of a sentence over its source). Alternates the
two paths, reports medians over repetitions and their ratio, writes JSON.

    .venv/bin/python bench/train/attention_cpu.py [--out bench/train/2026-11-21_attention_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from aiayn.models.attention import attention


def time_once(sdpa: bool, q, k, v, mask, iters: int) -> float:
    train = q.requires_grad
    start = time.perf_counter()
    with torch.set_grad_enabled(train):
        for _ in range(iters):
            out, _ = attention(q, k, v, mask, kernel="sdpa" if sdpa else "explicit")
            if train:
                out.sum().backward()
    return (time.perf_counter() - start) / iters * 1000


SHAPES = (  # mode, B, h, T (queries), S (keys), d
    ("train", 130, 4, 30, 30, 64), ("train", 64, 8, 60, 60, 64),
    ("decode", 1000, 4, 1, 20, 64), ("decode", 250, 4, 4, 20, 64), ("decode", 1000, 4, 1, 40, 64),
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench/train/2026-11-21_attention_cpu.json")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for mode, B, h, T, S, d in SHAPES:
            train = mode == "train"
            q = torch.randn(B, h, T, d, dtype=dtype, requires_grad=train)
            k, v = (torch.randn(B, h, S, d, dtype=dtype, requires_grad=train) for _ in range(2))
            mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
            mask[: B // 2, :, :, S * 3 // 4:] = False
            for flag in (True, False):
                time_once(flag, q, k, v, mask, 2)  # warm-up
            times = {True: [], False: []}
            for _ in range(args.reps):  # alternate A B A B
                for flag in (True, False):
                    times[flag].append(time_once(flag, q, k, v, mask, 5))
            sdpa, explicit = statistics.median(times[True]), statistics.median(times[False])
            rows.append({"mode": mode, "dtype": str(dtype).split(".")[1], "shape": [B, h, T, S, d], "sdpa_ms": sdpa,
                         "explicit_ms": explicit, "speedup": sdpa / explicit})
    print(f"{'mode':<8}{'dtype':<10}{'B,h,T,S,d':<18}{'sdpa ms':>9}{'explicit ms':>13}{'ratio':>7}")
    for r in rows:
        print(f"{r['mode']:<8}{r['dtype']:<10}{','.join(map(str, r['shape'])):<18}{r['sdpa_ms']:>9.2f}"
              f"{r['explicit_ms']:>13.2f}{r['speedup']:>7.2f}")
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.processor()}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
