"""One factory for the architectures a config can name: the Transformer (§3) or a baseline the
paper compared it with. It sits above all three, so none imports another."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

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


_INIT_METHODS = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_}


class _SkipInit(TorchFunctionMode):
    """torch.nn.init's functions and the in-place fills they call leave their tensor as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _INIT_METHODS or getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else next(iter((kwargs or {}).values()))
        return func(*args, **(kwargs or {}))


@contextmanager
def shapes_only() -> Iterator[None]:
    """Models built inside have their parameters' shapes and nothing else: on the meta device, no
    memory, no initialization. (Initializing meta tensors runs PyTorch's Python decompositions,
    which import torch._dynamo: ~1 s of every command that checks a checkpoint's shapes.)"""
    with torch.device("meta"), _SkipInit():
        yield
