"""§5.4 residual dropout, with a cheaper mask on a CPU."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Dropout(nn.Module):
    """§5.4 dropout: zero each element with probability p, scale the rest by 1/(1-p).

    Same as `nn.Dropout` on a GPU. On a CPU the mask costs less: PyTorch draws CPU random numbers
    one at a time on one core (`bernoulli_` and `torch.rand` took 6-7 % of a small model's step), so
    each 64-bit draw here makes four 16-bit uniforms u, and an element is dropped when
    u < round(p·65536): p is kept to 1/65536 (0.1 -> 0.100006), and the scale 1/(1-p) uses that
    value, so E[output] = input exactly. 2.6x faster than `torch.rand` (bench/README.md).
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        return x * cpu_keep_mask(x.shape, self.p) * (65536 / (65536 - _dropped(self.p)))


def _dropped(p: float) -> int:
    """How many of the 65,536 values of a 16-bit uniform are dropped for probability p."""
    return min(round(p * 65536), 65535)


def cpu_keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> Tensor:
    """A boolean mask, True with probability 1 - round(p·65536)/65536, from the global CPU generator:
    one 64-bit draw per four elements (four 16-bit uniforms, read as signed)."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2 ** 63), None)
    return bits.view(torch.int16)[:n].view(shape) >= _dropped(p) - 32768
