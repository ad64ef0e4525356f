"""aiayn: the Transformer of *Attention Is All You Need* (Vaswani et al., 2017).

>>> import aiayn
>>> aiayn.prepare({"train": ("train.en", "train.de"), "valid": ("val.en", "val.de")}, "work/ende", "en", "de",
...               vocab_size=8000)
>>> aiayn.train(aiayn.preset("multi30k"), "work/ende", "runs/ende")
>>> aiayn.Translator.load("runs/ende/checkpoints/best.safetensors").translate(["A dog runs."])
"""

from .baselines.rnn import RecurrentModel
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
from .model import Transformer
from .models import build_model
from .train import train
from .translate import Translation, Translator
from .treesearch import Parser
from .version import __version__

__all__ = ["__version__", "Config", "ConfigError", "DataConfig", "DecodeConfig", "ModelConfig", "Parser",
           "RecurrentModel", "TrainConfig", "Transformer", "Translation", "Translator", "apply_overrides",
           "build_model", "load_yaml", "preset", "prepare", "train"]
