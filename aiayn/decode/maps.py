"""Every attention map of one sentence (§3.2; Figures 3-5): one extraction for the plots, the
server and the analysis of heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ..config import DecodeConfig
from ..data.tokenizer import BOS, EOS, Tokenizer
from .beams import Hypothesis


class Searcher(Protocol):
    """What finds the translation whose maps are drawn (a Translator)."""

    decode_cfg: DecodeConfig

    def translate_ids(self, ids: list[list[int]], beam: int | None = None, alpha: float | None = None,
                      nbest: int | None = None) -> list[list[Hypothesis]]: ...


@dataclass
class AttentionData:
    """Every attention map for one sentence pair, numpy (layers, heads, query, key)."""

    src_tokens: list[str]  # source pieces + </s>
    tgt_in_tokens: list[str]  # <s> + target pieces (decoder inputs, self-attention keys)
    tgt_out_tokens: list[str]  # target pieces + </s> (what each decoder position predicts)
    encoder_self: np.ndarray  # (N, h, S, S)
    decoder_self: np.ndarray  # (N, h, T, T)
    cross: np.ndarray  # (N, h, T, S)
    translation: str


def attention_data(model: torch.nn.Module, tokenizer: Tokenizer, src: str, tgt: str | None = None,
                   decode: DecodeConfig | None = None, search: Searcher | None = None) -> AttentionData:
    """Attention weights through the explicit path, returned as values (§3.2). With `tgt` the
    decoder is teacher-forced on it; otherwise on the model's own beam-search translation, found
    by `search` (a Translator of this model: `Translator.attention` makes an fp32 one)."""
    model.eval()
    limit = model.cfg.max_positions - 1
    src_ids = tokenizer.encode([src.strip()])[0][:limit] + [EOS]
    if tgt is None:
        if search is None:
            raise ValueError("attention maps of the model's own translation need a translator to find it (search=)")
        hyps = search.translate_ids([src_ids], beam=(decode or search.decode_cfg).beam, nbest=1)[0]
        tgt_ids = hyps[0].tokens if hyps else []
    else:
        tgt_ids = tokenizer.encode_target([tgt.strip()])[0][:limit - 1]
    device = next(model.parameters()).device
    with torch.no_grad():
        _, maps = model.attention_maps(torch.tensor([src_ids], device=device),
                                       torch.tensor([[BOS] + tgt_ids], device=device))

    def stack(ws: list[torch.Tensor]) -> np.ndarray:  # the recurrent model has no self-attention
        return torch.stack([w[0].float() for w in ws]).cpu().numpy() if ws else np.zeros((0, 1, 0, 0))

    return AttentionData(
        src_tokens=tokenizer.id_to_piece(src_ids),
        tgt_in_tokens=tokenizer.id_to_piece([BOS] + tgt_ids),
        tgt_out_tokens=tokenizer.id_to_piece(tgt_ids + [EOS]),
        encoder_self=stack(maps.encoder_self), decoder_self=stack(maps.decoder_self), cross=stack(maps.cross),
        translation=tokenizer.decode([tgt_ids])[0],
    )
