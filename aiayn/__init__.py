"""aiayn: the Transformer of *Attention Is All You Need* (Vaswani et al., 2017)."""

import os

# oneDNN keeps compiled CPU kernels for every matmul shape it has seen (1024 by default); with
# token-count batches every batch has new shapes, and bf16 training grew to 2 GB for the small
# model. 16 kept it at 1.46 GB at the same speed (bench/train_speed.py). Set it to override.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")

from .config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig, preset
from .model import Transformer
from .translate import Translator

__version__ = "0.1.0"
__all__ = ["Config", "DataConfig", "DecodeConfig", "ModelConfig", "TrainConfig", "Transformer", "Translator",
           "preset"]
