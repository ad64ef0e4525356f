"""Label-smoothed cross-entropy (§5.4), as a pure function."""

from __future__ import annotations

import torch
from torch import Tensor

_ROWS = 64  # rows per chunk: a chunk of fp32 logits stays in cache (128 was 2x slower: bench/README.md)
_GPU_ROWS = 8192  # on a GPU a chunk is a launch: few, large ones (8,192 x 37k fp32 logits: 1.2 GB at most)


def _rows(x: Tensor) -> int:
    return _ROWS if x.device.type == "cpu" else _GPU_ROWS


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Sum over non-padding rows of -Σ_v q_v log softmax(x)_v with q = (1-ε)·onehot(y) + ε/V.

    Chunked and fused: forward keeps only logsumexp per row; backward writes
    (softmax(x) - q)·g directly, in the logits' dtype; bf16 logits are read as they are, every
    sum in fp32. Same value and gradient as `F.cross_entropy(x.float(), y, label_smoothing=ε)`,
    in a third of the time on a CPU (bench/README.md). With `reuse` the gradient is written over
    the logits themselves (no second tokens x vocabulary tensor to allocate and fault in).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int, reuse: bool = False
                ) -> tuple[Tensor, Tensor]:
        n, V = logits.shape
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
        ctx.epsilon, ctx.pad_id, ctx.reuse = epsilon, pad_id, reuse
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        logits, target, lse = ctx.saved_tensors
        eps, V = ctx.epsilon, logits.size(-1)
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
        return grad, None, None, None, None


def label_smoothed_loss(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int, reuse_logits: bool = False
) -> tuple[Tensor, Tensor, int]:
    """§5.4 label smoothing ε_ls (Szegedy et al., 2016): cross-entropy against
    q = (1 - ε)·onehot(y) + ε / V, summed over non-padding target tokens.

    logits (..., V), target (...) -> (smoothed loss sum, NLL sum, number of tokens), in float32.
    reuse_logits: backward overwrites the logits with their gradient (a training step that reads
    them no more after the loss: one fresh tokens x vocabulary tensor a step instead of two).
    """
    logits = logits.reshape(-1, logits.size(-1))
    target = target.reshape(-1)
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, float(epsilon), pad_id, reuse_logits)
    return loss, nll.detach(), int((target != pad_id).sum())
