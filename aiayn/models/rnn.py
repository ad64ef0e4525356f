"""The recurrent encoder-decoders with attention that the Transformer replaced (§1-2; Table 2's
recurrent baselines): a bidirectional LSTM (or GRU) encoder and a decoder of the same cell, in
the two designs the literature names:

- ``luong`` (Luong et al., 2015, §3): the decoder runs first, its new top state h_t queries the
  encoder states (dot, general or concat = additive score), h̃_t = tanh(W_c[c_t; h_t]) predicts
  y_t and is fed to the next step's input (input feeding, §3.3);
- ``bahdanau`` (Bahdanau et al., 2015, §3.1 and A.2): the previous state s_{t-1} queries the
  encoder states with the additive score, the context c_t enters the cell beside the embedding,
  and a deep output t = maxout(U_o s_t + V_o E y_{t-1} + C_o c_t) predicts y_t (Eq. 4).

Notation: B sources, R = B·g decoder rows (g beams per source), S source length, T target
length, d = d_model (embedding, hidden and attention size), L = N layers per stack. The model
keeps the contract of search.py (`start_decoding`, `decode_step`, `cache.reorder`), so the one
beam search serves both architectures; the shared embedding matrix is also the output
projection, as §3.4 does for the Transformer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..config import ModelConfig
from ..device import lstm_bf16
from .linear import Linear
from .transformer import AttentionMaps, Dropout, OutputProjection


# -- attention -------------------------------------------------------------------------------
class AdditiveAttention(nn.Module):
    """Bahdanau et al. (2015), Eq. 6 and §A.1.2: score(q, k_j) = vᵀ tanh(W q + U k_j)."""

    def __init__(self, d: int):
        super().__init__()
        self.W = Linear(d, d, bias=False)
        self.U = Linear(d, d)
        self.v = Linear(d, 1, bias=False)

    def keys(self, memory: Tensor) -> Tensor:
        """U k_j for every encoder state, computed once per source: (B, S, d)."""
        return self.U(memory)

    def scores(self, q: Tensor, keys: Tensor) -> Tensor:
        """q (B, g, d), keys (B, S, d) -> scores (B, g, S)."""
        return self.v(torch.tanh(self.W(q).unsqueeze(2) + keys.unsqueeze(1))).squeeze(-1)


class MultiplicativeAttention(nn.Module):
    """Luong et al. (2015), Eq. 8: score(q, k_j) = qᵀ k_j ("dot") or qᵀ W_a k_j ("general")."""

    def __init__(self, d: int, general: bool):
        super().__init__()
        self.W_a = Linear(d, d, bias=False) if general else None

    def keys(self, memory: Tensor) -> Tensor:
        """k_j, or W_a k_j once per source: (B, S, d)."""
        return memory if self.W_a is None else self.W_a(memory)

    def scores(self, q: Tensor, keys: Tensor) -> Tensor:
        return torch.bmm(q, keys.transpose(1, 2))  # (B, g, S)


def attend(scores: Tensor, mask: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax over the real source positions, then the weighted sum of encoder states (the
    context vector c_t): scores (B, g, S), mask (B, S) -> context (B, g, d), weights (B, g, S)."""
    weights = torch.softmax(scores.float().masked_fill(~mask.unsqueeze(1), float("-inf")), dim=-1)
    return torch.bmm(weights.to(memory.dtype), memory), weights


# -- recurrent cells -----------------------------------------------------------------------------
class LSTMCell(nn.Module):
    """One LSTM step (Hochreiter & Schmidhuber, 1997, with a forget gate): i, f, g, o from
    W x + U h + b; c' = f·c + i·g; h' = o·tanh(c'). The state stays fp32 under bf16 autocast."""

    def __init__(self, d_in: int, d: int):
        super().__init__()
        self.ih = Linear(d_in, 4 * d)
        self.hh = Linear(d, 4 * d, bias=False)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        h, c = state
        i, f, g, o = (self.ih(x) + self.hh(h)).float().chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class GRUCell(nn.Module):
    """One GRU step (Cho et al., 2014): r, z gates; n = tanh(W_n x + r·(U_n h)); h' = (1-z)·n + z·h."""

    def __init__(self, d_in: int, d: int):
        super().__init__()
        self.ih = Linear(d_in, 3 * d)
        self.hh = Linear(d, 3 * d)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor | None]) -> tuple[Tensor, None]:
        h = state[0]
        xr, xz, xn = self.ih(x).float().chunk(3, -1)
        hr, hz, hn = self.hh(h).float().chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return (1 - z) * torch.tanh(xn + r * hn) + z * h, None


