"""Label-smoothed cross-entropy (§5.4), as a pure function."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_loss(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor, int]:
    """§5.4 label smoothing ε_ls (Szegedy et al., 2016): cross-entropy against
    q = (1 - ε)·onehot(y) + ε / V, summed over non-padding target tokens.

    logits (..., V), target (...) -> (smoothed loss sum, NLL sum, number of tokens), in float32.
    """
    logits = logits.reshape(-1, logits.size(-1)).float()
    target = target.reshape(-1)
    loss = F.cross_entropy(logits, target, ignore_index=pad_id, reduction="sum", label_smoothing=epsilon)
    nll = F.cross_entropy(logits, target, ignore_index=pad_id, reduction="sum") if epsilon else loss
    return loss, nll.detach(), int((target != pad_id).sum())
