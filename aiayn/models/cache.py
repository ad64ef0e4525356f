"""Incremental decoding's state (§3.2.3, §6.1): per decoder layer, the encoder-decoder keys and
values computed once and the self-attention keys and values so far; per search, those layers, the
source mask and each row's first input."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


class LayerCache:
    """Incremental-decoding state of one decoder layer (§3.2.3): the encoder-decoder keys/values,
    computed once from the encoder output, and the self-attention keys/values so far.

    The self-attention keys/values live in preallocated time-major buffers (capacity, rows, h, d):
    a step writes one slab, and reordering the beams copies the filled part once into a second
    buffer (no concatenation, no new allocation per step). Attention reads them as
    (rows, h, t, d) views without copying.
    """

    def __init__(self, cross_k: Tensor, cross_v: Tensor, capacity: int = 64):
        self.cross_k, self.cross_v = cross_k, cross_v  # (B, h, S, d_k), (B, h, S, d_v)
        self.capacity = capacity
        self.n = 0  # positions filled
        self._k: Tensor | None = None  # (capacity, rows, h, d_k)
        self._v: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # the reorder target

    @torch.no_grad()
    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add one position, k (R, h, 1, d_k) and v (R, h, 1, d_v); every position so far as
        (R, h, t, d) views. Decoding is inference: the buffers keep no autograd history."""
        if self._k is None or self.n == self._k.size(0) or self._k.dtype != k.dtype:
            cap = max(self.capacity, 2 * self.n)
            self._k = self._grow(self._k, k, cap)
            self._v = self._grow(self._v, v, cap)
            self._spare = None
        self._k[self.n] = k[:, :, 0]
        self._v[self.n] = v[:, :, 0]
        self.n += 1
        return self._k[:self.n].permute(1, 2, 0, 3), self._v[:self.n].permute(1, 2, 0, 3)

    def _grow(self, buf: Tensor | None, new: Tensor, cap: int) -> Tensor:
        out = new.new_empty(cap, new.size(0), new.size(1), new.size(3))
        if buf is not None and self.n:
            out[:self.n] = buf[:self.n]
        return out

    @torch.no_grad()
    def keep_rows(self, rows: Tensor) -> None:
        """Keep self-attention rows `rows` (indices into the current rows)."""
        if self._k is None or not self.n:
            return
        if self._spare is None or self._spare[0].size(1) != rows.numel():
            shape_k, shape_v = list(self._k.shape), list(self._v.shape)
            shape_k[1] = shape_v[1] = rows.numel()
            self._spare = self._k.new_empty(shape_k), self._v.new_empty(shape_v)
        sk, sv = self._spare
        torch.index_select(self._k[:self.n], 1, rows, out=sk[:self.n])
        torch.index_select(self._v[:self.n], 1, rows, out=sv[:self.n])
        self._spare = (self._k, self._v) if self._k.size(1) == rows.numel() else None
        self._k, self._v = sk, sv


@dataclass
class DecoderCache:
    """State for one-token-at-a-time decoding: per-layer caches, the source mask, the step.

    Each source serves ``group`` consecutive decoder rows (the beams of one sentence), so the
    encoder side is stored once per source, not once per beam.
    """

    layers: list[LayerCache]
    src_mask: Tensor  # (B, 1, 1, S)
    group: int = 1
    step: int = 0
    inputs: list = field(default_factory=list)  # per-row states of a subclass's decoder inputs (input_states)
    first: Tensor | None = None  # (rows,) each row's first input where it is not BOS (model.lang_tag decoder)

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Keep decoder rows `rows` (indices into the current rows), e.g. the surviving beams.

        Rows that keep their source (beams reordered within a sentence) need nothing else; when
        the set of sources changes, `sources` selects them (indices into the current sources),
        and row r of the result must belong to source r // group.
        """
        n = self.src_mask.size(0) if sources is None else sources.numel()
        if rows.numel() != n * self.group:
            raise ValueError(f"{rows.numel()} decoder rows for {n} sources × group {self.group}")
        for c in self.layers:
            c.keep_rows(rows)
            if sources is not None:
                c.cross_k, c.cross_v = c.cross_k.index_select(0, sources), c.cross_v.index_select(0, sources)
        if sources is not None:
            self.src_mask = self.src_mask.index_select(0, sources)
        for s in self.inputs:
            s.reorder(rows)
        if self.first is not None:
            self.first = self.first.index_select(0, rows)
