"""fp16 training with dynamic loss scaling (Micikevicius et al., 2018), for GPUs without bf16; the
paper trained in fp32 on P100s (§5.2). The loss is multiplied by a scale before backward so that
small gradients survive fp16's range; an update whose gradients overflow is skipped and the scale
halved, and after `growth_interval` clean updates it doubles. torch.amp.GradScaler does that
arithmetic; this module adds what a run needs around it: the count of skipped updates, its state
in checkpoints, and a guard that ends a run whose scale has collapsed (every update overflowing
is divergence, not noise: fairseq's "minimum loss scale reached"), instead of training on nothing.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..errors import AiaynError

log = logging.getLogger("aiayn")
MIN_SCALE = 1e-4  # fairseq's --min-loss-scale default


class Diverged(AiaynError):
    """Training cannot go on: fp16 gradients overflow at every loss scale."""


class LossScaler:
    """Loss scaling for `precision` fp16; for any other precision every method is the plain step
    (scale 1, nothing skipped, no host-device synchronisation)."""

    def __init__(self, device: torch.device, precision: str, init_scale: float = 2.0 ** 16,
                 growth_interval: int = 2000, min_scale: float = MIN_SCALE, check_every: int = 50):
        self.enabled = precision == "fp16"
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=growth_interval,
                                           enabled=self.enabled)
        self.min_scale, self.check_every, self.steps = min_scale, check_every, 0
        # Updates skipped since the run began, counted on the device: reading it waits for the GPU, so
        # `check` reads it every `check_every` updates (the log's cadence), not every update.
        self._skips = torch.zeros((), dtype=torch.int64, device=device)
        self._reported = 0

    @property
    def skipped(self) -> int:
        return int(self._skips)

    @skipped.setter
    def skipped(self, n: int) -> None:
        self._skips.fill_(n)
        self._reported = n

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float) -> None:
        """Unscale the gradients, clip them (clip_norm > 0), take the optimizer step unless they
        overflowed, and update the scale; every `check_every` updates, `check`. No host-device
        synchronisation in between: with a fused optimizer (on a GPU) the skip happens on the device."""
        if not self.enabled:
            if clip_norm > 0:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            return
        self.scaler.unscale_(optimizer)
        if clip_norm > 0:
            nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        before = self.scaler._get_scale_async().clone()  # the scale as a tensor (get_scale() would wait)
        self.scaler.step(optimizer)  # skipped when an unscaled gradient is inf or NaN
        self.scaler.update()  # halves the scale after an overflow
        self._skips += self.scaler._get_scale_async() < before
        self.steps += 1
        if self.steps % self.check_every == 0:
            self.check()

    def check(self) -> None:
        """Log the updates skipped since the last check, and end a run whose scale has collapsed."""
        skipped, scale = self.skipped, self.scaler.get_scale()
        if skipped > self._reported:
            log.warning("fp16: gradients overflowed; %d update(s) skipped since the last check, loss scale now %g "
                        "(%d skipped so far)", skipped - self._reported, scale, skipped)
            self._reported = skipped
        if scale < self.min_scale:
            raise Diverged(f"fp16 training diverged: the loss scale fell to {scale:g} (below {self.min_scale:g}) "
                           "with gradients still overflowing; train in bf16 or fp32, or lower the learning rate")

    def state_dict(self) -> dict:
        return {**self.scaler.state_dict(), "skipped": self.skipped} if self.enabled else {}

    def load_state_dict(self, state: dict | None) -> None:
        if self.enabled and state:
            self.skipped = int(state.get("skipped", 0))
            self.scaler.load_state_dict({k: v for k, v in state.items() if k != "skipped"})
