"""One factory for the architectures a config can name: the Transformer (§3) or a baseline the
paper compared it with. It sits above all three, so none imports another."""

from __future__ import annotations

from torch import nn

from ..config import ConfigError, ModelConfig
from .conv import ConvS2S
from .rnn import RecurrentModel
from .transformer import Transformer


def build_model(cfg: ModelConfig, pieces: list[str] | None = None) -> nn.Module:
    """The architecture `cfg.arch` names: the Transformer (default), the recurrent baseline or
    ConvS2S. All keep decode/search.py's `IncrementalDecoder` contract and return `AttentionMaps`.
    A config with §6.3's parser inputs is refused: parsing/model.py builds those (`build_any`).
    `pieces`, the vocabulary, is for builders that need it (the parser's)."""
    if cfg.parser_inputs:
        raise ConfigError(f"model.{cfg.parser_inputs[0]} is an input of §6.3's parser: parse with `aiayn parse` "
                          "or aiayn.Parser.load (or build with aiayn.build_model)")
    if cfg.arch == "rnn":
        return RecurrentModel(cfg)
    if cfg.arch == "conv":
        return ConvS2S(cfg)
    return Transformer(cfg)
