"""Label-smoothed cross-entropy (§5.4), as a pure function.

Two implementations of one formula: on a CPU, 64-row chunks that stay in cache; on a GPU, the
row functions below compiled by TorchInductor into a couple of fused kernels (forward: one read of
the logits; backward: one read, one write), because there the chunks' many elementwise passes over
the logits took ~30 % of a compiled base update (bench/README.md, H200 profile); compiled for any
number of rows, the vocabulary a constant (see `_fused`).
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import Tensor

_ROWS = 64  # rows per chunk: a chunk of fp32 logits stays in cache (128 was 2x slower: bench/README.md)
_GPU_ROWS = 8192  # on a GPU a chunk is a launch: few, large ones (8,192 x 37k fp32 logits: 1.2 GB at most)
log = logging.getLogger("aiayn")


def _rows(x: Tensor) -> int:
    return _ROWS if x.device.type == "cpu" else _GPU_ROWS


def rows_forward(x: Tensor, t: Tensor, keep: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per row: logsumexp (fp32), then the sums over kept rows of the NLL and of the smoothed loss."""
    xf = x.float()
    lse = torch.logsumexp(xf, -1)
    nll_rows = torch.where(keep, lse - xf.gather(1, t[:, None])[:, 0], 0.0)
    smooth_rows = torch.where(keep, lse - xf.mean(-1), 0.0)  # -(1/V) Σ_v log p_v
    return lse, nll_rows.sum(), (1 - eps) * nll_rows.sum() + eps * smooth_rows.sum()


def rows_backward(x: Tensor, t: Tensor, lse: Tensor, w: Tensor, eps: float) -> Tensor:
    """(softmax(x) - q) · w per row, q = (1-ε)·onehot(t) + ε/V, in the logits' dtype."""
    V = x.size(-1)
    onehot = torch.arange(V, device=x.device)[None, :] == t[:, None]
    p = torch.exp(x.float() - lse[:, None])
    return ((p - eps / V - (1 - eps) * onehot) * w[:, None]).to(x.dtype)


def _fused_here(x: Tensor, fused: bool) -> bool:
    """train.fused_loss: the compiled kernels, on a GPU only; false: the chunks there too (bench/gpu/gpu.py
    compares them)."""
    return x.is_cuda and fused


