"""The convolutional sequence-to-sequence model the paper set itself against (§1-2, §4, Table 2):
ConvS2S, Gehring et al. (2017), "Convolutional Sequence to Sequence Learning".

- §3.1 token embeddings plus learned position embeddings, e = w + p (and g for the target);
- §3.2 stacks of 1-D convolutions, each followed by a gated linear unit (GLU, v = A ⊗ σ(B)) and
  a residual connection; the decoder's convolutions are causal (k − 1 zeros on the left);
- §3.3 multi-step attention: every decoder layer l attends over the encoder output z with
  d_i = W_d h_i + b_d + g_i, a_ij = softmax_j(d_i · z_j), c_i = Σ_j a_ij (z_j + e_j) (keys: the
  encoder outputs, values: outputs plus input embeddings), and c_i is added to h_i;
- §3.4 sums of a residual block's input and output are scaled by √0.5, and c_i by m·√(1/m) for m
  source positions (to keep the variance);
- §3.5 initialization: embeddings N(0, 0.1), layers N(0, √(1/n_in)), convolutions that feed a GLU
  N(0, √(4(1 − p)/(k·n_in))), biases 0. Stated simplification: no weight normalization (every
  model here is trained with the same Adam), tested init instead.

Notation: B sources, R = B·g decoder rows, S source and T target length, f = d_model (embedding
size), c = conv_channels (hidden size), k = conv_kernel. Incremental decoding keeps each decoder
layer's last k − 1 inputs, so search.py's one beam search serves this model too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from .linear import Linear
from .transformer import AttentionMaps, Dropout, OutputProjection

SQRT_HALF = math.sqrt(0.5)


def glu_conv(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """§3.2: a convolution to 2c channels, then GLU: x (N, c, L_in) -> (N, c, L_in − k + 1 + 2·pad)."""
    return F.glu(conv(x), dim=1)


@dataclass
class ConvCache:
    """Decoding state: each decoder layer's last k − 1 inputs per row; per source the attention
    keys z (B, S, f), values z + e (B, S, f), mask and the m·√(1/m) scale."""

    keys: Tensor
    values: Tensor
    src_mask: Tensor  # (B, S), True at real tokens
    scale: Tensor  # (B, 1, 1)
    windows: list[Tensor]  # L × (R, k − 1, c)
    group: int = 1
    step: int = 0

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Keep decoder rows `rows`; `sources` selects the sources when that set changes."""
        n = self.keys.size(0) if sources is None else sources.numel()
        if rows.numel() != n * self.group:
            raise ValueError(f"{rows.numel()} decoder rows for {n} sources × group {self.group}")
        self.windows = [w.index_select(0, rows) for w in self.windows]
        if sources is not None:
            self.keys, self.values = self.keys.index_select(0, sources), self.values.index_select(0, sources)
            self.src_mask, self.scale = self.src_mask.index_select(0, sources), self.scale.index_select(0, sources)


