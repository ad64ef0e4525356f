"""Guided alignment (Garg et al., 2019, as fairseq's alignment models train; the paper has none, so
`train.guided_alignment` is 0 by default): one encoder-decoder head is trained toward reference
word alignments of the training pairs (data/alignments.py) by a second loss, added to §5.4's with
that weight: L = L_ls + λ · Σ_{t,s} -G_ts log A_ts, where A is the head's attention (the decoder
position that predicts target subword t over the source subwords) and G spreads each target
subword's reference links evenly (rows without links add nothing).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import Config
from ..data.alignments import reference_links
from ..errors import ConfigError
from ..models.transformer import Transformer


def layer(cfg: Config) -> int | None:
    """The decoder layer whose attention is trained (0-based), None when guided alignment is off."""
    if cfg.train.guided_alignment <= 0:
        return None
    return cfg.train.guided_layer % cfg.model.n_dec


def setup(cfg: Config, model: torch.nn.Module, data, tokenizer) -> None:
    """Check the setting against the model and give the training split (batches.TokenData) its
    reference links, so its batches carry alignment targets. Nothing when it is off."""
    if cfg.train.guided_alignment <= 0:
        return
    n, h = cfg.model.n_dec, cfg.model.h
    if not isinstance(model, Transformer):
        raise ConfigError("train.guided_alignment trains a Transformer's encoder-decoder attention; "
                          f"this model is a {type(model).__name__}")
    if not -n <= cfg.train.guided_layer < n or not 0 <= cfg.train.guided_head < h:
        raise ConfigError(f"train.guided_layer {cfg.train.guided_layer} / guided_head {cfg.train.guided_head}: "
                          f"the decoder has layers -{n}..{n - 1} and heads 0..{h - 1}")
    data.links = reference_links(data, tokenizer)


def alignment_loss(attention: Tensor, target: Tensor) -> Tensor:
    """Σ -G log A over the batch: attention A (B, T, S) of one head, target G (B, T, S), in fp32."""
    return -(target * attention.float().clamp_min(1e-9).log()).sum()
