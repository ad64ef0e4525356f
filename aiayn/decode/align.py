"""Word alignments from the encoder-decoder attention (§3.2.3): each target subword is linked to the
source subword one head (or a layer's mean) attends to most when the decoder predicts it, and two
words are linked when any of their subwords are. The head is chosen by measurement (`aiayn align`
scores every one against reference alignments); decoding then reads it from the checkpoint.
The attention comes from one teacher-forced pass over the chosen hypotheses after the search
(the explicit attention path), so the search itself is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from ..checkpoint import CheckpointError
from ..data.tokenizer import BOS, EOS, PAD, is_language_tag, word_starts
from ..score import Links
from .beams import Hypothesis

Head = tuple[int, int | None]  # (layer, head); head None: the mean of the layer's heads


def word_links(sub: Links, src_pieces: list[str], tgt_pieces: list[str]) -> Links:
    """Subword links -> word links (i-j over whitespace words); a leading target-language tag is no
    source word: links to it are dropped and the words counted after it."""
    tag = 1 if src_pieces and is_language_tag(src_pieces[0]) else 0
    s, t = word_starts(src_pieces[tag:]), word_starts(tgt_pieces)
    return {(s[i - tag], t[j]) for i, j in sub if i >= tag}


def _layer_weights(model, s: Tensor, y: Tensor, layer: int) -> Tensor:
    """One decoder layer's encoder-decoder attention (B, h, T, S), teacher-forced: the layers above
    it and the output layer are not computed (4x faster than every map and the logits)."""
    memory, mask, _ = model.encode(s)
    x = model._embed(y, model.tgt_embed, "tgt")  # the decoder's input, as Transformer._decode makes it
    for i in range(layer + 1):
        k, v = model.decoder[i].cross_attn.project_kv(memory)
        x, _, w = model.decoder[i](x, k, v, mask, None, need_weights=i == layer)
    return w


def cross_attention(model, src: list[list[int]], tgt: list[list[int]], batch: int = 32, layer: int | None = None
                    ) -> Iterator[tuple[int, Tensor]]:
    """(index, weights (layers, heads, target subwords, source subwords)) per pair, EOS left out on
    both sides: sources are ids without EOS, targets without BOS/EOS. `layer`: that layer's only
    (a first dimension of 1)."""
    order = sorted(range(len(src)), key=lambda k: len(src[k]))
    device = next(model.parameters()).device
    for start in range(0, len(order), batch):
        ks = order[start:start + batch]
        S, T = max(len(src[k]) for k in ks) + 1, max(len(tgt[k]) for k in ks) + 1
        s = torch.full((len(ks), S), PAD, dtype=torch.long)
        y = torch.full((len(ks), T), PAD, dtype=torch.long)
        for r, k in enumerate(ks):
            s[r, :len(src[k]) + 1] = torch.tensor(src[k] + [EOS])
            y[r, :len(tgt[k]) + 1] = torch.tensor([BOS] + tgt[k])
        with torch.no_grad():
            if layer is None:
                cross = torch.stack(model.attention_maps(s.to(device), y.to(device))[1].cross, 1)
            else:
                cross = _layer_weights(model, s.to(device), y.to(device), layer)[:, None]
        cross = cross.float().cpu()  # (B, layers, h, T, S)
        for r, k in enumerate(ks):
            yield k, cross[r, :, :, :len(tgt[k]), :len(src[k])]


def links_of(weights: Tensor, head: Head) -> Links:
    """One pair's subword links from (layers, heads, T, S) weights: argmax over the source."""
    layer, h = head
    w = weights[layer].mean(0) if h is None else weights[layer, h]
    if w.numel() == 0:
        return set()
    return {(int(i), j) for j, i in enumerate(w.argmax(-1).tolist())}


def candidates(layers: int, heads: int) -> list[Head]:
    """Every head of every layer, and each layer's mean."""
    return [(layer, h) for layer in range(layers) for h in [*range(heads), None]]


def head_name(head: Head) -> str:
    return f"layer {head[0] + 1} " + ("mean" if head[1] is None else f"head {head[1] + 1}")


def hypothesis_links(model, tokenizer, ids: list[list[int]], hyps: list[list[Hypothesis]], head: Head
                     ) -> list[Links]:
    """Word links of each source (ids with EOS) with its best hypothesis, from `head`: taken during
    the search where the fused step kept where it attended (Hypothesis.attended), else from one
    teacher-forced pass over the hypotheses (128 a batch), which a source led by a language tag
    always takes: its links are the argmax over the source words, never the tag."""
    src = [x[:-1] for x in ids]
    tgt = [h[0].tokens if h else [] for h in hyps]
    out: list[Links] = [set() for _ in ids]
    keep = []
    tagged = {k for k in range(len(ids)) if src[k] and is_language_tag(tokenizer.id_to_piece(src[k][:1])[0])}
    for k in (k for k in range(len(ids)) if src[k] and tgt[k]):
        if hyps[k][0].attended is None or k in tagged:  # a tag may take the argmax: read again without it
            keep.append(k)
        else:
            out[k] = word_links({(i, j) for j, i in enumerate(hyps[k][0].attended)},
                                tokenizer.id_to_piece(src[k]), tokenizer.id_to_piece(tgt[k]))
    for k, weights in cross_attention(model, [src[k] for k in keep], [tgt[k] for k in keep], batch=128,
                                      layer=head[0]):
        i = keep[k]
        if i in tagged:  # the argmax over the source words only
            weights[..., 0] = -1.0
        out[i] = word_links(links_of(weights, (0, head[1])), tokenizer.id_to_piece(src[i]),
                            tokenizer.id_to_piece(tgt[i]))
    return out


def checked_head(chosen, cfg, path: Path | str) -> tuple[int, int | None]:
    """A checkpoint's `alignment` metadata as (layer, head or None), checked against the model."""
    layer, head = (chosen.get("layer"), chosen.get("head")) if isinstance(chosen, dict) else (None, None)
    if not (isinstance(layer, int) and 0 <= layer < cfg.n_dec and (head is None or isinstance(head, int) and
                                                                     0 <= head < cfg.h)):
        raise CheckpointError(f"{path}: metadata 'alignment' names no head of this model ({chosen!r})")
    return layer, head
