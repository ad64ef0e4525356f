"""Copies of a model for decoding at another precision (§6.1 decodes what §5 trained): bf16
projections, or int8 weights and activations (models/linear.py's Int8Linear)."""

from __future__ import annotations

import copy

import torch

from .linear import Int8Linear


def cast_bf16(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model whose projections hold bf16 weights, for decoding under bf16 autocast:
    autocast would otherwise round every fp32 weight to bf16 again at every step (the same
    rounding, so the results are identical), which for one sentence cost more than the products.
    Embeddings and LayerNorm stay fp32; the tied output layer gets its own bf16 copy unless it
    computes in fp32 (model.fp32_logits)."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and not getattr(m, "fp32", False):
            m.weight = torch.nn.Parameter(m.weight.detach().to(torch.bfloat16), requires_grad=False)
            if m.bias is not None:
                m.bias = torch.nn.Parameter(m.bias.detach().to(torch.bfloat16), requires_grad=False)
    return model


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model whose projections (§3.2.2, §3.3) and output layer (§3.4) compute with
    int8 weights (one scale per output channel) and int8 activations (one scale per row, taken on
    the fly): linear.Int8Linear. Embeddings, LayerNorm, softmax and attention stay in fp32; the
    tied output layer gets its own int8 copy of the embedding matrix, the embeddings keep theirs."""
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, Int8Linear(child))
    return model
