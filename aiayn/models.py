"""One factory for the architectures a config can name: the Transformer (§3) or a baseline the
paper compared it with. It sits above all three, so none imports another."""

from __future__ import annotations

from torch import nn

from .baselines.conv import ConvS2S
from .baselines.rnn import RecurrentModel
from .config import ModelConfig
from .model import Transformer
from .parser_model import ParserTransformer, is_parser
from .pointer import bracket_deltas


def build_model(cfg: ModelConfig, pieces: list[str] | None = None) -> nn.Module:
    """The architecture `cfg.arch` names: the Transformer (default), the recurrent baseline or
    ConvS2S; a config with §6.3's parser inputs gets the Transformer with them (parser_model.py).
    All keep search.py's `IncrementalDecoder` contract and return `AttentionMaps`. `pieces`, the
    vocabulary, tells a model.depth_input parser which pieces are brackets."""
    if cfg.arch == "rnn":
        return RecurrentModel(cfg)
    if cfg.arch == "conv":
        return ConvS2S(cfg)
    model = ParserTransformer(cfg) if is_parser(cfg) else Transformer(cfg)
    if cfg.depth_input and pieces is not None:  # without them no piece counts (e.g. to count parameters)
        model.depth.delta.copy_(bracket_deltas(pieces))
    return model
