"""The Transformer (§3, Figure 1): embeddings, positions, encoder and decoder stacks.

Notation: B batch, S source length, T target length, d = d_model, V vocabulary, h heads.
Token tensors are right-padded with ``pad_id``. Attention weights are returned as values
(``need_weights=True``), never stored on modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from .attention import MultiHeadAttention
from .cache import DecoderCache, LayerCache
from .dropout import Dropout
from .linear import Linear


def sinusoidal_positions(n: int, d: int) -> Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    if torch.get_default_device().type == "meta":  # shapes only (build.shapes_only): no values to compute
        return torch.empty(n, d)
    pos = torch.arange(n, dtype=torch.float64).unsqueeze(1)  # (n, 1)
    div = torch.pow(10000.0, torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos / div)
    pe[:, 1::2] = torch.cos(pos / div)
    return pe.float()


class OutputProjection(Linear):
    """§3.4 the pre-softmax linear transformation, computed in fp32 even under bf16 autocast.

    bf16 keeps 8 significant bits: logits near ±16 would be 0.125 apart, coarser than the
    differences that the loss and the beam compare. The product runs on fp32 inputs and weights
    (oneDNN on a CPU, see linear.py), and the softmax and loss that follow stay in fp32.
    """

    fp32 = True  # model.fp32_logits; False: bf16 under autocast, like every other projection

    def forward(self, x: Tensor) -> Tensor:
        if not self.fp32:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.float())


ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}  # model.activation; §3.3 is ReLU


class FeedForward(nn.Module):
    """§3.3, Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2 (another activation only if model.activation says)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        self.w_1 = Linear(d_model, d_ff)
        self.w_2 = Linear(d_ff, d_model)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.act(self.w_1(x)))


class Residual(nn.Module):
    """§3.1, §5.4: LayerNorm(x + Dropout(Sublayer(x))); pre-norm: x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, d_model: int, p_drop: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(p_drop)
        self.pre_norm = pre_norm

    def inp(self, x: Tensor) -> Tensor:
        """What the sub-layer sees."""
        return self.norm(x) if self.pre_norm else x

    def out(self, x: Tensor, y: Tensor) -> Tensor:
        """Combine the residual x with the sub-layer output y."""
        x = x + self.dropout(y)
        return x if self.pre_norm else self.norm(x)


class EncoderLayer(nn.Module):
    """§3.1: multi-head self-attention, then the position-wise feed-forward network."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn = MultiHeadAttention(d, cfg.h, cfg.head_dim_k, cfg.head_dim_v, cfg.attn_drop, cfg.attention)
        self.ffn = FeedForward(d, cfg.d_ff, cfg.activation)
        self.res_attn = Residual(d, cfg.p_drop, cfg.pre_norm)
        self.res_ffn = Residual(d, cfg.p_drop, cfg.pre_norm)

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        y = self.res_attn.inp(x)
        k, v = self.self_attn.project_kv(y)
        a, w = self.self_attn(y, k, v, mask=mask, need_weights=need_weights)
        x = self.res_attn.out(x, a)
        x = self.res_ffn.out(x, self.ffn(self.res_ffn.inp(x)))
        return x, w


