"""What the fused decoder step (§3.2.3, §6.1) computes again from the weights, and so must follow:
the module step's code, listed once (`MIRRORED`), and `fusable`, which lets a model decode through
the fused step only when its decoder runs that code and one step's logits agree.

Written twice: models/transformer.py's `Transformer.start_decoding`, `decode_step` and the
`DecoderLayer`, `Residual`, `FeedForward` and `MultiHeadAttention` it runs (with models/attention.py's
`attention`), and fused.py's `FusedDecoder` with graphed.py's `static_logits`. A change to one is a
change to the other.
"""

from __future__ import annotations

import torch

from ...data.tokenizer import BOS, EOS
from ...models.attention import MultiHeadAttention
from ...models.dropout import Dropout
from ...models.linear import Linear
from ...models.transformer import DecoderLayer, FeedForward, OutputProjection, Residual, Transformer
from .fused import FusedDecoder

# The module code the fused step computes again from the weights (class -> the methods it mirrors).
# A model whose decoder holds another class, or a subclass that overrides one of these, is not fused.
MIRRORED: dict[type, tuple[str, ...]] = {
    Transformer: ("start_decoding", "decode_step", "_decode", "_embed", "cross_kv"),  # encode: its own runs
    DecoderLayer: ("forward",),
    Residual: ("inp", "out"),
    FeedForward: ("forward",),
    MultiHeadAttention: ("forward", "project_kv", "_split"),
    Linear: ("forward",),
    OutputProjection: ("forward",),
    Dropout: ("forward",),
    torch.nn.LayerNorm: ("forward",),
    torch.nn.Identity: ("forward",),
    torch.nn.ModuleList: (),
}


def _mirrored(m: torch.nn.Module) -> bool:
    """Whether module m runs the very code the fused step mirrors: its class is listed (not a
    subclass of a listed one) and its listed methods are that class's own, not set on the instance."""
    cls = type(m)
    if cls not in MIRRORED and not (isinstance(m, Transformer) and _same_methods(cls, Transformer)):
        return False
    return not any(name in vars(m) for name in MIRRORED.get(cls, MIRRORED[Transformer]))


def _same_methods(cls: type, base: type) -> bool:
    return all(getattr(cls, name) is getattr(base, name) for name in MIRRORED[base])


def fusable(model) -> bool:
    """A model `FusedDecoder` computes exactly: a Transformer whose decoder inputs are the embedded
    token and its position alone (not the parser's with pointer or depth inputs), whose decoding
    code is `MIRRORED`'s (a subclass may add methods, never replace these), with no forward hooks
    on its modules (they must see every call: `aiayn heads`'s gates are hooks), and whose first
    step's logits on a probe sentence agree with the module step's (`agrees`)."""
    if not isinstance(model, Transformer) or model.decoder_inputs or not _mirrored(model):
        return False
    decoder = [model.out_proj, model.tgt_embed, model.dec_norm, *model.decoder.modules()]
    if not all(_mirrored(m) for m in decoder if not isinstance(m, torch.nn.Embedding)):
        return False
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return False
    return agrees(model)


@torch.no_grad()
def agrees(model: Transformer, tol: float = 1e-4) -> bool:
    """One fp32 step from BOS over a probe source of 3 subwords, fused and through the modules: the
    same logits to `tol` (relative to their largest magnitude). Meta-device models, and ones whose
    encoder needs more than the subwords (a tag_input parser without its tagger), pass unchecked."""
    w = model.tgt_embed.weight
    if w.device.type == "meta" or not w.is_floating_point() or w.dtype != torch.float32:
        return True
    V = w.size(0)
    src = torch.tensor([[min(4 + i, V - 1) for i in range(3)] + [EOS]], device=w.device)
    bos = torch.full((1,), BOS, dtype=torch.long, device=w.device)
    was = model.training
    model.eval()
    try:
        with torch.autocast(w.device.type, enabled=False):
            try:
                cache = model.start_decoding(src)
            except ValueError:  # the encoder needs inputs a probe lacks (a parser's tags): the code check stands
                return True
            ref = model.decode_step(bos, cache)
            dec = FusedDecoder(model)
            out = dec.decode_step(bos, dec.start_decoding(src))
    finally:
        model.train(was)
    return bool(((out - ref).abs().max() <= tol * ref.abs().max().clamp_min(1.0)).item())
