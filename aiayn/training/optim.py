"""Adam with the warm-up learning-rate schedule of Eq. 3 (§5.3)."""

from __future__ import annotations

import torch
from torch import nn

from ..config import TrainConfig


def noam_lr(step: int, d_model: int, warmup_steps: int, scale: float = 1.0, peak: float = 0.0) -> float:
    """Eq. 3: lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), step >= 1.

    peak > 0: the same shape, scaled so that the rate at step warmup_steps is `peak` (a model
    whose width is not the Transformer's d_model, e.g. the recurrent baselines, gets its own rate)."""
    step = max(step, 1)
    shape = min(step ** -0.5, step * warmup_steps ** -1.5)
    if peak > 0:
        return peak * warmup_steps ** 0.5 * shape
    return scale * d_model ** -0.5 * shape


def learning_rate(step: int, d_model: int, t: TrainConfig) -> float:
    """The rate at `step`: Eq. 3 (train.schedule noam), or for fine-tuning a linear warm-up to
    train.peak_lr held constant after (train.schedule constant)."""
    if t.schedule == "constant":
        return t.peak_lr * min(1.0, max(step, 1) / t.warmup_steps)
    return noam_lr(step, d_model, t.warmup_steps, t.lr_scale, t.peak_lr)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Adam:
    """§5.3: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9; the rate is set per step by `noam_lr`. On a GPU
    the fused kernel (one launch for all parameters); on a CPU PyTorch's default (bit-exact resumes as before)."""
    params = list(model.parameters())
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.Adam(params, lr=0.0, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, fused=fused or None)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
