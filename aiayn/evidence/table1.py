"""§4, Table 1: the cost of one layer of each type against sequence length n, measured.

Layer types at width d: self-attention (§3.2.2, explicit Eq. 1 so its n×n weights exist, and
the fused SDPA kernel that never stores them), recurrent (an LSTM), convolutional (kernel k = 3)
and restricted self-attention (each position attends to the r positions around it). For each:
forward + backward time, the activation memory autograd saves for the backward pass (counted
with saved-tensor hooks, so it does not depend on the allocator), sequential steps, and the
maximum path length between positions 0 and n - 1.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from ..config import Config
from ..data.batches import collate, make_batches
from ..models.attention import MultiHeadAttention, attention
from .machine import machine

PAPER = {  # Table 1: complexity per layer / sequential operations / maximum path length
    "self-attention": "O(n²·d) / O(1) / O(1)",
    "self-attention (fused SDPA)": "O(n²·d) / O(1) / O(1)",
    "recurrent (LSTM)": "O(n·d²) / O(n) / O(n)",
    "convolution (k=3)": "O(k·n·d²) / O(1) / O(log_k n) dilated, O(n/k) contiguous",
    "restricted self-attention (r=32)": "O(r·n·d) / O(1) / O(n/r)",
    "attention core (QKᵀ, softmax, AV)": "O(n²·d) of self-attention's, without its 4·n·d² projections",
}


class RestrictedSelfAttention(nn.Module):
    """Table 1's restricted self-attention: query i attends to keys j with |i - j| ≤ r/2, computed
    block-wise (blocks of r/2 positions see their own and the two neighbouring blocks), so the cost
    is O(r·n·d) rather than O(n²·d)."""

    def __init__(self, d: int, h: int, r: int):
        super().__init__()
        self.mha, self.w = MultiHeadAttention(d, h, d // h, d // h), max(1, r // 2)

    def forward(self, x: Tensor) -> Tensor:
        B, n, d = x.shape
        w, m = self.w, self.mha
        nb = math.ceil(n / w)
        x = nn.functional.pad(x, (0, 0, 0, nb * w - n))
        q = m._split(m.w_q(x), m.d_k)  # (B, h, nb·w, d_k)
        k, v = m.project_kv(x)

        def blocks(t: Tensor) -> Tensor:  # (B, h, nb·w, e) -> (B, h, nb, 3w, e): blocks b-1, b, b+1
            t = t.view(B, m.h, nb, w, -1)
            pad = t.new_zeros(B, m.h, 1, w, t.size(-1))
            t = torch.cat([pad, t, pad], 2)
            return torch.cat([t[:, :, :-2], t[:, :, 1:-1], t[:, :, 2:]], 3)

        qi = torch.arange(nb * w, device=x.device).view(nb, w, 1)
        kj = (torch.arange(nb, device=x.device).view(nb, 1, 1) - 1) * w + torch.arange(3 * w, device=x.device)
        mask = ((qi - kj).abs() <= w) & (kj >= 0) & (kj < n)  # (nb, w, 3w)
        out, _ = attention(q.view(B, m.h, nb, w, -1), blocks(k), blocks(v), mask, kernel="explicit")
        out = out.reshape(B, m.h, nb * w, -1).transpose(1, 2).reshape(B, nb * w, -1)[:, :n]
        return m.w_o(out)


class Layer(nn.Module):
    """A function of (B, n, d) over the modules whose parameters it uses."""

    def __init__(self, fn: Callable[[Tensor], Tensor], *modules: nn.Module):
        super().__init__()
        self.fn, self.parts = fn, nn.ModuleList(modules)

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x)


def make_layers(d: int, h: int = 8, r: int = 32, device: torch.device | str | None = None) -> dict[str, Layer]:
    """One layer of each Table 1 type on `device`, each mapping (B, n, d) -> (B, n, d)."""
    with torch.device(device or "cpu"):
        mha = MultiHeadAttention(d, h, d // h, d // h)
        lstm = nn.LSTM(d, d, batch_first=True)
        conv = nn.Conv1d(d, d, kernel_size=3, padding=1)
        restricted = RestrictedSelfAttention(d, h, r)

    def self_attention(x: Tensor, fused: bool) -> Tensor:
        k, v = mha.project_kv(x)
        q = mha._split(mha.w_q(x), mha.d_k)
        out, _ = attention(q, k, v, kernel="sdpa" if fused else "explicit")
        B, _, n, _ = out.shape
        return mha.w_o(out.transpose(1, 2).reshape(B, n, -1))

    def core(x: Tensor) -> Tensor:  # Eq. 1 alone: no projections, the n×n part of the layer's cost
        B, n, _ = x.shape
        q = x.view(B, n, h, d // h).transpose(1, 2)
        return attention(q, q, q, kernel="explicit")[0].transpose(1, 2).reshape(B, n, d)

    return {
        "self-attention": Layer(lambda x: self_attention(x, False), mha),
        "attention core (QKᵀ, softmax, AV)": Layer(core),
        "self-attention (fused SDPA)": Layer(lambda x: self_attention(x, True), mha),
        "recurrent (LSTM)": Layer(lambda x: lstm(x)[0], lstm),
        "convolution (k=3)": Layer(lambda x: conv(x.transpose(1, 2)).transpose(1, 2), conv),
        f"restricted self-attention (r={r})": Layer(restricted, restricted),
    }


def path_length(layer: str, n: int, k: int = 3, r: int = 32) -> int:
    """Hops on the shortest path from input position 0 to output position n - 1: one hop per
    attention layer, per recurrent step, or per stacked convolution / restricted layer."""
    if n <= 1:
        return 0 if layer.startswith("recurrent") else 1
    if layer.startswith(("self-attention", "attention core")):  # every position attends to every other
        return 1
    if layer.startswith("recurrent"):
        return n  # the state passes through n cell steps
    if layer.startswith("convolution"):
        return math.ceil((n - 1) / (k // 2))  # contiguous kernels widen the view by k // 2 per layer
    return math.ceil((n - 1) / (r // 2))


def sequential_steps(layer: str, n: int) -> int:
    """Operations that must wait for the previous one: n cell steps for the recurrence, one
    batched operation for the others."""
    return n if layer.startswith("recurrent") else 1


def saved_bytes(layer: nn.Module, x: Tensor) -> int:
    """Activation bytes autograd keeps for the backward pass of layer(x): each storage once, the
    layer's own parameters not counted."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x)
    del y
    return sum(seen.values())


