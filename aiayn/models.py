"""One factory for the architectures a config can name: the Transformer (§3) or a baseline the
paper compared it with. It sits above both, so neither imports the other."""

from __future__ import annotations

from torch import nn

from .baselines.rnn import RecurrentModel
from .config import ModelConfig
from .model import Transformer


def build_model(cfg: ModelConfig) -> nn.Module:
    """The architecture `cfg.arch` names: the Transformer (default) or the recurrent baseline. Both
    keep search.py's `IncrementalDecoder` contract and return `AttentionMaps`."""
    if cfg.arch == "rnn":
        return RecurrentModel(cfg)
    return Transformer(cfg)
