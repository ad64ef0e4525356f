"""The fused decoder step (§3.2.3, §6.1) under `torch.compile`: one graph for every batch shape, and a
warm-up that compiles it before the first request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ...data.tokenizer import EOS
from ...device import inductor_cache

log = logging.getLogger("aiayn")


def compiled_step(step, weights: Sequence[Tensor] = (), unbacked=None):
    """`step` under `torch.compile` (inductor) with dynamic shapes: rows, sources, source length,
    cache capacity and position are symbols, so one graph serves every batch; PyTorch specializes
    sizes 0 and 1, which adds single-sentence batches and the first position (a history of length
    1; on a GPU that position runs eagerly: `eager_first`, and `unbacked(args)` names the (tensor,
    dimension) pairs made unbacked symbols, never specialized, so one sentence shares a batch's graphs):
    6 graphs on a CPU, 2 on a GPU (compiled on first use, cached on disk by inductor across processes;
    equal sizes are not merged into one symbol); the `weights` it reads have fixed sizes (as symbols they made the
    generated code generic: single-sentence int8 decoding took twice as long). Elementwise work
    (norms, softmax, int8 row quantization) fuses into generated C++; the numbers agree with eager
    to rounding, not bit for bit (fusions keep some intermediates in fp32)."""
    from torch._dynamo.decorators import mark_unbacked  # here, not at the top: torch._dynamo costs ~0.9 s to import
    from torch.fx.experimental import _config as fx_config

    # Dynamo keeps its graphs per code object and guards them on the decoder's weights, so each
    # FusedDecoder adds about 4: the default limit of 8 would leave a third one uncompiled.
    if torch._dynamo.config.recompile_limit < 64:
        torch._dynamo.config.recompile_limit = 64
    for w in weights:  # the weights' sizes are constants of the graph, not symbols
        torch._dynamo.mark_static(w)
    inductor_cache()
    compiled = torch.compile(step, dynamic=True)

    def run(*args):
        for t, dim in unbacked(args) if unbacked else ():
            mark_unbacked(t, dim)
        # No "duck" sizes: by default PyTorch gives sizes that happen to be equal one symbol (a
        # cache of capacity 64 and d_k = 64), and the cache's growth to 128 then compiled again.
        with fx_config.patch(use_duck_shape=False):
            return compiled(*args)
    return run


def warm_up(translate_ids: Callable[..., object], beam: int) -> float:
    """Compile the encoder and the decoder step now through `translate_ids` (a Translator's): one
    sentence and a batch, the step's first position and the rest (on a GPU one graph each, the rest
    of the positions only), so no request waits for it; returns the seconds it took."""
    start = time.perf_counter()
    # Lengths that equal no other size of the step (beam, h, batch): PyTorch gives equal sizes
    # one symbol, and a real sentence of another length would then compile again.
    ids = [[4 + i % 5 for i in range(n)] + [EOS] for n in (16, 12, 10)]
    translate_ids(ids[:1], beam=beam)
    translate_ids(ids, beam=beam)
    seconds = time.perf_counter() - start
    log.info("encoder and decoder step compiled in %.1f s (torch.compile; inductor caches it on disk)", seconds)
    return seconds
