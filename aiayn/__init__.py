"""aiayn: the Transformer of *Attention Is All You Need* (Vaswani et al., 2017)."""

from .config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig, preset
from .model import Transformer
from .translate import Translator

__version__ = "0.1.0"
__all__ = ["Config", "DataConfig", "DecodeConfig", "ModelConfig", "TrainConfig", "Transformer", "Translator",
           "preset"]