def quadratic_fit(ns: list[int], ys: list[float]) -> tuple[float, float, float]:
    """y ≈ a·n² + b·n + c by least squares on relative errors (small n count as much as large)."""
    n = np.asarray(ns, dtype=float)
    y = np.asarray(ys, dtype=float)
    design = np.stack([n ** 2, n, np.ones_like(n)], 1) / y[:, None]
    a, b, c = np.linalg.lstsq(design, np.ones_like(y), rcond=None)[0]
    return float(a), float(b), float(c)


def measure_table1(ns: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048), d: int = 512, batch: int = 1,
                   repeats: int = 5, fit_from: int | None = None, device: str | None = None, seed: int = 0
                   ) -> dict:
    """Time, memory, sequential steps and path length per layer and n; log-log slopes (the report
    adds the quadratic fit, `quadratic_fit`)."""

    dev = torch.device(device or "cpu")
    torch.manual_seed(seed)
    layers = make_layers(d, device=dev)
    fit_from = fit_from or ns[-3]  # the asymptotic end: the last three lengths
    out: dict = {"d": d, "batch": batch, "ns": list(ns), "repeats": repeats, "fit_from": fit_from,
                 "device": str(dev), "machine": machine(), "layers": {},
                 "load_average": {"start": list(os.getloadavg())}}  # timings need an otherwise idle machine
    for name, fn in layers.items():
        times, mems = [], []
        for n in ns:
            x = torch.randn(batch, n, d, device=dev, requires_grad=True)
            fn(x).sum().backward()  # warm-up
            runs = []
            for _ in range(repeats * max(1, min(10, 256 // n))):  # short timings are noisy: more of them
                x.grad = None
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(x).sum().backward()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                runs.append(time.perf_counter() - t0)
            times.append(statistics.median(runs) * 1e3)
            mems.append(saved_bytes(fn, x))
        fit = [i for i, n in enumerate(ns) if n >= fit_from] or list(range(len(ns)))
        lx = np.log([ns[i] for i in fit])
        out["layers"][name] = {
            "paper": PAPER.get(name, ""),
            "time_ms": [round(t, 4) for t in times], "memory_bytes": mems,
            "slope_time": float(np.polyfit(lx, np.log([times[i] for i in fit]), 1)[0]) if len(fit) > 1 else 0.0,
            "slope_memory": float(np.polyfit(lx, np.log([mems[i] for i in fit]), 1)[0]) if len(fit) > 1 else 0.0,
            "sequential": [sequential_steps(name, n) for n in ns],
            "path_length": [path_length(name, n) for n in ns],
        }
    out["load_average"]["end"] = list(os.getloadavg())
    return out


# -- the cost of a whole model: training FLOPs per target token -------------------------------
@torch.no_grad()
def flops_per_token(model: torch.nn.Module, data, cfg: Config, batches: int = 4) -> float:
    """Training FLOPs (forward + backward, counted by PyTorch's FlopCounterMode) per target token,
    on the first batches of the validation split."""
    from torch.utils.flop_counter import FlopCounterMode


    total_flops, tokens = 0, 0
    device = next(model.parameters()).device
    model.train()
    for idx in make_batches(data.src_lens, data.tgt_lens, cfg.data.max_tokens, 0, 0)[:batches]:
        b = collate(data, idx).to(device)
        # Under autocast every projection is a plain aten matmul, which the counter knows (a count
        # does not depend on the dtype); the fused recurrent encoder is counted by its formula.
        with torch.enable_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            counter = FlopCounterMode(display=False)
            with counter:
                logits = model(b.src, b.tgt_in)
                logits.float().logsumexp(-1).sum().backward()
        model.zero_grad(set_to_none=True)
        total_flops += counter.get_total_flops() + 3 * _recurrent_encoder_flops(model, b.src, cfg)
        tokens += int((b.tgt_out != cfg.model.pad_id).sum())
    model.eval()
    return total_flops / max(tokens, 1)


def _recurrent_encoder_flops(model: torch.nn.Module, src: torch.Tensor, cfg: Config) -> int:
    """Forward FLOPs of a fused nn.LSTM / nn.GRU encoder, which FlopCounterMode does not see:
    per real token, layer and direction, 2·G·h·(input + h) for G gates (4 LSTM, 3 GRU)."""
    enc = getattr(model, "encoder", None)
    if not isinstance(enc, torch.nn.RNNBase):
        return 0
    gates, h, tokens = (4 if enc.mode == "LSTM" else 3), enc.hidden_size, int((src != cfg.model.pad_id).sum())
    dirs = 2 if enc.bidirectional else 1
    per_token = sum(2 * gates * h * ((enc.input_size if i == 0 else dirs * h) + h) for i in range(enc.num_layers))
    return tokens * dirs * per_token
