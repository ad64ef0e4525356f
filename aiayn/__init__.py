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

from .config import Config, ConfigError, DataConfig, DecodeConfig, ModelConfig, TrainConfig
from .data.prepare import prepare
from .doors import lazy
from .overrides import apply_overrides, load_yaml, preset
from .version import __version__

if TYPE_CHECKING:
    from .decode.translator import Translation, Translator
    from .models.rnn import RecurrentModel
    from .models.transformer import Transformer
    from .parsing.treesearch import Parser
    from .training.session import train

# the public names that need torch, and where each lives (module, or module:name)
_WITH_TORCH = {"RecurrentModel": "models.rnn", "Transformer": "models.transformer",
               "train": "training.session", "Translation": "decode.translator", "Translator": "decode.translator",
               "Parser": "parsing.treesearch"}
__getattr__, _lazy_dir = lazy(__name__, _WITH_TORCH)


def build_model(cfg: ModelConfig, pieces: list[str] | None = None):
    """The model any config names: a translation model (models/build.py, without importing the
    parser), or §6.3's parser when the config turns on its inputs (parsing/model.py's build_any)."""
    if cfg.parser_inputs:
        return import_module(".parsing.model", __name__).build_any(cfg, pieces)
    return import_module(".models.build", __name__).build_model(cfg, pieces)


def __dir__() -> list[str]:  # tab completion lists the lazy names too
    return sorted(set(globals()) | set(_lazy_dir()))


__all__ = ["__version__", "Config", "ConfigError", "DataConfig", "DecodeConfig", "ModelConfig", "Parser",
           "RecurrentModel", "TrainConfig", "Transformer", "Translation", "Translator", "apply_overrides",
           "build_model", "load_yaml", "preset", "prepare", "train"]