@functools.cache
def _fused(name: str):
    """The row function compiled for any number of rows (token-count batches) with the vocabulary a
    constant: a symbolic size keeps Triton from proving 16-byte alignment, so it loads scalars
    (pytorch/pytorch#176653: 1.5-3.4x slower kernels; an H200 profile had these two at ~1 TB/s of
    4.8). Where TorchInductor cannot compile it (no Triton for this GPU, say), the same function
    uncompiled, with one warning."""
    fn = {"forward": rows_forward, "backward": rows_backward}[name]
    compiled = torch.compile(fn)  # dynamic only where marked below: the rows

    def run(*args):
        nonlocal compiled
        for a in args:
            if isinstance(a, Tensor):
                torch._dynamo.maybe_mark_dynamic(a, 0)  # every tensor argument is (rows, ...)
        try:
            return compiled(*args)
        except Exception as e:  # compiler errors come in many classes; the formula does not change
            if compiled is fn:
                raise
            log.warning("the fused loss (%s) could not be compiled, running it uncompiled: %s", name,
                        f"{type(e).__name__}: {e}".split("\n")[0][:300])
            compiled = fn
            return fn(*args)
    return run


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Sum over non-padding rows of -Σ_v q_v log softmax(x)_v with q = (1-ε)·onehot(y) + ε/V.

    Chunked and fused: forward keeps only logsumexp per row; backward writes
    (softmax(x) - q)·g directly, in the logits' dtype; bf16 logits are read as they are, every
    sum in fp32. Same value and gradient as `F.cross_entropy(x.float(), y, label_smoothing=ε)`,
    in a third of the time on a CPU (bench/README.md). With `reuse` the gradient is written over
    the logits themselves (no second tokens x vocabulary tensor to allocate and fault in).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int, reuse: bool = False,
                fused: bool = True) -> tuple[Tensor, Tensor]:
        n, V = logits.shape
        ctx.epsilon, ctx.pad_id, ctx.reuse = epsilon, pad_id, reuse
        ctx.fused = _fused_here(logits, fused)
        if ctx.fused:
            lse, nll, loss = _fused("forward")(logits, target, target != pad_id, epsilon)
            ctx.save_for_backward(logits, target, lse)
            ctx.mark_non_differentiable(nll)
            return loss, nll
        lse = torch.empty(n, device=logits.device)
        loss = torch.zeros((), device=logits.device)
        nll = torch.zeros((), device=logits.device)
        keep, R = target != pad_id, _rows(logits)
        for s in range(0, n, R):
            x, t, m = logits[s:s + R], target[s:s + R], keep[s:s + R]
            top = x.amax(-1, keepdim=True).float()
            # logsumexp as torch.logsumexp computes it, reading bf16 logits without an fp32 copy
            l = torch.sub(x, top).exp_().sum(-1).log_().add_(top[:, 0])
            lse[s:s + R] = l
            nll_rows = torch.where(m, l - x.gather(1, t[:, None])[:, 0].float(), 0.0)
            smooth_rows = torch.where(m, l - x.mean(-1, dtype=torch.float32), 0.0)  # -(1/V) Σ_v log p_v
            nll += nll_rows.sum()
            loss += (1 - epsilon) * nll_rows.sum() + epsilon * smooth_rows.sum()
        ctx.save_for_backward(logits, target, lse)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        logits, target, lse = ctx.saved_tensors
        eps, V = ctx.epsilon, logits.size(-1)
        if ctx.fused:  # a new gradient tensor: on a GPU memory is not what the reuse saves
            grad = _fused("backward")(logits, target, lse, grad_loss * (target != ctx.pad_id), eps)
            return grad, None, None, None, None, None
        grad = logits if ctx.reuse else torch.empty_like(logits)
        weight = grad_loss * (target != ctx.pad_id)  # 0 on padding rows
        inplace, R = grad.dtype == torch.float32, _rows(logits)  # softmax, then (p - q)·g, in the gradient's rows
        for s in range(0, logits.size(0), R):
            t, w = target[s:s + R, None], weight[s:s + R, None]
            out = grad[s:s + R] if inplace else None  # bf16 logits: the softmax in fp32, rounded once
            p = torch.sub(logits[s:s + R], lse[s:s + R, None], out=out).exp_()
            p.scatter_add_(1, t, torch.full(t.shape, -(1.0 - eps), dtype=p.dtype, device=p.device))
            if inplace:
                p.sub_(eps / V).mul_(w)
            else:
                torch.addcmul(w * (-eps / V), p, w, out=grad[s:s + R])
        return grad, None, None, None, None, None


def label_smoothed_loss(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int, reuse_logits: bool = False, fused: bool = True
) -> tuple[Tensor, Tensor, int]:
    """§5.4 label smoothing ε_ls (Szegedy et al., 2016): cross-entropy against
    q = (1 - ε)·onehot(y) + ε / V, summed over non-padding target tokens.

    logits (..., V), target (...) -> (smoothed loss sum, NLL sum, number of tokens), in float32.
    reuse_logits: backward overwrites the logits with their gradient (a training step that reads
    them no more after the loss: one fresh tokens x vocabulary tensor a step instead of two).
    fused: on a GPU, the compiled kernels (train.fused_loss); False, the chunks there too.
    """
    loss, nll = smoothed_sums(logits, target, epsilon, pad_id, reuse_logits, fused)
    return loss, nll, int((target != pad_id).reshape(-1).sum())


def smoothed_sums(logits: Tensor, target: Tensor, epsilon: float, pad_id: int, reuse_logits: bool = False,
                  fused: bool = True) -> tuple[Tensor, Tensor]:
    """`label_smoothed_loss` without the token count, whose reading waits for a GPU: a training
    step knows its count from the batch and goes on without waiting."""
    logits = logits.reshape(-1, logits.size(-1))
    loss, nll = _SmoothedCrossEntropy.apply(logits, target.reshape(-1), float(epsilon), pad_id, reuse_logits, fused)
    return loss, nll.detach()
