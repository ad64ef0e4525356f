"""The fused decoder step (§3.2.3, §6.1) replayed as one CUDA graph: one launch a step instead of ~140.

On a GPU the eager step is bound by the host, not by arithmetic (bench/README.md, fifth visit: 911 ms
of host time to 64 ms of GPU time over a search; `bench/decode_launches.py` counts 141 kernels a base
bf16 step). A CUDA graph records a step's kernels once and launches them all with one call, but only
a step whose every tensor keeps its size and place: so a graphed batch's step attends over the whole
self-attention cache, the positions after the current one masked (Eq. 1 with -inf added to their
scores, which gives them weight 0), with the position a tensor on the device (`n`), and computes every
row of the batch as it started: finished sentences' rows and sources stay, stale, behind the live
prefix (`FusedState.static`). The graph is recorded at a batch's first step and again when its cache
grows; in between each step copies the tokens in, sets the position and replays.

On a CPU the same static step runs eagerly, "replayed" by calling it again on the tensors it was
recorded with (not the state's current ones, as a graph's recorded addresses): the tests check there
what a graph would compute.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger("aiayn")


def static_logits(dec, tokens: Tensor, n: Tensor, ks: list[Tensor], vs: list[Tensor], idx: Tensor,
                  cross: list[tuple[Tensor, Tensor]], pad: Tensor, group: int) -> Tensor:
    """The step at position n (a (1,) tensor) for every row of the buffers: tokens (rows,), caches
    (capacity, rows, h, d), row table idx (capacity, rows) -> logits (rows, V). Sizes never depend on
    n, and nothing is read back to the host (a graph may not wait for the device)."""
    cap, rows = idx.shape
    idx.index_copy_(0, n, torch.arange(rows, device=idx.device).view(1, rows))  # row r's new entry: buffer row r
    # Where each row's positions 0..capacity-1 lie in a buffer seen as (capacity · rows, h, d); a later
    # position's entry may be stale (a dropped row's) or unset (0): masked either way.
    where = (idx + torch.arange(cap, device=idx.device)[:, None] * rows).view(-1)
    later = torch.arange(cap, device=idx.device) > n  # (capacity,)
    mask = torch.zeros(1, cap, dtype=ks[0].dtype, device=idx.device).masked_fill(later, float("-inf"))  # (1, cap)
    x = dec.embed.index_select(0, tokens) * dec.scale + dec.pos.index_select(0, n)
    x = dec._layers(x, lambda y, i, L: _self_attention(dec, y, L, ks[i], vs[i], n, where, mask), cross, pad, group)
    return dec.linear(x, dec.out, dec.out_dtype)


def _self_attention(dec, y: Tensor, L, kc: Tensor, vc: Tensor, n: Tensor, where: Tensor, mask: Tensor) -> Tensor:
    """Eq. 1 over the whole cache (capacity, rows, h, d), position n written first, later ones masked."""
    h, dk, dv = L.heads[:3]
    R, cap = y.size(0), kc.size(0)
    q, k, v = dec.linear(y, L.qkv).split([h * dk, h * dk, h * dv], 1)
    kc.index_copy_(0, n, k.reshape(1, R, h, dk))
    vc.index_copy_(0, n, v.reshape(1, R, h, dv))
    keys = kc.view(-1, h, dk).index_select(0, where).view(cap, R, h, dk)
    values = vc.view(-1, h, dv).index_select(0, where).view(cap, R, h, dv)
    a = F.scaled_dot_product_attention(q.view(R, h, 1, dk), keys.permute(1, 2, 0, 3), values.permute(1, 2, 0, 3),
                                       attn_mask=mask)  # (R, h, 1, d_v)
    return dec.linear(a.reshape(R, h * dv), L.o)


class StepGraph:
    """One batch's step (`static_logits` over a static FusedState), recorded as a CUDA graph on its
    first call and whenever the cache has grown (new buffers), replayed otherwise. Returns the first
    R rows of the graph's output, overwritten by the next step."""

    def __init__(self, dec, state) -> None:
        self.dec, self.state = dec, state
        rows = state.idx.size(1)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=state.idx.device)
        self.n = torch.zeros(1, dtype=torch.long, device=state.idx.device)
        self.recorded: tuple | None = None  # the tensors the graph reads (its addresses)
        self.graph = None
        self.out: Tensor | None = None
        self.cuda = state.idx.device.type == "cuda"

    def __call__(self, tokens: Tensor) -> Tensor:
        st = self.state
        self.tokens[:tokens.numel()] = tokens  # rows past the live ones keep stale tokens: computed, never read
        self.n.fill_(st.n)
        if self.recorded is None or self.recorded[2][0] is not st.k[0]:  # first step, or the cache grew
            self._record()
        self._replay()
        return self.out[:tokens.numel()]

    def _args(self) -> tuple:
        st = self.state
        return (self.tokens, self.n, list(st.k), list(st.v), st.idx, [tuple(kv) for kv in st.cross], st.pad, st.group)

    def _record(self) -> None:
        self.recorded, self.graph = self._args(), None
        if not self.cuda:
            self.out = static_logits(self.dec, *self.recorded)
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # a warm-up run: lazy set-up (cuBLAS workspaces) must not happen in capture
            static_logits(self.dec, *self.recorded)  # (it writes position n as the replay will: the same values)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = static_logits(self.dec, *self.recorded)
        log.debug("decoding step recorded as a CUDA graph (%d rows, capacity %d)", *self.state.idx.shape[::-1])

    def _replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:  # a CPU: the recorded tensors, whatever the state holds now
            self.out.copy_(static_logits(self.dec, *self.recorded))
