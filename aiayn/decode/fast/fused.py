"""The Transformer's decoder step for search, written as one function (§3.2.3, §6.1).

`Transformer.decode_step` runs the decoder's modules one token at a time: for a few rows most of
its time is per-call overhead, not arithmetic (bench/decode/decode_step.py). `FusedDecoder` computes the
same step from the model's weights directly: one Q|K|V product per layer, the encoder-decoder
keys and values projected once per sentence, self-attention caches written once and never moved (a
table of rows follows the beams; compiled, the gather fuses into attention), no module calls and no
autocast. The arithmetic is the model's at the same
precision: in bf16 the products run in bf16 while the residual stream, LayerNorm and softmax stay
in fp32, as under autocast. Search uses it through the `IncrementalDecoder` contract (search.py).

What is written twice, the module step and this one (with graphed.py's `static_logits`), is
listed in mirror.py, whose `fusable` says which models this step may decode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ...data.tokenizer import EOS, PAD
from ...models.linear import Int8Linear, onednn_available, onednn_fp32, onednn_linear
from ...models.transformer import ACTIVATIONS
from .compiled import compiled_step
from .graphed import StepGraph
from .options import StepOptions

Proj = tuple[Tensor, Tensor | None] | Int8Linear


@dataclass
class _Layer:
    """One decoder layer's projections — W^Q|W^K|W^V fused, W^O, the cross-attention's, the FFN's —
    each (weight, bias) or an Int8Linear, and its norms."""

    qkv: Proj
    o: Proj
    cq: Proj
    ck: Proj
    cv: Proj
    co: Proj
    f1: Proj
    f2: Proj
    norms: list[tuple[Tensor, Tensor]]  # self, cross, ffn
    heads: tuple[int, int, int, int, int, int]  # h, d_k, d_v of self- and of cross-attention


class FusedState:
    """Search state: self-attention keys/values per layer in time-major buffers (capacity, rows, h, d)
    that are written once and never moved, and a table `idx` (capacity, rows): the buffer row that
    holds position t of decoder row r. Reordering beams rewrites that table only (integers, not
    vectors); the step gathers each row's history through it. The encoder side once per source."""

    def __init__(self, cross: list[tuple[Tensor, Tensor]], pad: Tensor, group: int, rows: int,
                 layers: list[_Layer], dtype: torch.dtype, capacity: int = 64, static: bool = False):
        self.cross, self.pad, self.group, self.n = cross, pad, group, 0  # pad (B, 1, 1, S): True at padding; sdpa: -inf
        self.not_word: Tensor | None = None  # (B, 1, S) True at EOS and padding, while alignments are taken
        self.attended: Tensor | None = None  # (R,): the source position each row attended to most, last step
        self.first: Tensor | None = None  # (R,): each row's first input where it is not BOS (model.lang_tag decoder)
        # static (graphed.py): every tensor keeps its size and place, the live rows and sources their prefix;
        # the buffers start as zeros (a graph attends over all of them, masked) and reorders write in place.
        self.static, self.graph = static, None
        dev = pad.device  # the buffers live where the model runs (a GPU's decoding failed on CPU buffers)
        new = torch.zeros if static else torch.empty
        self.k = [new(capacity, rows, L.heads[0], L.heads[1], dtype=dtype, device=dev) for L in layers]
        self.v = [new(capacity, rows, L.heads[0], L.heads[2], dtype=dtype, device=dev) for L in layers]
        self.idx = new(capacity, rows, dtype=torch.long, device=dev)

    def grow(self) -> None:
        """Double the capacity, keeping what is filled."""
        def doubled(x: Tensor) -> Tensor:
            y = (x.new_zeros if self.static else x.new_empty)(2 * x.size(0), *x.shape[1:])
            y[:self.n] = x[:self.n]
            return y
        self.k, self.v, self.idx = [doubled(x) for x in self.k], [doubled(x) for x in self.v], doubled(self.idx)

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Keep decoder rows `rows`; `sources` selects the sources when that set changes."""
        if self.static:  # in place, into the prefix: a graph reads these very tensors
            for x in [t for kv in self.cross for t in kv] + [self.pad] if sources is not None else []:
                x[:sources.numel()] = x.index_select(0, sources)
            self.idx[:self.n, :rows.numel()] = self.idx[:self.n].index_select(1, rows)
            return
        if sources is not None:
            self.cross = [(k.index_select(0, sources), v.index_select(0, sources)) for k, v in self.cross]
            self.pad = self.pad.index_select(0, sources)
            if self.not_word is not None:
                self.not_word = self.not_word.index_select(0, sources)
        if self.first is not None:
            self.first = self.first.index_select(0, rows)
        idx = self.idx.new_empty(self.idx.size(0), rows.numel())
        torch.index_select(self.idx[:self.n], 1, rows, out=idx[:self.n])
        self.idx = idx


class FusedDecoder:
    """`IncrementalDecoder` (search.py) for a Transformer without the pointer input: its encoder
    as it is, its decoder step fused. dtype: float32, or bfloat16 for a model whose projections
    hold bf16 weights (translate.cast_bf16). int8: a float32 model whose projections become
    linear.Int8Linear, as translate.quantize_int8 makes them (the fused Q|K|V one included: the
    same per-channel weight scales and per-row activation scales, so the same numbers). encoder:
    the model whose `encode` runs (default `model`; int8: translate.quantize_int8's copy).
    compiled: the step, and the encoder with the encoder-decoder projections, run through
    `torch.compile` (see `compiled_step`); `options` (StepOptions) says how the step runs in full
    (compiled, graphs, attention kernel), each choice left None made by the device."""

    def __init__(self, model, dtype: torch.dtype = torch.float32, capacity: int = 64, int8: bool = False,
                 encoder=None, compiled: bool = False, options: StepOptions | None = None):
        if model.decoder_inputs:
            raise ValueError("the fused decoder step has no decoder inputs beside the token (a parser's pointer "
                             "or depth input)")
        self.model, self.dtype, self.capacity, self.cfg = model, dtype, capacity, model.cfg
        cfg = self.cfg
        self.pre_norm, self.d = cfg.pre_norm, cfg.d_model
        self.layers = [_weights(layer, dtype, int8) for layer in model.decoder]
        self.embed = model.tgt_embed.weight.detach()
        self.pos = (model.tgt_pos if cfg.learned_positions else model.pe).detach()
        out = model.out_proj
        self.out_dtype = torch.float32 if out.fp32 or int8 else dtype
        b = None if out.bias is None else out.bias.detach()  # model.out_bias (Marian's final_logits_bias)
        self.out: Proj = _int8(out.weight.detach(), b) if int8 else (out.weight.detach().to(self.out_dtype),
                                                                      None if b is None else b.to(self.out_dtype))
        self.act, self.scale = ACTIVATIONS[cfg.activation], model.embed_scale
        self.encoder = encoder or model
        self.final = (model.dec_norm.weight.detach(), model.dec_norm.bias.detach()) if cfg.pre_norm else None
        options = options or StepOptions(compiled=compiled)
        self.options = options.resolved(self.embed.device, getattr(cfg, "attention", "auto"))
        # (layer, head or None for the layer's mean): whose encoder-decoder attention each step's
        # argmax is taken from, for word alignments (decode/align.py); set by Translator, never compiled
        self.align_head: tuple[int, int | None] | None = None
        cpu_onednn = onednn_available() and onednn_fp32() and self.embed.device.type == "cpu" and not self.compiled
        self.fp32_linear = onednn_linear if cpu_onednn else F.linear  # inductor picks its own kernel
        weights = self._weight_tensors()
        on = self.compiled
        self._step = compiled_step(self._tensor_step, weights, self._rows) if on else self._tensor_step
        self._start = compiled_step(self._tensor_start, weights, self._rows) if on else self._tensor_start
        self._hidden = compiled_step(self._tensor_hidden, weights, self._rows) if on else self._tensor_hidden

    # the options, read-only: a decoder is built with the ones it runs (StepOptions)
    compiled = property(lambda self: self.options.compiled)
    graphs = property(lambda self: self.options.graphs)
    sdpa = property(lambda self: self.options.sdpa)
    shrink = property(lambda self: self.options.shrink)
    eager_first = property(lambda self: self.options.eager_first)
    unbacked = property(lambda self: self.options.unbacked)

    def _rows(self, args: tuple) -> list[tuple[Tensor, int]]:
        """With `unbacked`, the compiled callables' (tensor, dimension) pairs that count rows or sources:
        the start's sources (B, S); the step's tokens, row table, caches, encoder side and padding."""
        if not self.unbacked:
            return []
        if len(args) == 1:
            return [(args[0], 0)]
        tokens, _, ks, vs, idx, cross, pad = args[:7]
        return [(tokens, 0), (idx, 1), (pad, 0), *((x, 1) for x in ks + vs), *((x, 0) for kv in cross for x in kv)]

    def _weight_tensors(self) -> list[Tensor]:
        """Every tensor the step reads besides its arguments: the weights, embeddings and positions."""
        projs = [self.out] + [p for L in self.layers for p in (L.qkv, L.o, L.cq, L.ck, L.cv, L.co, L.f1, L.f2)]
        tensors = [self.embed, self.pos, *(self.final or ()), *(t for L in self.layers for n in L.norms for t in n)]
        for p in projs:
            tensors += list(p.buffers()) if isinstance(p, Int8Linear) else [t for t in p if t is not None]
        return tensors

    def linear(self, x: Tensor, wb: Proj, dtype: torch.dtype | None = None) -> Tensor:
        if isinstance(wb, Int8Linear):
            return wb(x)
        dtype = dtype or self.dtype
        if dtype == torch.float32:
            return self.fp32_linear(x, *wb)
        return F.linear(x.to(dtype), *wb)

    @torch.no_grad()
    def start_decoding(self, src: Tensor, group: int = 1, capacity: int | None = None) -> FusedState:
        """Encode src (B, S) with the model, project every layer's encoder-decoder keys and values;
        `capacity`: the positions the caches hold before they grow (default self.capacity)."""
        cross, mask = self._start(src.clone(memory_format=torch.contiguous_format))  # a slice compiled again
        graphed = self.graphs and not self.compiled and self.align_head is None
        pad = ~mask if not (self.sdpa or graphed) else torch.zeros(mask.shape, dtype=self.dtype, device=mask.device
                                                                  ).masked_fill(~mask, float("-inf"))
        # (SDPA's additive mask: a boolean one it converts again in every call)
        state = FusedState(cross, pad, group, src.size(0) * group, self.layers, self.dtype, capacity or self.capacity,
                           graphed)
        if self.cfg.lang_tag == "decoder":  # Transformer.start_decoding's `first`
            state.first = src[:, 0].repeat_interleave(group)
        if self.align_head is not None and not self.compiled:
            state.not_word = ((src == PAD) | (src == EOS))[:, None, :]
        if graphed:
            state.graph = StepGraph(self, state)
        return state

    def _tensor_start(self, src: Tensor) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
        with torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16):
            memory, mask, _ = self.encoder.encode(src)
        B, S = src.shape
        cross = []
        for L in self.layers:
            h, dk, dv = L.heads[3:]
            k = self.linear(memory, L.ck).view(B, S, h, dk).transpose(1, 2)  # (B, h, S, d_k)
            v = self.linear(memory, L.cv).view(B, S, h, dv).transpose(1, 2)
            cross.append((k.contiguous(), v.contiguous()) if self.compiled else (k, v))  # one stride pattern
        return cross, mask

    @torch.no_grad()
    def decode_step(self, tokens: Tensor, state: FusedState) -> Tensor:
        """Feed the next token of each row, tokens (R,) -> next-token logits (R, V)."""
        tokens = self._start_symbol(tokens, state)
        if state.graph is not None:  # the logits are a view of the graph's output: read before the next step
            return self._advance(lambda *_: state.graph(tokens), tokens, state)
        return self._advance(self._step if state.n or not self.eager_first else self._tensor_step, tokens, state)

    @torch.no_grad()
    def decode_hidden(self, tokens: Tensor, state: FusedState) -> Tensor:
        """`decode_step` without the output layer: the decoder's last states (R, d_model), for
        `project` (shortlist.py)."""
        tokens = self._start_symbol(tokens, state)
        if state.graph is not None:
            raise ValueError("a graphed decoding state steps through decode_step only (no shortlist)")
        return self._advance(self._hidden if state.n or not self.eager_first else self._tensor_hidden, tokens, state)

    @staticmethod
    def _start_symbol(tokens: Tensor, state: FusedState) -> Tensor:
        """The first step reads each row's `first` where the state has one (Transformer.decode_step)."""
        return state.first if state.n == 0 and state.first is not None else tokens

    @staticmethod
    def _advance(step, tokens: Tensor, state: FusedState) -> Tensor:
        """Run `step` at the state's next position (growing its caches when full), then move on;
        with alignments asked for, keep where each row attended (state.attended)."""
        if state.n == state.k[0].size(0):
            state.grow()
        probe = None if state.not_word is None else [state.not_word, None]
        out = step(tokens, state.n, state.k, state.v, state.idx, state.cross, state.pad, state.group,
                   **({} if probe is None else {"probe": probe}))
        state.n += 1
        if probe is not None:
            state.attended = probe[1]
        return out

    def output_rows(self, rows: Tensor) -> Proj:
        """The output layer restricted to the vocabulary ids `rows` (its weight's rows). bf16 weights
        are kept as fp32 numbers: `project` sums their products in fp32 with one kernel for any
        number of columns (oneDNN's bf16 kernels round differently as the column count changes,
        which would make a sentence's logits depend on the other sentences of its batch)."""
        if isinstance(self.out, Int8Linear):
            return self.out.select(rows)
        w, b = self.out
        return w.index_select(0, rows).float(), None if b is None else b.index_select(0, rows).float()

    def project(self, x: Tensor, out: Proj) -> Tensor:
        """Logits of the states x (R, d_model) through `output_rows`'s layer."""
        if isinstance(out, Int8Linear):
            return out(x)
        return self.fp32_linear(x.to(self.out_dtype).float(), *out)

    def _tensor_step(self, tokens: Tensor, n: int, ks: list[Tensor], vs: list[Tensor], idx: Tensor,
                     cross: list[tuple[Tensor, Tensor]], pad: Tensor, group: int, probe: list | None = None
                     ) -> Tensor:
        """The step over the state's tensors, to the logits (R, V)."""
        x = self._tensor_hidden(tokens, n, ks, vs, idx, cross, pad, group, probe)
        return self.linear(x, self.out, self.out_dtype)

    def _tensor_hidden(self, tokens: Tensor, n: int, ks: list[Tensor], vs: list[Tensor], idx: Tensor,
                       cross: list[tuple[Tensor, Tensor]], pad: Tensor, group: int, probe: list | None = None
                       ) -> Tensor:
        """The step over the state's tensors: writes position n of the caches and of the row table
        (row r's new entry lies in buffer row r), returns the decoder's last states. probe: [not_word,
        None], whose second item becomes the argmax of align_head's attention (`_cross_attention`)."""
        R, cap_rows = tokens.size(0), ks[0].size(1)
        idx[n] = torch.arange(R, device=tokens.device)
        # Where each row's positions 0..n lie in a buffer seen as (capacity · rows, h, d).
        where = (idx[:n + 1] + torch.arange(n + 1, device=tokens.device)[:, None] * cap_rows).view(-1)
        x = self.embed.index_select(0, tokens) * self.scale + self.pos[n]
        return self.run_layers(x, lambda y, i, L: self._self_attention(y, L, ks[i], vs[i], n, where), cross, pad, group,
                            probe)

    def run_layers(self, x: Tensor, attend, cross: list[tuple[Tensor, Tensor]], pad: Tensor, group: int,
                probe: list | None = None) -> Tensor:
        """The decoder's layers over the embedded tokens x (R, d_model); attend(y, i, L): layer i's self-attention."""
        for i, L in enumerate(self.layers):
            x = self._out(x, L.norms[0], attend(self._inp(x, L.norms[0]), i, L))
            y = self._cross_attention(self._inp(x, L.norms[1]), L, cross[i], pad, group,
                                      probe if probe is not None and i == self.align_head[0] else None)
            x = self._out(x, L.norms[1], y)
            x = self._out(x, L.norms[2], self.linear(self.act(self.linear(self._inp(x, L.norms[2]), L.f1)), L.f2))
        if self.final is not None:
            x = F.layer_norm(x, (self.d,), *self.final)
        return x

    def _inp(self, x: Tensor, norm: tuple[Tensor, Tensor]) -> Tensor:
        """§3.1: what a sub-layer sees: x; pre-norm: LayerNorm(x)."""
        return F.layer_norm(x, (self.d,), *norm) if self.pre_norm else x

    def _out(self, x: Tensor, norm: tuple[Tensor, Tensor], y: Tensor) -> Tensor:
        """§3.1: LayerNorm(x + y); pre-norm: x + y. The residual stream stays fp32."""
        return x + y if self.pre_norm else F.layer_norm(x + y, (self.d,), *norm)

    def _self_attention(self, y: Tensor, L: _Layer, kc: Tensor, vc: Tensor, n: int, where: Tensor) -> Tensor:
        """kc, vc: this layer's time-major caches (capacity, rows, h, d); position n is written here.
        where: the buffer rows of each row's history, (n + 1) · R."""
        h, dk, dv = L.heads[:3]
        R = y.size(0)
        q, k, v = self.linear(y, L.qkv).split([h * dk, h * dk, h * dv], 1)
        kc[n][:R] = k.view(R, h, dk)
        vc[n][:R] = v.view(R, h, dv)
        keys = kc.view(-1, h, dk).index_select(0, where).view(n + 1, R, h, dk)
        values = vc.view(-1, h, dv).index_select(0, where).view(n + 1, R, h, dv)
        if self.compiled:  # products and sums inductor fuses with the gather: the history is never copied
            scores = (q.view(1, R, h, dk).float() * keys.float()).sum(-1) / math.sqrt(dk)  # (n + 1, R, h)
            a = (torch.softmax(scores, dim=0).unsqueeze(-1) * values.float()).sum(0).to(q.dtype)
        elif self.sdpa:  # the history read in place: (R, h, n + 1, d) views, the last dimension contiguous
            a = F.scaled_dot_product_attention(q.view(R, h, 1, dk), keys.permute(1, 2, 0, 3),
                                               values.permute(1, 2, 0, 3))
        else:  # the module's arithmetic (model.py), bit for bit
            scores = q.view(R, h, 1, dk) @ keys.permute(1, 2, 3, 0) / math.sqrt(dk)  # (R, h, 1, n + 1)
            a = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ values.permute(1, 2, 0, 3)
        return self.linear(a.reshape(R, h * dv), L.o)

    def _cross_attention(self, y: Tensor, L: _Layer, kv: tuple[Tensor, Tensor], pad: Tensor, g: int,
                         probe: list | None = None) -> Tensor:
        """The g rows of one source are that source's g queries (B, h, g, d_k). probe: [not_word, None]
        -> [not_word, the source word position each row attends to most (R,)] (align_head's head, or
        the heads' mean; EOS and padding excluded, as decode/align.links_of does)."""
        h, dk, dv = L.heads[3:]
        k, v = kv
        B = k.size(0)
        q = self.linear(y, L.cq).view(B, g, h, dk).transpose(1, 2)
        if self.sdpa and probe is None:  # pad: 0, or -inf at padding (start_decoding)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=pad)
            return self.linear(a.transpose(1, 2).reshape(B * g, h * dv), L.co)
        scores = q @ k.transpose(-2, -1) / math.sqrt(dk)
        scores = scores.masked_fill(pad, float("-inf")) if pad.dtype == torch.bool else scores + pad
        p = torch.softmax(scores.float(), dim=-1)
        if probe is not None:
            head = self.align_head[1]
            w = p.mean(1) if head is None else p[:, head]  # (B, g, S)
            probe[1] = w.masked_fill(probe[0], -1.0).argmax(-1).view(-1)
        a = p.to(q.dtype) @ v  # (B, h, g, d_v)
        return self.linear(a.transpose(1, 2).reshape(B * g, h * dv), L.co)


def _int8(w: Tensor, b: Tensor | None) -> Int8Linear:
    lin = torch.nn.Linear(w.size(1), w.size(0), bias=b is not None, device="meta")
    lin.weight = torch.nn.Parameter(w.float(), requires_grad=False)
    if b is not None:
        lin.bias = torch.nn.Parameter(b.float(), requires_grad=False)
    return Int8Linear(lin)


def _weights(layer, dtype: torch.dtype, int8: bool = False) -> _Layer:
    """A decoder layer's projections as `FusedDecoder` uses them (W^Q, W^K, W^V concatenated)."""
    def wb(w: Tensor, b: Tensor) -> Proj:
        return _int8(w, b) if int8 else (w.to(dtype), b.to(dtype))

    def proj(m) -> Proj:
        return wb(m.weight.detach(), m.bias.detach())

    sa, ca = layer.self_attn, layer.cross_attn
    qkv = wb(*(torch.cat([getattr(m, p).detach() for m in (sa.w_q, sa.w_k, sa.w_v)]) for p in ("weight", "bias")))
    norms = [(r.norm.weight.detach(), r.norm.bias.detach()) for r in (layer.res_self, layer.res_cross, layer.res_ffn)]
    return _Layer(qkv, proj(sa.w_o), proj(ca.w_q), proj(ca.w_k), proj(ca.w_v), proj(ca.w_o), proj(layer.ffn.w_1),
                  proj(layer.ffn.w_2), norms, (sa.h, sa.d_k, sa.d_v, ca.h, ca.d_k, ca.d_v))