class ConvS2S(nn.Module):
    """ConvS2S (Gehring et al., 2017): convolutional encoder and decoder with multi-step attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        f, V, k = cfg.d_model, cfg.vocab_size, cfg.conv_kernel
        c = cfg.conv_channels or f
        self.k, self.c = k, c
        self.src_embed = nn.Embedding(V, f, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(V, f, padding_idx=cfg.pad_id)
        self.src_pos, self.tgt_pos = nn.Embedding(cfg.max_positions, f), nn.Embedding(cfg.max_positions, f)
        self.enc_in, self.enc_out = Linear(f, c), Linear(c, f)
        self.enc_convs = nn.ModuleList(nn.Conv1d(c, 2 * c, k, padding=k // 2) for _ in range(cfg.N))
        self.dec_in, self.dec_out = Linear(f, c), Linear(c, f)
        self.dec_convs = nn.ModuleList(nn.Conv1d(c, 2 * c, k) for _ in range(cfg.n_dec))  # causal: padded by hand
        self.att_in = nn.ModuleList(Linear(c, f) for _ in range(cfg.n_dec))  # W_d, b_d
        self.att_out = nn.ModuleList(Linear(f, c) for _ in range(cfg.n_dec))
        self.out_proj = OutputProjection(f, V, bias=False)
        self.out_proj.fp32 = cfg.fp32_logits
        if cfg.share_embeddings:
            self.out_proj.weight = self.src_embed.weight
        self.dropout = Dropout(cfg.p_drop)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Gehring et al. (2017), §3.5."""
        p = self.cfg.p_drop
        for m in self.modules():
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.1)
            elif isinstance(m, nn.Conv1d):
                nn.init.normal_(m.weight, 0.0, math.sqrt(4 * (1 - p) / (m.kernel_size[0] * m.in_channels)))
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear) and m is not self.out_proj:
                nn.init.normal_(m.weight, 0.0, math.sqrt(1 / m.in_features))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        with torch.no_grad():
            self.src_embed.weight[self.cfg.pad_id].zero_()
            self.tgt_embed.weight[self.cfg.pad_id].zero_()

    # -- encoder ---------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
        """src (B, S) -> keys z (B, S, f), values z + e, mask (B, S), each layer's GLU output."""
        mask = src != self.cfg.pad_id
        pos = torch.arange(src.size(1), device=src.device)
        e = self.dropout(self.src_embed(src) + self.src_pos(pos))
        x = self.enc_in(e)
        keep = mask.unsqueeze(-1).to(x.dtype)
        states = []
        for conv in self.enc_convs:
            # zeros at the padding: a padded sentence sees what an unpadded one sees past its end
            y = glu_conv(conv, (self.dropout(x) * keep).transpose(1, 2)).transpose(1, 2)
            x = (y + x) * SQRT_HALF
            states.append(y)
        z = self.enc_out(x * keep)
        return z, z + e, mask, states

    def start_decoding(self, src: Tensor, group: int = 1) -> ConvCache:
        """Encode src (B, S) once for B·group decoder rows (the beams of beam search)."""
        z, values, mask, _ = self.encode(src)
        m = mask.sum(1).clamp(min=1).to(z.dtype)
        windows = [z.new_zeros(src.size(0) * group, self.k - 1, self.c) for _ in self.dec_convs]
        return ConvCache(z, values, mask, (m * (1 / m).sqrt()).view(-1, 1, 1), windows, group)

    # -- decoder ---------------------------------------------------------------------------------
    def _attend(self, i: int, h: Tensor, g: Tensor, cache: ConvCache) -> tuple[Tensor, Tensor]:
        """§3.3 for layer i: h (B, g·T, c), target embeddings g -> h + attention (B, g·T, c), weights."""
        d = (self.att_in[i](h) + g) * SQRT_HALF
        scores = torch.bmm(d.to(cache.keys.dtype), cache.keys.transpose(1, 2)).float()
        a = torch.softmax(scores.masked_fill(~cache.src_mask.unsqueeze(1), float("-inf")), dim=-1)
        context = torch.bmm(a.to(cache.values.dtype), cache.values) * cache.scale
        return (self.att_out[i](context.to(h.dtype)) + h) * SQRT_HALF, a

    def _layer(self, i: int, x: Tensor, g: Tensor, cache: ConvCache, window: Tensor | None
               ) -> tuple[Tensor, Tensor]:
        """One decoder layer over x (R, T, c); `window`: the layer's k − 1 previous inputs (else zeros)."""
        B = cache.keys.size(0)
        left = window if window is not None else x.new_zeros(x.size(0), self.k - 1, self.c)
        y = torch.cat([left.to(x.dtype), self.dropout(x)], 1)  # causal: k − 1 positions on the left
        h = glu_conv(self.dec_convs[i], y.transpose(1, 2)).transpose(1, 2)
        T = h.size(1)
        h, a = self._attend(i, h.reshape(B, -1, self.c), g.reshape(B, -1, g.size(-1)), cache)
        return (h.view(-1, T, self.c) + x) * SQRT_HALF, a.view(-1, T, a.size(-1))

    def _decode(self, tokens: Tensor, cache: ConvCache, start: int, incremental: bool) -> tuple[Tensor, list]:
        """Target tokens (R, T) at positions start.. -> logits (R, T, V), per-layer weights (R, T, S)."""
        pos = torch.arange(start, start + tokens.size(1), device=tokens.device)
        g = self.dropout(self.tgt_embed(tokens) + self.tgt_pos(pos))
        x = self.dec_in(g)
        weights = []
        for i in range(len(self.dec_convs)):
            window = cache.windows[i] if incremental else None
            if incremental:
                cache.windows[i] = torch.cat([window, x.to(window.dtype)], 1)[:, -(self.k - 1):] if self.k > 1 \
                    else window
            x, a = self._layer(i, x, g, cache, window)
            weights.append(a)
        return self.out_proj(self.dropout(self.dec_out(x))), weights

    def decode_step(self, tokens: Tensor, cache: ConvCache) -> Tensor:
        """Feed the next token of each row, tokens (R,) -> next-token logits (R, V)."""
        logits, _ = self._decode(tokens.unsqueeze(1), cache, cache.step, incremental=True)
        cache.step += 1
        return logits[:, 0]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits: src (B, S), tgt_in (B, T) -> (B, T, V)."""
        return self._decode(tgt_in, self.start_decoding(src), 0, incremental=False)[0]

    def attention_maps(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, AttentionMaps]:
        """Logits and every decoder layer's attention, each as one head: L × (B, 1, T, S)."""
        logits, weights = self._decode(tgt_in, self.start_decoding(src), 0, incremental=False)
        return logits, AttentionMaps([], [], [w.unsqueeze(1) for w in weights])
