"""How the fused decoder step (§6.1) runs: eager, compiled or graphed, which attention kernel, and
the device's defaults for each (decode.step and model.attention choose them; bench scripts set them
here, never on a built decoder)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .graphed import SHRINK


@dataclass(frozen=True)
class StepOptions:
    """How the fused step runs. None: chosen by the device as `resolved` says. compiled: under
    torch.compile (`compiled_step`); graphs: eager, each batch's step replayed as one CUDA graph
    (graphed.py; emulated on a CPU); sdpa: attention through SDPA's kernel (model.attention
    sdpa | explicit; auto: eager off the CPU, as the model's own there: a GPU step is launch-bound,
    and the explicit products cost 8 kernels a self-attention, 7 a cross, bench/decode/decode_launches.py);
    shrink: the graphed beam search goes on with its open sentences alone once at most this
    fraction of the batch is open (0: never); eager_first: compiled, the first position runs
    eagerly (auto: on a GPU, where PyTorch's specialized history of length 1 cost two more graphs of
    ~55 s each; a CPU compiles them in seconds and ran single sentences ~1 ms faster with them);
    unbacked: compiled, the numbers of rows and sources are unbacked symbols, so one sentence and a
    batch share their graphs (auto: on a GPU; on a CPU the merged graphs compiled 39 % faster
    but decoded 2-6 % slower)."""

    compiled: bool = False
    graphs: bool = False
    sdpa: bool | None = None
    shrink: float = SHRINK
    eager_first: bool | None = None
    unbacked: bool | None = None

    def resolved(self, device: torch.device, attention: str = "auto") -> StepOptions:
        """Every None decided for `device` (and the model's `attention` setting)."""
        gpu = device.type != "cpu"
        sdpa = not self.compiled and {"sdpa": True, "explicit": False}.get(attention, gpu)  # compiled: its own products
        return dataclasses.replace(
            self, sdpa=sdpa if self.sdpa is None else self.sdpa,
            eager_first=self.compiled and gpu if self.eager_first is None else self.eager_first,
            unbacked=self.compiled and gpu if self.unbacked is None else self.unbacked)
