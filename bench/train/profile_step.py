"""Where a training step's time goes: `torch.profiler` over a few updates of the bench's sizes.

Same data, batches and model sizes as bench/train/train_speed.py (the first batches of the prepared
Multi30k EN-DE data, 4,096 tokens each). Prints, per size, the share of the step in each phase
(forward, loss, backward, optimizer) and in each kind of operator (matrix products, casts,
element-wise, normalization, softmax, dropout masks, the loss's reductions), and the top operators
by self time; writes JSON.

    .venv/bin/python bench/train/profile_step.py [--configs small,base] [--precision bf16] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import DATA, prepared_data  # noqa: E402

KINDS = {  # operator name fragments -> kind (first match wins)
    "matmul": ("mm", "linear", "matmul", "baddbmm", "bmm", "_linear_pointwise"),
    "cast/copy": ("_to_copy", "copy_", "to_dense", "clone", "contiguous"),
    "layer norm": ("layer_norm",),
    "softmax": ("softmax",),
    "dropout mask": ("rand", "bernoulli", "ge", "lt"),
    "loss reductions": ("logsumexp", "exp", "scatter", "gather", "mean", "where", "sum"),
    "optimizer": ("_foreach", "addcdiv", "lerp", "sqrt", "norm", "clamp"),
    "element-wise": ("mul", "add", "relu", "threshold", "masked_fill", "div", "sub", "fill_", "zero_"),
    "layout": ("view", "reshape", "transpose", "permute", "expand", "slice", "select", "t", "as_strided",
               "unsqueeze", "empty", "stride", "squeeze", "split", "cat", "index"),
}


def kind_of(name: str) -> str:
    op = name.split("::")[-1]
    for kind, parts in KINDS.items():
        if any(op == p or op.startswith(p) or p in op for p in parts):
            return kind
    return "other"


def profile(size: str, precision: str, steps: int, data_dir: Path, threads: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile
    from train_speed import build

    torch.set_num_threads(threads)
    model, opt, cfg, batches = build(f"aiayn-{precision}", size, data_dir, 3 + steps)
    from aiayn.device import autocast
    from aiayn.training.loss import label_smoothed_loss

    def step(b) -> None:
        model.train()
        with record_function("forward"), autocast(torch.device("cpu"), precision):
            logits = model(b.src, b.tgt_in)
        with record_function("loss"):
            loss, _, _ = label_smoothed_loss(logits, b.tgt_out, 0.1, 0, reuse_logits=True)
        with record_function("backward"):
            (loss / b.n_tokens).backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    for b in batches[:3]:
        step(b)
    start = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches[3:]:
            step(b)
    wall_ms = (time.perf_counter() - start) * 1000 / steps
    events = prof.key_averages()
    phases = {e.key: e.cpu_time_total / 1000 / steps for e in events if e.key in ("forward", "loss", "backward",
                                                                                     "optimizer")}
    kinds: dict[str, float] = defaultdict(float)
    ops = []
    for e in events:
        if e.key in phases or e.self_cpu_time_total <= 0:
            continue
        ms = e.self_cpu_time_total / 1000 / steps
        kinds[kind_of(e.key)] += ms
        ops.append((e.key, ms, e.count // steps))
    ops.sort(key=lambda o: -o[1])
    total = sum(kinds.values())
    return {"size": size, "precision": precision, "step_ms": wall_ms, "profiled_ms": total,
            "tokens": sum(b.n_tokens for b in batches[3:]) / steps, "phases_ms": phases,
            "kinds_ms": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "top_ops": [{"op": k, "ms": ms, "calls": c} for k, ms, c in ops[:25]]}


def show(r: dict) -> None:
    total = r["profiled_ms"]
    print(f"\n{r['size']} {r['precision']}: {r['step_ms']:.0f} ms per step (profiled), "
          f"{r['tokens']:.0f} target tokens per step")
    print("  phase         ms   share")
    for k, ms in r["phases_ms"].items():
        print(f"  {k:<12}{ms:>6.0f}  {100 * ms / r['step_ms']:>5.1f} %")
    print("  kind of op          ms   share")
    for k, ms in r["kinds_ms"].items():
        print(f"  {k:<18}{ms:>6.1f}  {100 * ms / total:>5.1f} %")
    print("  top operators (self time)")
    for o in r["top_ops"][:15]:
        print(f"  {o['op']:<40}{o['ms']:>7.1f} ms {o['calls']:>5} calls")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--configs", default="small,base")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/train/2026-11-23_profile_step.json")
    args = p.parse_args()
    if Path(args.data).resolve() == DATA:
        prepared_data(DATA)
    results = [profile(s, args.precision, args.steps, Path(args.data), args.threads) for s in args.configs.split(",")]
    for r in results:
        show(r)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
