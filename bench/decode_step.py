"""Where single-sentence decoding time goes: one beam-4 decoder step, one thread.

Three ways to run the same step of the main job's model (3 decoder layers, d_model 256, 4 beam
rows, a 16-token source), each checked against aiayn's own `decode_step` logits first:

- `aiayn`: `Transformer.decode_step` as `Translator` runs it (growing time-major cache);
- `static`: the step written as one function: one fused QKV product, a fixed-capacity cache
  with a position mask, no module calls (an upper bound on what restructuring alone gives);
- `static-compiled`: that function under `torch.compile` (inductor, static shapes).

Also the time of each projection alone at 4 rows, fp32 and bf16, to set the arithmetic against
the overhead. Medians of 5 runs of 30 steps, printed and written to bench/decode_step.json.

    .venv/bin/python bench/decode_step.py   # [--checkpoint FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from benchdata import CHECKPOINT, trained_checkpoint

from aiayn.checkpoint import load_checkpoint
from aiayn.translate import cast_bf16

ROWS, CAP, SRC_LEN, STEPS = 4, 64, 16, 30


def static_step_fn(model, dtype: torch.dtype, cross: list[tuple[torch.Tensor, torch.Tensor]]):
    """The decoder step of a post-norm model as one function over fixed-size tensors."""
    cfg = model.cfg
    d, h = cfg.d_model, cfg.h
    dk = d // h
    layers = []
    for layer in model.decoder:
        sa, ca, ff = layer.self_attn, layer.cross_attn, layer.ffn

        def w(m):
            return m.weight.detach().to(dtype), m.bias.detach().to(dtype)

        qkv = (torch.cat([sa.w_q.weight, sa.w_k.weight, sa.w_v.weight]).detach().to(dtype),
               torch.cat([sa.w_q.bias, sa.w_k.bias, sa.w_v.bias]).detach().to(dtype))
        norms = [(r.norm.weight.detach(), r.norm.bias.detach()) for r in (layer.res_self, layer.res_cross,
                                                                         layer.res_ffn)]
        layers.append((qkv, w(sa.w_o), w(ca.w_q), w(ca.w_o), w(ff.w_1), w(ff.w_2), norms))
    emb, pe = model.tgt_embed.weight.detach(), model.pe
    out_w = emb.to(dtype)
    kc = [torch.zeros(ROWS, h, CAP, dk, dtype=dtype) for _ in layers]
    vc = [torch.zeros(ROWS, h, CAP, dk, dtype=dtype) for _ in layers]
    ck = [k.to(dtype) for k, _ in cross]
    cv = [v.to(dtype) for _, v in cross]
    scale = 1 / math.sqrt(dk)

    def norm(x, nw):
        return F.layer_norm(x.float(), (d,), nw[0], nw[1]).to(dtype)

    def step(tokens: torch.Tensor, t: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        x = (F.embedding(tokens, emb) * math.sqrt(d) + pe.index_select(0, t)).to(dtype)  # (R, d)
        for i, (qkv_w, so, cq, co, f1, f2, (n1, n2, n3)) in enumerate(layers):
            q, k, v = F.linear(x, *qkv_w).view(ROWS, 3, h, dk).unbind(1)
            kc[i].index_copy_(2, t, k.unsqueeze(2))
            vc[i].index_copy_(2, t, v.unsqueeze(2))
            s = torch.einsum("rhd,rhcd->rhc", q, kc[i]).float() * scale
            a = torch.softmax(s.masked_fill(~seen, float("-inf")), -1).to(dtype)
            x = norm(x + F.linear(torch.einsum("rhc,rhcd->rhd", a, vc[i]).reshape(ROWS, d), *so), n1)
            q = F.linear(x, *cq).view(1, ROWS, h, dk).transpose(1, 2)  # the beams share one source
            a = torch.softmax((q @ ck[i].transpose(-1, -2)).float() * scale, -1).to(dtype)
            x = norm(x + F.linear((a @ cv[i]).transpose(1, 2).reshape(ROWS, d), *co), n2)
            x = norm(x + F.linear(F.relu(F.linear(x, *f1)), *f2), n3)
        return F.linear(x, out_w).float()

    return step


def run_static(step, tokens: torch.Tensor) -> list[torch.Tensor]:
    return [step(tokens[t], torch.tensor([t]), (torch.arange(CAP) <= t)) for t in range(STEPS)]


def run_aiayn(model, src: torch.Tensor, tokens: torch.Tensor, bf16: bool) -> list[torch.Tensor]:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        cache = model.start_decoding(src, group=ROWS)
        return [model.decode_step(tokens[t], cache).float() for t in range(STEPS)]


def median_ms(fn, runs: int = 5) -> tuple[float, list[float]]:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / STEPS * 1e3)
    return statistics.median(times), [round(t, 3) for t in times]


def product_us(rows: int, n_in: int, n_out: int, dtype: torch.dtype, reps: int = 300) -> float:
    x, w = torch.randn(rows, n_in, dtype=dtype), torch.randn(n_out, n_in, dtype=dtype)
    b = torch.randn(n_out, dtype=dtype)
    F.linear(x, w, b)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            F.linear(x, w, b)
        best = min(best, (time.perf_counter() - start) / reps * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(CHECKPOINT))
    ap.add_argument("--out", default=str(Path(__file__).with_name("decode_step.json")))
    args = ap.parse_args()
    ckpt = trained_checkpoint() if args.checkpoint == str(CHECKPOINT) else Path(args.checkpoint)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, cfg, _, _ = load_checkpoint(ckpt, "cpu")
    if cfg.model.pre_norm or cfg.model.learned_positions:
        raise SystemExit("this probe writes out the paper's post-norm, sinusoidal decoder only")
    model.eval()
    src = torch.randint(4, cfg.model.vocab_size, (1, SRC_LEN))
    tokens = torch.randint(4, cfg.model.vocab_size, (STEPS, ROWS))
    out: dict = {"rows": ROWS, "steps": STEPS, "source_tokens": SRC_LEN, "threads": 1, "torch": torch.__version__,
                 "checkpoint": str(ckpt), "step_ms": {}, "max_logit_diff": {}, "product_us": {}}
    with torch.no_grad():
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            bf16 = dtype == torch.bfloat16
            m = cast_bf16(model) if bf16 else model
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                cache = m.start_decoding(src, group=ROWS)
            step = static_step_fn(model, dtype, [(c.cross_k, c.cross_v) for c in cache.layers])
            ref = run_aiayn(m, src, tokens, bf16)
            start = time.perf_counter()
            compiled = torch.compile(step, dynamic=False)
            got = {"static": run_static(step, tokens), "static-compiled": run_static(compiled, tokens)}
            out.setdefault("compile_s", {})[name] = round(time.perf_counter() - start, 1)
            for system, logits in got.items():
                diff = max(float((a - b).abs().max()) for a, b in zip(logits, ref))
                out["max_logit_diff"][f"{system} {name}"] = round(diff, 4)
                if diff > (0.05 if not bf16 else 1.0):  # fp32: rounding only; bf16: 8-bit mantissas
                    raise SystemExit(f"{system} {name} computes something else: logits differ by {diff}")
            systems = {"aiayn": functools.partial(run_aiayn, m, src, tokens, bf16),
                       "static": functools.partial(run_static, step, tokens),
                       "static-compiled": functools.partial(run_static, compiled, tokens)}
            for system, fn in systems.items():
                ms, reps = median_ms(fn)
                out["step_ms"][f"{system} {name}"] = {"median": round(ms, 3), "runs": reps}
                print(f"{system:16s} {name}: {ms:6.3f} ms per step  (runs {reps})", flush=True)
            d, ff, V = cfg.model.d_model, cfg.model.d_ff, cfg.model.vocab_size
            for label, n_in, n_out in (("d x d", d, d), ("d x 3d", d, 3 * d), ("d x d_ff", d, ff),
                                       ("d_ff x d", ff, d), ("d x vocab", d, V)):
                us = product_us(ROWS, n_in, n_out, dtype)
                out["product_us"][f"{label} {name}"] = round(us, 1)
                print(f"  {ROWS} rows, {label:9s} {name}: {us:7.1f} µs", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
