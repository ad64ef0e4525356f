"""§3 and the families it replaced: the Transformer, the recurrent and convolutional baselines.

Read first: transformer.py (§3: the encoder-decoder), attention.py (Eq. 1, §3.2.2), then build.py
(one factory for the architectures a config names) and precision.py (bf16 and int8 copies).
"""

from ..doors import lazy

__all__ = [
    "ConvS2S", "Int8Linear", "MultiHeadAttention", "RecurrentModel", "Transformer", "attention",
    "build_model", "cast_bf16", "quantize_int8", "shapes_only"
]
__getattr__, __dir__ = lazy(__name__, {
    "Transformer": "transformer",
    "RecurrentModel": "rnn",
    "ConvS2S": "conv",
    "MultiHeadAttention": "attention",
    "attention": "attention",
    "build_model": "build",
    "shapes_only": "build",
    "Int8Linear": "linear",
    "cast_bf16": "precision",
    "quantize_int8": "precision",
})
