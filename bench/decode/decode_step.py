"""Where single-sentence decoding time goes: beam 4, one thread, one sentence at a time.

For each way `Translator` can decode (fp32, bf16, int8; eager or compiled), the first N
validation sentences are translated one by one and each sentence's time is split into the
encoder (`start_decoding`), the decoder steps (`decode_step`), choosing the candidates
(`search.top_lprobs`), merging finished hypotheses (`search.merge_finished`) and the rest
(tokenization and the search's bookkeeping in Python). Then every matrix product of one step
(per decoder layer: Q|K|V, W^O, the cross-attention's W^Q and W^O, the FFN's two; the output
layer) is timed alone at 4 rows in that precision (floats through the decoder's own product
path, int8 as the bare `torch._int_mm` kernel): their sum times the steps is a floor on what
these kernels cost, whatever the structure around them. Medians of 3 passes; prints and writes
bench/decode/2026-11-22_decode_step.json.

    .venv/bin/python bench/decode/decode_step.py [--checkpoint FILE] [--systems int8-compiled,bf16] [--sentences 100]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import CHECKPOINT, DATA, prepared_data, switches, trained_checkpoint  # noqa: E402

import aiayn.decode.search as search  # noqa: E402
from aiayn.decode.fast import FusedDecoder  # noqa: E402
from aiayn.decode.translator import Translator  # noqa: E402
from aiayn.models.linear import Int8Linear  # noqa: E402

SYSTEMS = ("fp32", "bf16", "bf16-compiled", "int8", "int8-compiled")
PARTS = ("encoder", "decoder step", "top-k", "merge finished")
ROWS = 4


def timed(acc: collections.Counter, calls: collections.Counter, name: str, fn):
    """fn, adding its wall time and calls to acc[name] and calls[name]."""
    def run(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        acc[name] += time.perf_counter() - start
        calls[name] += 1
        return out
    return run


def split_sentences(tr: Translator, lines: list[str], passes: int = 3) -> dict:
    """Milliseconds per sentence, in all and by part (medians over passes), and steps per sentence."""
    acc, calls = collections.Counter(), collections.Counter()
    model = tr.search_model
    model.decode_step = timed(acc, calls, "decoder step", model.decode_step)
    model.start_decoding = timed(acc, calls, "encoder", model.start_decoding)
    top, merge = search.top_lprobs, search.merge_finished
    search.top_lprobs = timed(acc, calls, "top-k", top)
    search.merge_finished = timed(acc, calls, "merge finished", merge)
    try:
        for line in lines[:5]:  # warm-up: kernels, caches, graphs
            tr.translate([line])
        runs = []
        for _ in range(passes):
            acc.clear()
            calls.clear()
            start = time.perf_counter()
            for line in lines:
                tr.translate([line])
            total = time.perf_counter() - start
            parts = {p: 1e3 * acc[p] / len(lines) for p in PARTS}
            parts["rest (tokens, search bookkeeping)"] = 1e3 * total / len(lines) - sum(parts.values())
            runs.append((1e3 * total / len(lines), parts, calls["decoder step"] / len(lines)))
    finally:
        search.top_lprobs, search.merge_finished = top, merge
    ms, parts, steps = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    return {"ms_per_sentence": round(ms, 2), "runs_ms": [round(r[0], 2) for r in runs],
            "steps_per_sentence": round(steps, 2), "parts_ms": {k: round(v, 2) for k, v in parts.items()},
            "step_us": round(1e3 * parts["decoder step"] / steps, 1)}


def product_us(model: FusedDecoder, proj, dtype: torch.dtype, reps: int = 300) -> float:
    """One product of 4 rows alone: best of 3 × reps calls. Floats go through the decoder's own
    product path; int8 times only `torch._int_mm` of int8 rows, the kernel the compiled step calls
    (it fuses the rows' quantization and the rescaling around it)."""
    if isinstance(proj, Int8Linear):
        x = torch.randint(-127, 128, (ROWS, proj.in_features), dtype=torch.int8)
        fn = functools.partial(torch._int_mm, x, proj.w_q)
    else:
        fn = functools.partial(model.linear, torch.randn(ROWS, proj[0].size(1), dtype=dtype), proj, dtype)
    fn()
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps * 1e6)
    return best


def step_products(model: FusedDecoder) -> dict:
    """The step's products at 4 rows, each alone (µs), grouped by kind, and their sum."""
    kinds = collections.defaultdict(list)
    for L in model.layers:
        for kind, p in (("Q|K|V", L.qkv), ("W^O", L.o), ("cross W^Q", L.cq), ("cross W^O", L.co),
                        ("FFN 1", L.f1), ("FFN 2", L.f2)):
            kinds[kind].append(product_us(model, p, model.dtype))
    kinds["output layer"].append(product_us(model, model.out, model.out_dtype))
    out = {k: round(statistics.mean(v), 1) for k, v in kinds.items()}
    return {"each_us": out, "count": sum(len(v) for v in kinds.values()),
            "sum_us": round(sum(sum(v) for v in kinds.values()), 1)}


def measure(ckpt: Path, system: str, lines: list[str]) -> dict:
    precision, compiled = system.split("-")[0], system.endswith("-compiled")
    tr = Translator.load(ckpt, device="cpu", precision=precision, compiled=compiled)
    if not isinstance(tr.search_model, FusedDecoder):
        raise SystemExit(f"{system}: this checkpoint does not decode through the fused step")
    compile_s = tr.compile_now()
    result = split_sentences(tr, lines)
    products = step_products(tr.search_model)
    result |= {"compile_s": round(compile_s, 1), "products": products, "switches": switches(tr),
               "products_ms_per_sentence": round(products["sum_us"] * result["steps_per_sentence"] / 1e3, 2)}
    parts = ", ".join(f"{k} {v:.2f}" for k, v in result["parts_ms"].items())
    print(f"{system:14s} {result['ms_per_sentence']:6.2f} ms/sentence ({result['steps_per_sentence']:.1f} steps): "
          f"{parts}; step {result['step_us']:.0f} µs, its {products['count']} products alone "
          f"{products['sum_us']:.0f} µs = {result['products_ms_per_sentence']:.2f} ms/sentence", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(CHECKPOINT))
    ap.add_argument("--data", default=str(DATA), help="prepared data whose valid.en.txt is translated")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--out", default=str(Path(__file__).with_name("decode_step.json")))
    args = ap.parse_args()
    systems = args.systems.split(",")
    if unknown := set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    ckpt = trained_checkpoint() if args.checkpoint == str(CHECKPOINT) else Path(args.checkpoint)
    data = prepared_data(Path(args.data)) if args.data == str(DATA) else Path(args.data)
    if not (data / "valid.en.txt").is_file():
        raise SystemExit(f"{data}: no valid.en.txt; --data takes a folder made by `aiayn prepare`")
    lines = (data / "valid.en.txt").read_text(encoding="utf-8").splitlines()[:args.sentences]
    torch.set_num_threads(1)
    out = {"beam": 4, "threads": 1, "sentences": len(lines), "torch": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "checkpoint": str(ckpt), "systems": {}}
    for system in systems:
        out["systems"][system] = measure(ckpt, system, lines)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
