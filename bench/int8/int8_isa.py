"""Which int8 product may decode on which CPU: exactness and speed by oneDNN ISA level.

For each level (this CPU as it is, then ONEDNN_MAX_CPU_ISA limited to AVX2, AVX2_VNNI, AVX512_CORE,
AVX512_CORE_VNNI: what a smaller processor runs), in a fresh process each:
- exactness of `torch._int_mm` (int8 x int8 -> int32, the product linear.Int8Linear uses with one
  activation scale per row) against int64 sums, on random and on extreme (127 x 127) operands;
- speed of the decoding shapes (rows x d_model -> outputs of the `multi30k` model) for fp32 (oneDNN,
  what aiayn's Linear runs), `_int_mm` alone, and the two kernels of aiayn's Int8Linear whole
  (row quantization and scaling included): "int_mm" and "fbgemm" (fbgemm's reduce-range dynamic
  linear, 7-bit rows pinned to one range by an anchor row), median of 30 calls.
fbgemm is limited with the level too (FBGEMM_ENABLE_INSTRUCTIONS: AVX2, AVX512 or AVX512_E1).
The rule aiayn takes from it (device.int8_kernel): "int_mm" where VNNI is present, else "fbgemm".

    .venv/bin/python bench/int8/int8_isa.py [--out bench/int8/2026-11-26_int8_isa.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import cpu_meta  # noqa: E402

LEVELS = [None, "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"]
FBGEMM = {"AVX2": "AVX2", "AVX2_VNNI": "AVX2", "AVX512_CORE": "AVX512", "AVX512_CORE_VNNI": "AVX512_E1"}
SHAPES = [(4, 256, 1024), (32, 256, 1024), (128, 1024, 256), (32, 256, 8000)]  # rows, in, out


def _time(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def worker(threads: int) -> dict:
    import torch

    from aiayn.models.linear import Int8Linear

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    errors = {}
    for kind in ("random", "extreme"):
        if kind == "random":
            a = torch.randint(-127, 128, (64, 512), dtype=torch.int8)
            b = torch.randint(-127, 128, (512, 1024), dtype=torch.int8)
        else:
            a, b = torch.full((64, 512), 127, dtype=torch.int8), torch.full((512, 1024), 127, dtype=torch.int8)
        errors[kind] = int((torch._int_mm(a, b).long() - a.long() @ b.long()).abs().max())
    speed = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m, k, n in SHAPES:
            x, w = torch.randn(m, k), torch.randn(n, k)
            xq = torch.randint(-127, 128, (m, k), dtype=torch.int8)
            wq = torch.randint(-127, 128, (k, n), dtype=torch.int8)
            lin = torch.nn.Linear(k, n, bias=False)
            aiayn = {kernel: Int8Linear(lin, kernel) for kernel in ("int_mm", "fbgemm")}
            speed.append({"rows": m, "in": k, "out": n,
                          "fp32_ms": _time(lambda x=x, w=w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none",
                                                                                                [], "")),
                          "int_mm_ms": _time(lambda a=xq, b=wq: torch._int_mm(a, b)),
                          **{f"aiayn_{kernel}_ms": _time(lambda x=x, q=q: q(x)) for kernel, q in aiayn.items()}})
    return {"int_mm_max_error": errors, "exact": not any(errors.values()), "speed": speed,
            "aten_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/int8/2026-11-26_int8_isa.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.threads)))
        return
    print(f"CPU: {cpu_meta()['label']}")
    rows = []
    for level in LEVELS:
        env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS")}
        if level:
            env["ONEDNN_MAX_CPU_ISA"] = level
            env["FBGEMM_ENABLE_INSTRUCTIONS"] = FBGEMM[level]
        out = subprocess.run([sys.executable, __file__, "--worker", "--threads", str(args.threads)], env=env,
                             capture_output=True, text=True, check=True)
        r = {"onednn_max_cpu_isa": level or "(this CPU)", **json.loads(out.stdout.strip().splitlines()[-1])}
        rows.append(r)
        print(f"\n{r['onednn_max_cpu_isa']}: _int_mm exact {r['exact']} (max error {r['int_mm_max_error']})")
        print(f"  {'rows x in -> out':<20}{'fp32':>8}{'_int_mm':>9}{'aiayn int_mm':>13}{'aiayn fbgemm':>13}  (ms)")
        for s in r["speed"]:
            print(f"  {s['rows']:>4} x {s['in']:>4} -> {s['out']:<6}{s['fp32_ms']:>8.3f}{s['int_mm_ms']:>9.3f}"
                  f"{s['aiayn_int_mm_ms']:>13.3f}{s['aiayn_fbgemm_ms']:>13.3f}")
    import torch

    meta = {"cpu": cpu_meta(), "torch": torch.__version__, "threads": args.threads, "date": time.strftime("%Y-%m-%d")}
    Path(args.out).write_text(json.dumps({"meta": meta, "levels": rows}, indent=1))


if __name__ == "__main__":
    main()
