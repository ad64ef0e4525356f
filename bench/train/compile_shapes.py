"""`train.compile`'s batch shapes: eager vs torch.compile on real token-count batches.

Three ways to train on the same Multi30k batches (varied sizes and lengths, as `aiayn train` makes
them): eager; compiled with PyTorch's automatic dynamic shapes (`train.compile`: the model recompiles
once, then runs kernels generic in every dimension); compiled on bucketed batches (`train.compile_buckets`
too: lengths padded to data.batches.bucket_length's ladder, one specialized graph per length). Each
first takes one pass over the batches (the compiles: their time is reported), then passes alternate
(A B C A B C ...); the table gives the median pass's real target tokens/s (padding is work, not
tokens), the graphs compiled, and the padding the buckets add.

    .venv/bin/python bench/train/compile_shapes.py [--data work/multi30k-en-de] [--device cpu|cuda]
        [--preset multi30k] [--batches 16] [--rounds 3] [--out bench/compile_shapes_<cpu class>.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import DATA, ROOT, cpu_meta, prepared_data  # noqa: E402

sys.path.insert(0, str(ROOT))
from aiayn.data.batches import TokenData, bucket_length, collate, make_batches  # noqa: E402
from aiayn.data.prepare import load_manifest  # noqa: E402
from aiayn.device import inductor_cache, resolve_precision  # noqa: E402
from aiayn.models.build import build_model  # noqa: E402
from aiayn.overrides import preset  # noqa: E402
from aiayn.training.optim import make_optimizer  # noqa: E402
from aiayn.training.step import compile_model, train_step  # noqa: E402

VARIANTS = ("eager", "compiled, automatic dynamic shapes (train.compile)",
            "compiled, bucketed (+ train.compile_buckets)")


def runner(variant: str, args, device: torch.device, batches: list):
    """One pass over the batches in this variant; returns (pass function, graphs counter)."""
    cfg = preset(args.preset)
    cfg.model.vocab_size = load_manifest(args.data)["vocab_size"]
    cfg.train.precision = args.precision
    cfg.train.compile = cfg.train.compile_buckets = variant.startswith("compiled, bucketed")
    torch.manual_seed(1)
    model = build_model(cfg.model).to(device)
    opt = make_optimizer(model, cfg.train)
    graphs = [0]

    def counted(gm, example_inputs):  # TorchInductor, counting the graphs it is given
        graphs[0] += 1
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)

    fwd = model
    if variant != "eager":
        real = torch.compile
        torch.compile = lambda m, **kw: real(m, backend=counted, **kw)
        try:
            fwd = compile_model(model) if cfg.train.compile else torch.compile(model)
        finally:
            torch.compile = real
    mine = [collate(batches[0], b, cfg.train.compile) for b in batches[1]]

    def one_pass() -> None:
        for b in mine:
            train_step(fwd, opt, [(b, 1.0)], b.n_tokens, cfg, 1e-4, 1, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return one_pass, graphs, mine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="multi30k")
    ap.add_argument("--precision", default="auto", help="auto: what `aiayn train` picks on this device")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    args.data = prepared_data(args.data)
    device = torch.device(args.device)
    args.precision = resolve_precision(args.precision, device)[0]
    inductor_cache()
    data = TokenData(args.data, "train")
    idx = make_batches(data.src_lens, data.tgt_lens, args.max_tokens, 1, 0)[:args.batches]
    runners = {v: runner(v, args, device, (data, idx)) for v in VARIANTS}
    res: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_meta(),
                 "torch": torch.__version__, "command": " ".join(sys.argv), "preset": args.preset,
                 "precision": args.precision, "batches": len(idx), "max_tokens": args.max_tokens,
                 "lengths": sorted({bucket_length(max(data.src_lens[b].max(), data.tgt_lens[b].max())) for b in idx}),
                 "target_tokens_per_pass": int(sum(data.tgt_lens[b].sum() for b in idx)), "variants": {}}
    plain, padded = (sum(x.src.numel() + x.tgt_in.numel() for x in runners[v][2]) for v in (VARIANTS[0], VARIANTS[2]))
    res["bucket_padding"] = round(padded / plain - 1, 4)  # tokens the buckets add, both sides
    out = args.out or Path(__file__).with_name("compile_shapes.json")
    for v, (one_pass, graphs, _) in runners.items():
        began = time.perf_counter()
        one_pass()  # compiles, for the compiled variants
        res["variants"][v] = {"first_pass_s": round(time.perf_counter() - began, 2), "graphs": graphs[0], "seconds": []}
        print(f"{v}: first pass {res['variants'][v]['first_pass_s']} s, {graphs[0]} graphs", flush=True)
        write(out, res)  # a run cut short (a GPU session's time limit) keeps what it measured
    for _ in range(args.rounds):
        for v, (one_pass, _, _) in runners.items():
            began = time.perf_counter()
            one_pass()
            res["variants"][v]["seconds"].append(round(time.perf_counter() - began, 3))
        write(out, res)
    for v, row in res["variants"].items():
        print(f"{v:50s} {row['tgt_tok_s']:>10.0f} tok/s  {row['vs_eager']:.3f}x eager  graphs {row['graphs']}  "
              f"first pass {row['first_pass_s']} s")
    print(f"bucket padding: +{100 * res['bucket_padding']:.1f} % tokens; lengths {res['lengths']}")
    print(f"wrote {out}")


def write(out: Path, res: dict) -> None:
    """The result so far: each variant's rate from the passes it has timed (median), against eager's."""
    for row in res["variants"].values():
        if row["seconds"]:
            row["tgt_tok_s"] = round(res["target_tokens_per_pass"] / statistics.median(row["seconds"]), 1)
            eager = res["variants"]["eager"].get("tgt_tok_s")
            row["vs_eager"] = round(row["tgt_tok_s"] / eager, 3) if eager else None
    out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