# -- incremental state ---------------------------------------------------------------------------
@dataclass
class RecurrentCache:
    """Decoding state: per-layer hidden (and LSTM cell) states and the input-feeding vector of
    each decoder row (luong; zeros for bahdanau); the encoder states and attention keys once per
    source."""

    memory: Tensor  # (B, S, d)
    keys: Tensor  # (B, S, d)
    src_mask: Tensor  # (B, S), True at real tokens
    h: list[Tensor]  # L × (R, d)
    c: list[Tensor] | None  # L × (R, d) for the LSTM
    feed: Tensor  # (R, d): the previous attentional state h̃ (input feeding)
    group: int = 1
    step: int = 0

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Keep decoder rows `rows`; `sources` selects the sources when that set changes (as
        `model.DecoderCache.reorder`)."""
        n = self.memory.size(0) if sources is None else sources.numel()
        if rows.numel() != n * self.group:
            raise ValueError(f"{rows.numel()} decoder rows for {n} sources × group {self.group}")
        self.h = [x.index_select(0, rows) for x in self.h]
        if self.c is not None:
            self.c = [x.index_select(0, rows) for x in self.c]
        self.feed = self.feed.index_select(0, rows)
        if sources is not None:
            self.memory, self.keys = self.memory.index_select(0, sources), self.keys.index_select(0, sources)
            self.src_mask = self.src_mask.index_select(0, sources)


# -- the model -----------------------------------------------------------------------------------
class RecurrentModel(nn.Module):
    """Bidirectional recurrent encoder, recurrent decoder with attention (luong or bahdanau, above).

    Both decoders start from the encoder's final states (forward and backward halves concatenated,
    layer by layer; Bahdanau et al. start from tanh(W_s h←_1): a stated simplification shared by
    the two). Every weight starts uniform in ±0.1 (Luong et al., 2015, §4.1).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, V, L = cfg.d_model, cfg.vocab_size, cfg.N
        self.lstm = cfg.rnn_cell == "lstm"
        self.src_embed = nn.Embedding(V, d, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(V, d, padding_idx=cfg.pad_id)
        self.out_proj = OutputProjection(d, V, bias=False)
        self.out_proj.fp32 = cfg.fp32_logits
        if cfg.share_embeddings:
            self.out_proj.weight = self.src_embed.weight
        rnn = nn.LSTM if self.lstm else nn.GRU
        self.encoder = rnn(d, d // 2, num_layers=L, bidirectional=True, batch_first=True,
                           dropout=cfg.p_drop if L > 1 else 0.0)
        cell = LSTMCell if self.lstm else GRUCell
        self.bahdanau = cfg.rnn_variant == "bahdanau"
        self.cells = nn.ModuleList(cell(2 * d if i == 0 else d, d) for i in range(L))  # [E y; h̃] or [E y; c]
        if cfg.rnn_attention == "additive":
            self.attention: nn.Module = AdditiveAttention(d)
        else:
            self.attention = MultiplicativeAttention(d, general=cfg.rnn_attention == "general")
        if self.bahdanau:
            self.deep_out = Linear(3 * d, 2 * d)  # [U_o V_o C_o] on [s_t; E y_{t-1}; c_t], maxout pool 2
        else:
            self.combine = Linear(2 * d, d, bias=False)  # W_c
        self.dropout = Dropout(cfg.p_drop)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in self.parameters():
            nn.init.uniform_(p, -0.1, 0.1)
        with torch.no_grad():
            self.src_embed.weight[self.cfg.pad_id].zero_()
            self.tgt_embed.weight[self.cfg.pad_id].zero_()

    # -- encoder ---------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor] | None]:
        """src (B, S) -> memory (B, S, d), mask (B, S), the decoder's initial h (and c) per layer."""
        mask = src != self.cfg.pad_id
        lengths = mask.sum(1).clamp(min=1).cpu()
        x = self.dropout(self.src_embed(src))
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        # oneDNN has no bf16 LSTM without AVX-512 (it raises): there the encoder runs in fp32 inside autocast
        fp32 = self.lstm and x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and not lstm_bf16()
        with torch.autocast("cpu", enabled=False) if fp32 else contextlib.nullcontext():
            out, final = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))

        def layers(s: Tensor) -> list[Tensor]:  # (2L, B, d/2) -> L × (B, d): both directions of a layer
            s = s.float()
            return list(s.view(self.cfg.N, 2, s.size(1), s.size(2)).permute(0, 2, 1, 3).flatten(2))

        h0, c0 = (layers(final[0]), layers(final[1])) if self.lstm else (layers(final), None)
        return memory, mask, h0, c0

    def start_decoding(self, src: Tensor, group: int = 1) -> RecurrentCache:
        """Encode src (B, S) once for B·group decoder rows (the beams of beam search)."""
        memory, mask, h0, c0 = self.encode(src)
        rep = (lambda t: t.repeat_interleave(group, 0)) if group > 1 else (lambda t: t)
        feed = torch.zeros(src.size(0) * group, self.cfg.d_model, device=src.device)
        return RecurrentCache(memory, self.attention.keys(memory), mask, [rep(h) for h in h0],
                              None if c0 is None else [rep(c) for c in c0], feed, group)

    # -- decoder ---------------------------------------------------------------------------------
    def _cells(self, x: Tensor, cache: RecurrentCache) -> Tensor:
        """Run the decoder's stacked cells one step from the cached states; returns the top state."""
        hs, cs = [], []
        for i, cell in enumerate(self.cells):
            h, c = cell(x if i == 0 else self.dropout(x), (cache.h[i], cache.c[i] if cache.c else None))
            hs.append(h)
            cs.append(c)
            x = h
        cache.h, cache.c = hs, (cs if self.lstm else None)
        return x

    def _attend(self, q: Tensor, cache: RecurrentCache) -> tuple[Tensor, Tensor]:
        """Queries q (R, d) -> contexts (R, d), weights (R, S); the g rows of a source attend together."""
        qg = q.view(-1, cache.group, q.size(-1))
        context, weights = attend(self.attention.scores(qg.to(cache.keys.dtype), cache.keys), cache.src_mask,
                                  cache.memory)
        return context.view_as(q), weights.view(-1, weights.size(-1))

    def _step_bahdanau(self, y: Tensor, cache: RecurrentCache) -> tuple[Tensor, Tensor]:
        """Bahdanau et al. (2015), Eq. 4-6: attend from s_{t-1}, feed [E y; c_t] to the cell, deep output."""
        e = self.dropout(self.tgt_embed(y))
        context, weights = self._attend(cache.h[-1], cache)
        context = context.to(e.dtype)
        s = self._cells(torch.cat([e, context], -1), cache)
        t = self.deep_out(torch.cat([s.to(e.dtype), e, context], -1)).float()
        cache.step += 1
        return t.view(t.size(0), -1, 2).amax(-1), weights  # maxout over pairs: (R, d)

    def _step(self, y: Tensor, cache: RecurrentCache) -> tuple[Tensor, Tensor]:
        """One target step for every row: previous tokens y (R,) -> h̃_t (R, d), weights (R, S)."""
        if self.bahdanau:
            return self._step_bahdanau(y, cache)
        x = torch.cat([self.dropout(self.tgt_embed(y)), cache.feed.to(self.tgt_embed.weight.dtype)], -1)
        x = self._cells(x, cache)
        context, weights = self._attend(x, cache)
        h_tilde = torch.tanh(self.combine(torch.cat([context.to(x.dtype), x], -1)).float())
        cache.feed = h_tilde
        cache.step += 1
        return h_tilde, weights

    def decode_step(self, tokens: Tensor, cache: RecurrentCache) -> Tensor:
        """Feed the next token of each row, tokens (R,) -> next-token logits (R, V)."""
        h_tilde, _ = self._step(tokens, cache)
        return self.out_proj(self.dropout(h_tilde))

    def _teacher_forced(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        cache = self.start_decoding(src)
        outs, weights = [], []
        for t in range(tgt_in.size(1)):
            h_tilde, w = self._step(tgt_in[:, t], cache)
            outs.append(h_tilde)
            weights.append(w)
        return self.out_proj(self.dropout(torch.stack(outs, 1))), torch.stack(weights, 1)  # (B, T, V), (B, T, S)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits: src (B, S), tgt_in (B, T) -> (B, T, V)."""
        return self._teacher_forced(src, tgt_in)[0]

    def attention_maps(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, AttentionMaps]:
        """Logits and the one cross-attention map, as one layer with one head: (B, 1, T, S)."""
        logits, weights = self._teacher_forced(src, tgt_in)
        return logits, AttentionMaps([], [], [weights.unsqueeze(1)])
