"""aiayn: the Transformer of *Attention Is All You Need* (Vaswani et al., 2017).

>>> import aiayn
>>> aiayn.prepare({"train": ("train.en", "train.de"), "valid": ("val.en", "val.de")}, "work/ende", "en", "de",
...               vocab_size=8000)
>>> aiayn.train(aiayn.preset("multi30k"), "work/ende", "runs/ende")
>>> aiayn.Translator.load("runs/ende/checkpoints/best.safetensors").translate(["A dog runs."])

The names that need torch are imported on first use, so that `aiayn --help`, a config check or a bad
flag answer without loading it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .config import (
    Config,
    ConfigError,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TrainConfig,
    apply_overrides,
    load_yaml,
    preset,
)
from .data.prepare import prepare
from .version import __version__

if TYPE_CHECKING:
    from .decode.translator import Translation, Translator
    from .models.rnn import RecurrentModel
    from .models.transformer import Transformer
    from .parsing.model import build_any as build_model
    from .parsing.treesearch import Parser
    from .training.session import train

# the public names that need torch, and where each lives (module, or module:name)
_WITH_TORCH = {"RecurrentModel": ".models.rnn", "Transformer": ".models.transformer",
               "build_model": ".parsing.model:build_any",  # any config's model, §6.3's parser too
               "train": ".training.session", "Translation": ".decode.translator", "Translator": ".decode.translator",
               "Parser": ".parsing.treesearch"}


def __getattr__(name: str) -> object:
    if name not in _WITH_TORCH:
        raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
    module, _, attr = _WITH_TORCH[name].partition(":")
    return getattr(import_module(module, __name__), attr or name)


def __dir__() -> list[str]:  # tab completion lists the lazy names too
    return sorted(set(globals()) | set(_WITH_TORCH))


__all__ = ["__version__", "Config", "ConfigError", "DataConfig", "DecodeConfig", "ModelConfig", "Parser",
           "RecurrentModel", "TrainConfig", "Transformer", "Translation", "Translator", "apply_overrides",
           "build_model", "load_yaml", "preset", "prepare", "train"]
