"""The fast decoder step (§3.2.3, §6.1): the Transformer's decoder computed from its weights, eager,
compiled or replayed as CUDA graphs, in fp32, bf16 or int8. Read first: `fast_decoder` (what the
Translator calls), then fused.py (the step) and mirror.py (the module code it computes again).
"""

from __future__ import annotations

import torch

from ...models.precision import cast_bf16, quantize_int8
from .compiled import compiled_step, warm_up
from .fused import FusedDecoder, FusedState
from .graphed import SHRINK, graphed_beam_search, search_beams
from .mirror import MIRRORED, agrees, fusable
from .options import StepOptions

STEPS = ("auto", "modules", "fused", "compiled", "graphed")  # decode.step


def step_options(step: str) -> StepOptions:
    """decode.step's fused kinds as StepOptions: fused (eager), compiled (torch.compile) or graphed
    (eager, one CUDA graph a step); the rest decided by the device."""
    if step not in ("fused", "compiled", "graphed"):
        raise ValueError(f"no fused step is called {step!r} (fused, compiled or graphed)")
    return StepOptions(compiled=step == "compiled", graphs=step == "graphed")


def fast_decoder(model: torch.nn.Module, precision: str = "fp32", step: str = "fused",
                 options: StepOptions | None = None, check: bool = True) -> FusedDecoder:
    """The fused step of a `fusable` fp32 model at `precision` (fp32, bf16: a bf16 copy of its
    projections; int8: an int8 copy, models/precision.py), run as `step` says (`step_options`;
    `options` overrides them). The given model is left as it is. check False: the caller has
    asked `fusable` already."""
    if check and not fusable(model):
        raise ValueError("this model's decoder is not the one the fused step computes (parser inputs, forward "
                         "hooks, other decoder code, or its logits differ): decode through its modules")
    options = options or step_options(step)
    if precision == "int8":
        return FusedDecoder(model, int8=True, encoder=quantize_int8(model), options=options)
    if precision == "bf16":
        return FusedDecoder(cast_bf16(model), torch.bfloat16, options=options)
    if precision != "fp32":
        raise ValueError(f"no fused step in precision {precision!r} (fp32, bf16 or int8)")
    return FusedDecoder(model, options=options)


__all__ = ["MIRRORED", "SHRINK", "STEPS", "FusedDecoder", "FusedState", "StepOptions", "agrees", "compiled_step",
           "fast_decoder", "fusable", "graphed_beam_search", "search_beams", "step_options", "warm_up"]
