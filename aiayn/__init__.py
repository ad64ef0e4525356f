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
from .data import prepare
from .version import __version__

if TYPE_CHECKING:
    from .baselines.rnn import RecurrentModel
    from .model import Transformer
    from .models import build_model
    from .training import train
    from .translate import Translation, Translator
    from .treesearch import Parser

# the public names that need torch, and the module each lives in
_WITH_TORCH = {"RecurrentModel": ".baselines.rnn", "Transformer": ".model", "build_model": ".models",
               "train": ".training", "Translation": ".translate", "Translator": ".translate", "Parser": ".treesearch"}


def __getattr__(name: str) -> object:
    if name not in _WITH_TORCH:
        raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
    return getattr(import_module(_WITH_TORCH[name], __name__), name)


def __dir__() -> list[str]:  # tab completion lists the lazy names too
    return sorted(set(globals()) | set(_WITH_TORCH))


__all__ = ["__version__", "Config", "ConfigError", "DataConfig", "DecodeConfig", "ModelConfig", "Parser",
           "RecurrentModel", "TrainConfig", "Transformer", "Translation", "Translator", "apply_overrides",
           "build_model", "load_yaml", "preset", "prepare", "train"]
