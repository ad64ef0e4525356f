"""fp32 linear layers on the CPU: `F.linear` (MKL) vs aiayn's oneDNN path (aiayn/models/linear.py).

Forward + backward of the model's projections at training shapes (4,096 tokens) and the
forward of the output layer at decoding shapes, alternating the two paths; medians of the
repetitions, GFLOP/s and the ratio; writes JSON.

    .venv/bin/python bench/train/linear_cpu.py [--out bench/train/2026-11-22_linear_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from aiayn.models import linear

SHAPES = (  # mode, rows, in, out
    ("train", 4096, 512, 512), ("train", 4096, 512, 2048), ("train", 4096, 2048, 512),
    ("train", 4096, 512, 8000), ("train", 4096, 256, 1024),
    ("decode", 1000, 256, 8000), ("decode", 1000, 256, 256),
)


def time_once(onednn: bool, x, w, b, train: bool, iters: int) -> float:
    start = time.perf_counter()
    with torch.set_grad_enabled(train):
        for _ in range(iters):
            y = linear._OneDNNLinear.apply(x, w, b) if onednn else F.linear(x, w, b)
            if train:
                y.backward(torch.ones_like(y))
    return (time.perf_counter() - start) / iters * 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="bench/train/2026-11-22_linear_cpu.json")
    args = p.parse_args()
    if not linear.onednn_available():
        raise SystemExit("this PyTorch has no oneDNN linear op (or AIAYN_ONEDNN_LINEAR=0)")
    torch.manual_seed(0)
    rows = []
    for mode, n, d_in, d_out in SHAPES:
        train = mode == "train"
        x = torch.randn(n, d_in, requires_grad=train)
        w = torch.randn(d_out, d_in, requires_grad=train)
        b = torch.randn(d_out, requires_grad=train)
        iters = 2 if train else 5
        for flag in (False, True):
            time_once(flag, x, w, b, train, 1)  # warm-up
        times = {False: [], True: []}
        for _ in range(args.reps):  # alternate A B A B
            for flag in (False, True):
                times[flag].append(time_once(flag, x, w, b, train, iters))
        mkl, onednn = statistics.median(times[False]), statistics.median(times[True])
        flops = 2 * n * d_in * d_out * (3 if train else 1)
        rows.append({"mode": mode, "shape": [n, d_in, d_out], "f_linear_ms": mkl, "onednn_ms": onednn,
                     "f_linear_gflops": flops / mkl / 1e6, "onednn_gflops": flops / onednn / 1e6,
                     "speedup": mkl / onednn})
    print(f"{'mode':<8}{'rows,in,out':<18}{'F.linear ms':>12}{'oneDNN ms':>11}{'GFLOP/s':>15}{'ratio':>7}")
    for r in rows:
        print(f"{r['mode']:<8}{','.join(map(str, r['shape'])):<18}{r['f_linear_ms']:>12.1f}{r['onednn_ms']:>11.1f}"
              f"{r['f_linear_gflops']:>7.0f}/{r['onednn_gflops']:<7.0f}{r['speedup']:>7.2f}")
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d")}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
