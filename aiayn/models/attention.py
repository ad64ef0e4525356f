"""Scaled dot-product attention (Eq. 1) and multi-head attention (§3.2.2).

Notation: B batch, h heads, T query length, S key length, d_k / d_v head sizes.
Masks are boolean, broadcastable to (B, h, T, S), True where a query may attend.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .linear import Linear

KERNELS = {"sdpa": True, "explicit": False}  # model.attention's choices besides auto: whether SDPA computes Eq. 1


def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
    dropout_p: float = 0.0, need_weights: bool = False, kernel: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Eq. 1: softmax(Q Kᵀ / √d_k) V.

    q (B, h, T, d_k), k (B, h, S, d_k), v (B, h, S, d_v) -> (B, h, T, d_v), weights (B, h, T, S).
    The fast path is `F.scaled_dot_product_attention` (flash / memory-efficient kernels on GPU);
    ``need_weights`` takes the explicit path and also returns the weights. `kernel` (model.attention):
    sdpa, explicit, or auto, which picks by device and dtype. On the CPU, SDPA is
    only faster for fp32 training (fwd+bwd of (130, 4, 30, 64): 12.4 vs 15.9 ms); in bf16
    training (21.6 vs 4.4 ms) and in inference at every precision the
    explicit path wins (decoding shapes: 1.2-2.5x), so it is the default there (bench/train/attention_cpu.py).
    On a GPU SDPA stays: compiled base training on an H200, explicit was 1.05x at 32 tokens and
    0.92x at 128 (bench/README.md, One GPU).
    """
    sdpa = KERNELS[kernel] if kernel != "auto" else (
        q.device.type != "cpu" or (q.dtype != torch.bfloat16 and torch.is_grad_enabled()))
    T, S = q.size(-2), k.size(-2)
    if causal and (mask is not None or not sdpa or need_weights or T != S):  # SDPA's own: T == S, no mask
        future = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        mask, causal = (future if mask is None else mask & future), False
    if sdpa and not need_weights:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
        return out, None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    out = F.dropout(weights, dropout_p) @ v if dropout_p > 0 else weights @ v
    return out, (weights if need_weights else None)


class MultiHeadAttention(nn.Module):
    """§3.2.2: MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(QW^Q_i, KW^K_i, VW^V_i)."""

    def __init__(self, d_model: int, h: int, d_k: int, d_v: int, dropout: float = 0.0, kernel: str = "auto"):
        super().__init__()
        self.h, self.d_k, self.d_v, self.dropout = h, d_k, d_v, dropout
        self.kernel = kernel  # model.attention: auto (`attention` decides by device and dtype), sdpa or explicit
        self.w_q = Linear(d_model, h * d_k)
        self.w_k = Linear(d_model, h * d_k)
        self.w_v = Linear(d_model, h * d_v)
        self.w_o = Linear(h * d_v, d_model)

    def _split(self, x: Tensor, d: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.h, d).transpose(1, 2)  # (B, h, T, d)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of a memory x (B, S, d_model) -> (B, h, S, d_k), (B, h, S, d_v)."""
        return self._split(self.w_k(x), self.d_k), self._split(self.w_v(x), self.d_v)

    def forward(
        self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Queries from x (B, T, d_model) over projected k, v -> (B, T, d_model), weights."""
        q = self._split(self.w_q(x), self.d_k)  # (B, h, T, d_k)
        p = self.dropout if self.training else 0.0
        out, weights = attention(q, k, v, mask, causal, p, need_weights, self.kernel)  # (B, h, T, d_v)
        B, _, T, _ = out.shape
        return self.w_o(out.transpose(1, 2).reshape(B, T, self.h * self.d_v)), weights

    @torch.no_grad()
    def keep_heads(self, heads: list[int]) -> None:
        """Keep only `heads` (decoding): their rows of W^Q, W^K, W^V and columns of W^O, nothing else."""
        def block(d: int) -> Tensor:
            return torch.cat([torch.arange(i * d, (i + 1) * d) for i in heads])

        for lin, d in ((self.w_q, self.d_k), (self.w_k, self.d_k), (self.w_v, self.d_v)):
            idx = block(d)
            lin.weight = nn.Parameter(lin.weight[idx].clone(), requires_grad=False)
            if lin.bias is not None:
                lin.bias = nn.Parameter(lin.bias[idx].clone(), requires_grad=False)
            lin.out_features = idx.numel()
        idx = block(self.d_v)
        self.w_o.weight = nn.Parameter(self.w_o.weight[:, idx].clone(), requires_grad=False)
        self.w_o.in_features, self.h = idx.numel(), len(heads)


def live_heads(m: MultiHeadAttention) -> list[int]:
    """The heads whose W^O columns are not all zero (`aiayn heads` zeroes those it prunes)."""
    w = m.w_o.weight.detach().view(m.w_o.weight.size(0), m.h, m.d_v)
    return [i for i in range(m.h) if bool(w[:, i].any())]


def without_dead_heads(model: nn.Module) -> tuple[nn.Module, int]:
    """A copy of `model` whose attention sublayers compute only their live heads, and how many
    heads went; the model itself when none is dead. The same function: a head whose W^O columns
    are zero adds nothing to the sublayer's output, so decoding can skip its products."""
    import copy

    live = {name: live_heads(m) for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    dead = sum(model.get_submodule(name).h - len(heads) for name, heads in live.items() if heads)
    if not dead:
        return model, 0
    model = copy.deepcopy(model)
    for name, heads in live.items():
        m = model.get_submodule(name)
        if 0 < len(heads) < m.h:
            m.keep_heads(heads)
    return model, dead
