"""Few-row products of the decoder step: which CPU kernel PyTorch offers is fastest per shape.

A beam-4 step of one sentence multiplies 4 rows by each projection (d x 3d, d x d, d x d_ff,
d_ff x d, d x vocab). Candidates, each as PyTorch ships it:
- fp32: `F.linear` (MKL), oneDNN (`mkldnn._linear_pointwise`, what aiayn uses), MKL with the
  weight prepacked for this row count (`mkl._mkl_linear`);
- bf16: `F.linear` (oneDNN);
- int8: weight-only int8 with bf16 rows (`_weight_int8pack_mm`), and int8 x int8 with one scale
  per row (`_int_mm`, what aiayn's Int8Linear does, row quantization included).
Each time is the median of 5 blocks of 300 calls, in microseconds; one process, one thread count.

    .venv/bin/python bench/decode/fewrow_products.py [--threads 1] [--out bench/decode/2026-11-23_fewrow_products.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F


def median_us(fn, n: int = 300) -> float:
    for _ in range(20):
        fn()
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        blocks.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(blocks)


def candidates(rows: int, k: int, n: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g)
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    s = w.abs().amax(1) / 127
    wq = (w / s[:, None]).round().to(torch.int8)
    wqt = wq.t().contiguous()
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)

    def a8w8():
        sx = x.abs().amax(1, keepdim=True) / 127
        return torch._int_mm((x / sx).round().to(torch.int8), wqt) * sx * s + b

    fns = {"fp32 F.linear": lambda: F.linear(x, w, b),
           "fp32 oneDNN": lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], ""),
           "fp32 MKL prepacked": lambda: torch.ops.mkl._mkl_linear(x, packed, w, b, rows),
           "bf16 F.linear": lambda: F.linear(xb, wb, bb),
           "int8 weight-only (bf16 rows)": lambda: torch._weight_int8pack_mm(xb, wq, s.bfloat16()) + bb,
           "int8 x int8 (_int_mm)": a8w8}
    return {name: round(median_us(fn), 1) for name, fn in fns.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--out", default="bench/decode/2026-11-23_fewrow_products.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    d = args.d_model
    shapes = {"d x 3d": (d, 3 * d), "d x d": (d, d), "d x d_ff": (d, args.d_ff), "d_ff x d": (args.d_ff, d),
              "d x vocab": (d, args.vocab)}
    results = []
    for rows in (1, 4, 16, 64):
        for name, (k, n) in shapes.items():
            us = candidates(rows, k, n)
            best = min(us, key=us.get)
            results.append({"rows": rows, "shape": name, "k": k, "n": n, "us": us, "fastest": best})
            print(f"rows {rows:>3} {name:<10} " + "  ".join(f"{c}={t:.1f}" for c, t in us.items()) + f"  -> {best}",
                  flush=True)
    meta = {"threads": args.threads, "torch": torch.__version__, "cpu": platform.processor() or platform.machine()}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