class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, encoder-decoder attention, feed-forward network."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, dk, dv = cfg.d_model, cfg.head_dim_k, cfg.head_dim_v
        self.self_attn = MultiHeadAttention(d, cfg.h, dk, dv, cfg.attn_drop, cfg.attention)
        self.cross_attn = MultiHeadAttention(d, cfg.h, dk, dv, cfg.attn_drop, cfg.attention)
        self.ffn = FeedForward(d, cfg.d_ff, cfg.activation)
        self.res_self = Residual(d, cfg.p_drop, cfg.pre_norm)
        self.res_cross = Residual(d, cfg.p_drop, cfg.pre_norm)
        self.res_ffn = Residual(d, cfg.p_drop, cfg.pre_norm)

    def forward(
        self, x: Tensor, cross_k: Tensor, cross_v: Tensor, src_mask: Tensor,
        cache: LayerCache | None = None, need_weights: bool = False, group: int = 1,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        # Masked self-attention. Full sequence: causal mask alone suffices because targets are
        # right-padded, so a real query never sees a padded key. Incremental: the new token
        # may see every cached position.
        y = self.res_self.inp(x)
        k, v = self.self_attn.project_kv(y)
        if cache is not None:
            if k.size(2) != 1:
                raise ValueError("incremental decoding feeds one token per row at a time")
            k, v = cache.append(k, v)
        a, w_self = self.self_attn(y, k, v, causal=cache is None, need_weights=need_weights)
        x = self.res_self.out(x, a)
        # Encoder-decoder attention: queries from the decoder, keys/values from the encoder.
        # With group g > 1 (incremental decoding, one token per row), the g rows that share a
        # source are that source's g queries: (B·g, 1, d) -> (B, g, d).
        y = self.res_cross.inp(x)
        a, w_cross = self.cross_attn(y.reshape(-1, group * y.size(1), y.size(2)), cross_k, cross_v,
                                     mask=src_mask, need_weights=need_weights)
        x = self.res_cross.out(x, a.reshape(x.shape))
        x = self.res_ffn.out(x, self.ffn(self.res_ffn.inp(x)))
        return x, w_self, w_cross


@dataclass
class AttentionMaps:
    """Attention weights of every layer, each (B, h, query, key) — Figures 3-5."""

    encoder_self: list[Tensor]
    decoder_self: list[Tensor]
    cross: list[Tensor]


class Transformer(nn.Module):
    """§3, Figure 1: the encoder-decoder Transformer with shared embeddings (§3.4).

    Initialization (common practice for this model, as in fairseq and tensor2tensor):
    Xavier-uniform for every projection matrix, zero biases, embeddings N(0, d_model^-0.5).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, V = cfg.d_model, cfg.vocab_size
        self.src_embed = nn.Embedding(V, d, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(V, d, padding_idx=cfg.pad_id)
        self.out_proj = OutputProjection(d, V, bias=cfg.out_bias)
        self.out_proj.fp32 = cfg.fp32_logits
        if cfg.share_embeddings:
            self.out_proj.weight = self.src_embed.weight  # §3.4: one matrix, three uses
        if cfg.learned_positions:  # Table 3 row (E)
            self.src_pos = nn.Parameter(torch.empty(cfg.max_positions, d))
            self.tgt_pos = nn.Parameter(torch.empty(cfg.max_positions, d))
        else:
            self.register_buffer("pe", sinusoidal_positions(cfg.max_positions, d), persistent=False)
        self.emb_dropout = Dropout(cfg.p_drop)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.N))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec))
        self.add_inputs(cfg)
        self.enc_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if "embed" in name or name.endswith("_pos"):
                nn.init.normal_(p, 0.0, self.cfg.d_model ** -0.5)
            elif p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif "norm" not in name:
                nn.init.zeros_(p)
        if not self.cfg.share_embeddings:
            nn.init.normal_(self.out_proj.weight, 0.0, self.cfg.d_model ** -0.5)
        with torch.no_grad():  # the padding row starts at zero (fairseq practice)
            self.src_embed.weight[self.cfg.pad_id].zero_()
            self.tgt_embed.weight[self.cfg.pad_id].zero_()

    # -- inputs beside the tokens (none here; a subclass may add some, e.g. §6.3's parser) -------
    def add_inputs(self, cfg: ModelConfig) -> None:
        """Modules of extra inputs, registered after the decoder (before the final norms)."""

    def source_extra(self, src: Tensor, src_tags: Tensor | None) -> Tensor | None:
        """An addition to the source embeddings (B, S, d), or None."""
        return None

    def decoder_extra(self, src: Tensor, memory: Tensor, tgt_in: Tensor) -> Tensor | None:
        """An addition to the teacher-forced decoder inputs (B, T, d), or None."""
        return None

    def input_states(self, memory: Tensor, src: Tensor, group: int) -> list:
        """Per-row states whose `step(tokens)` adds to each incremental decoder input, and `reorder(rows)`."""
        return []

    @property
    def embed_scale(self) -> float:
        """§3.4: √d_model (1 where model.scale_embedding is off)."""
        return math.sqrt(self.cfg.d_model) if self.cfg.scale_embedding else 1.0

    @property
    def decoder_inputs(self) -> bool:
        """Whether decoder inputs carry more than the embedded token and its position."""
        return False

    # -- embeddings ------------------------------------------------------------------------
    def _embed(self, tokens: Tensor, embed: nn.Embedding, side: str, offset: int = 0, extra: Tensor | None = None
               ) -> Tensor:
        """§3.4-3.5: Dropout(Embedding(x)·√d_model + PE) for positions offset..offset+T (+ `extra`)."""
        T = tokens.size(1)
        if offset + T > self.cfg.max_positions:
            raise ValueError(
                f"sequence of {offset + T} tokens exceeds model.max_positions={self.cfg.max_positions}"
            )
        pos = (self.src_pos if side == "src" else self.tgt_pos) if self.cfg.learned_positions else self.pe
        x = embed(tokens) * self.embed_scale + pos[offset:offset + T]
        if extra is not None:
            x = x + extra
        return self.emb_dropout(x)

    # -- encoder ---------------------------------------------------------------------------
    def source_mask(self, src: Tensor) -> Tensor:
        """(B, 1, 1, S): True where the encoder reads; with model.lang_tag decoder, not the first
        token (the target-language tag, which the decoder reads: `decoder_start`)."""
        mask = (src != self.cfg.pad_id)[:, None, None, :]
        if self.cfg.lang_tag == "decoder":
            mask[..., 0] = False
        return mask

    def decoder_start(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The decoder's inputs: BOS + target, or with model.lang_tag decoder the source's first token
        (its `<2xx>` tag) in place of BOS, as fairseq's --decoder-langtok (Johnson et al. 2017 tag the source)."""
        if self.cfg.lang_tag != "decoder":
            return tgt_in
        tgt_in = tgt_in.clone()
        tgt_in[:, 0] = src[:, 0]
        return tgt_in

    def encode(self, src: Tensor, need_weights: bool = False, src_tags: Tensor | None = None
               ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """src (B, S) -> memory (B, S, d), src_mask (B, 1, 1, S), per-layer self-attention weights.
        `src_tags` (B, S): per-subword ids of a subclass's source input (`source_extra`)."""
        mask = self.source_mask(src)
        x = self._embed(src, self.src_embed, "src", extra=self.source_extra(src, src_tags))
        weights = []
        for layer in self.encoder:
            x, w = layer(x, mask, need_weights)
            weights.append(w)
        return self.enc_norm(x), mask, weights

    # -- decoder ---------------------------------------------------------------------------
    def _decode(
        self, tgt: Tensor, cross: list[tuple[Tensor, Tensor]], src_mask: Tensor,
        cache: DecoderCache | None, need_weights: bool | int | None, extra: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """need_weights: every layer's attention weights (True), one layer's (its index), none."""
        x = self._embed(tgt, self.tgt_embed, "tgt", cache.step if cache else 0)
        x = x if extra is None else x + extra
        w_self, w_cross = [], []
        for i, layer in enumerate(self.decoder):
            k, v = cross[i]
            need = need_weights if isinstance(need_weights, bool) else need_weights == i
            x, ws, wc = layer(x, k, v, src_mask, cache.layers[i] if cache else None, need, cache.group if cache else 1)
            w_self.append(ws)
            w_cross.append(wc)
        x = self.dec_norm(x)
        return self.out_proj(x), w_self, w_cross  # logits (B, T, V)

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Encoder-decoder keys and values of every decoder layer, computed once per source."""
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder]

    def forward(self, src: Tensor, tgt_in: Tensor, src_tags: Tensor | None = None, align_layer: int | None = None
                ) -> Tensor | tuple[Tensor, Tensor]:
        """Teacher-forced logits: src (B, S), tgt_in (B, T) -> (B, T, V); with `align_layer`, also that
        decoder layer's encoder-decoder attention (B, h, T, S) (guided alignment, train.guided_alignment)."""
        memory, mask, _ = self.encode(src, src_tags=src_tags)
        tgt_in = self.decoder_start(src, tgt_in)
        extra = self.decoder_extra(src, memory, tgt_in)
        logits, _, w = self._decode(tgt_in, self.cross_kv(memory), mask, None, align_layer, extra)
        return logits if align_layer is None else (logits, w[align_layer])

    def attention_maps(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, AttentionMaps]:
        """Logits and every attention map, through the explicit attention path."""
        memory, mask, w_enc = self.encode(src, need_weights=True)
        tgt_in = self.decoder_start(src, tgt_in)
        logits, w_self, w_cross = self._decode(tgt_in, self.cross_kv(memory), mask, None, True,
                                               self.decoder_extra(src, memory, tgt_in))
        return logits, AttentionMaps(w_enc, w_self, w_cross)

    # -- incremental decoding ----------------------------------------------------------------
    def start_decoding(self, src: Tensor, group: int = 1) -> DecoderCache:
        """Encode src (B, S) once and prepare caches for `decode_step` over B·group rows, where
        rows b·group .. b·group + group - 1 translate source b (the beams of beam search)."""
        memory, mask, _ = self.encode(src)
        layers = [LayerCache(k, v) for k, v in self.cross_kv(memory)]
        first = src[:, 0].repeat_interleave(group) if self.cfg.lang_tag == "decoder" else None  # decoder_start
        return DecoderCache(layers, mask, group, inputs=self.input_states(memory, src, group), first=first)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """Feed the next token of each row, tokens (B,) -> next-token logits (B, V)."""
        if cache.step == 0 and cache.first is not None:  # the start symbol: the tag (decoder_start), not BOS
            tokens = cache.first
        cross = [(c.cross_k, c.cross_v) for c in cache.layers]
        extra = sum(s.step(tokens) for s in cache.inputs) if cache.inputs else None
        logits, _, _ = self._decode(tokens[:, None], cross, cache.src_mask, cache, False, extra)
        cache.step += 1
        return logits[:, -1]
