"""§5.3 Eq. 3 and §5.4 label smoothing against their formulas."""

import functools
import math

import pytest
import torch

from aiayn.training.loss import label_smoothed_loss
from aiayn.training.optim import noam_lr


@pytest.mark.parametrize("step", [1, 10, 3999, 4000, 4001, 10_000, 100_000])
def test_schedule_is_eq3(step):
    d, warm = 512, 4000
    expected = d ** -0.5 * min(step ** -0.5, step * warm ** -1.5)
    assert noam_lr(step, d, warm) == pytest.approx(expected, rel=1e-12)
    assert noam_lr(step, d, warm, scale=2.0) == pytest.approx(2 * expected, rel=1e-12)


def test_schedule_peaks_at_warmup():
    rates = [noam_lr(s, 512, 4000) for s in range(1, 20_000)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 4000
    assert rates[3999] == pytest.approx(512 ** -0.5 * 4000 ** -0.5)


def direct_smoothed_loss(logits, target, eps, pad):
    """Σ over non-pad tokens of -Σ_v q_v log p_v, q = (1-ε)·onehot + ε/V, written out."""
    V = logits.size(-1)
    total = 0.0
    for row, y in zip(logits.double(), target.tolist()):
        if y == pad:
            continue
        logp = row - torch.log(torch.exp(row).sum())
        q = torch.full((V,), eps / V, dtype=torch.float64)
        q[y] += 1 - eps
        total = total - (q * logp).sum()
    return total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # fp32: in place in the gradient's rows
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_label_smoothing_value_and_gradient(eps, dtype):
    torch.manual_seed(0)
    logits = torch.randn(300, 11, dtype=dtype, requires_grad=True)  # > one chunk of rows
    target = torch.randint(0, 11, (300,))
    target[::7] = 0  # padding
    loss, nll, n = label_smoothed_loss(logits, target, eps, pad_id=0)
    ref = direct_smoothed_loss(logits, target, eps, 0)
    assert n == int((target != 0).sum())
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert nll.item() == pytest.approx(direct_smoothed_loss(logits, target, 0.0, 0).item(), rel=1e-5)
    loss.backward()
    g = logits.grad.clone()
    logits.grad = None
    ref.backward()
    torch.testing.assert_close(g, logits.grad, atol=1e-6, rtol=1e-4)
    assert torch.all(g[::7] == 0)


def test_label_smoothing_bf16_logits():
    torch.manual_seed(1)
    logits = torch.randn(50, 40).bfloat16().requires_grad_()
    target = torch.randint(1, 40, (50,))
    loss, _, _ = label_smoothed_loss(logits, target, 0.1, 0)
    ref = direct_smoothed_loss(logits.float(), target, 0.1, 0)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(ref.item(), rel=1e-5)
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16 and math.isfinite(logits.grad.float().sum().item())
    fp32 = logits.detach().float().requires_grad_()
    direct_smoothed_loss(fp32, target, 0.1, 0).backward()
    torch.testing.assert_close(logits.grad.float(), fp32.grad, atol=1e-2, rtol=1e-2)  # bf16 rounding of the same


@pytest.mark.parametrize("step,factor", [(1, 1 / 800), (400, 0.5), (800, 1.0), (3200, 0.5), (80_000, 0.1)])
def test_a_peak_rate_keeps_eq3s_shape_and_forgets_d_model(step, factor):
    """peak_lr: linear warm-up to the peak at warmup_steps, then ∝ step^-0.5, whatever d_model is."""
    for d in (256, 512):
        assert noam_lr(step, d, 800, peak=2e-3) == pytest.approx(2e-3 * factor, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reused_logits_get_the_same_gradient_in_their_own_storage(dtype):
    """reuse_logits (training's step): backward writes the gradient over the logits, bit for bit the
    gradient a separate tensor gets, through the product that made them."""
    torch.manual_seed(2)
    h = torch.randn(2, 150, 16, requires_grad=True)
    w = torch.randn(23, 16, requires_grad=True)
    target = torch.randint(0, 23, (2, 150))
    target[:, ::5] = 0
    grads = []
    for reuse in (False, True):
        logits = (h @ w.t()).to(dtype)
        loss, _, _ = label_smoothed_loss(logits, target, 0.1, 0, reuse_logits=reuse)
        (loss / 300).backward()
        grads.append((h.grad.clone(), w.grad.clone(), logits.detach().clone()))
        h.grad = w.grad = None
    (h0, w0, kept), (h1, w1, overwritten) = grads
    assert torch.equal(h0, h1) and torch.equal(w0, w1)
    assert not torch.equal(kept, overwritten)  # the storage now holds the gradient
    assert torch.all(overwritten[:, ::5] == 0)  # padding rows: zero gradient


def _gpu_path(monkeypatch, compiled: bool) -> None:
    """The GPU's fused path, taken on the CPU: its row functions as they are (or compiled)."""
    from aiayn.training import loss as L

    monkeypatch.setattr(L, "_fused_here", lambda x, fused: fused)
    if not compiled:
        monkeypatch.setattr(L, "_fused", lambda name: {"forward": L.rows_forward, "backward": L.rows_backward}[name])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_the_gpus_fused_loss_equals_the_formula(monkeypatch, eps, dtype):
    _gpu_path(monkeypatch, compiled=False)
    torch.manual_seed(3)
    logits = torch.randn(130, 37).to(dtype).requires_grad_()
    target = torch.randint(0, 37, (130,))
    target[::6] = 0
    loss, nll, n = label_smoothed_loss(logits, target, eps, pad_id=0)
    fp32 = logits.detach().float().requires_grad_()
    ref = direct_smoothed_loss(fp32, target, eps, 0)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5) and n == int((target != 0).sum())
    assert nll.item() == pytest.approx(direct_smoothed_loss(fp32, target, 0.0, 0).item(), rel=1e-5)
    (2.0 * loss).backward()
    (2.0 * ref).backward()
    assert logits.grad.dtype == dtype and torch.all(logits.grad[::6] == 0)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(logits.grad.float(), fp32.grad, atol=tol, rtol=tol)


@pytest.mark.slow
def test_the_gpus_fused_loss_compiles_for_any_number_of_rows(monkeypatch):
    """torch.compile of the row functions (TorchInductor on the CPU here), the rows dynamic and the
    vocabulary a constant in the generated code (a symbolic one costs Triton its vector loads): three
    batch sizes, one graph each way, the same values as the formula."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    from aiayn.training import loss as L

    _gpu_path(monkeypatch, compiled=True)
    monkeypatch.setattr(L, "_fused", functools.cache(L._fused.__wrapped__))  # compiled afresh here
    torch._dynamo.reset()
    x, t = torch.randn(33, 29, requires_grad=True), torch.randint(0, 29, (33,))
    with torch.no_grad():  # as autograd runs a backward, on the logits it saved
        _, code = run_and_get_code(L._fused("backward"), x, t, torch.logsumexp(x, -1), torch.ones(33), 0.1)
    kernel = "\n".join(code)
    assert "29L" in kernel and "ks1" not in kernel and "ks0" in kernel  # one size symbol, the rows'
    graphs = counters["stats"]["unique_graphs"]
    for rows in (40, 57):
        torch.manual_seed(rows)
        logits = torch.randn(rows, 29, requires_grad=True)
        target = torch.randint(0, 29, (rows,))
        loss, _, _ = label_smoothed_loss(logits, target, 0.1, pad_id=0)
        ref_in = logits.detach().clone().requires_grad_()
        ref = direct_smoothed_loss(ref_in, target, 0.1, 0)
        assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
        loss.backward()
        ref.backward()
        torch.testing.assert_close(logits.grad, ref_in.grad, atol=1e-6, rtol=1e-4)
    assert counters["stats"]["unique_graphs"] - graphs == 1  # the forward's; the backward's was compiled above


def test_the_fused_loss_runs_uncompiled_where_the_compiler_fails(monkeypatch, caplog):
    """A GPU without a working TorchInductor (no Triton, say) trains on: the same rows, uncompiled, one warning."""
    from aiayn.training import loss as L

    def broken(fn, **kw):
        def call(*a):
            raise RuntimeError("no Triton here\nsecond line")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(L, "_fused_here", lambda x, fused: fused)
    monkeypatch.setattr(L, "_fused", functools.cache(L._fused.__wrapped__))  # a fresh cache under the broken compiler
    logits = torch.randn(20, 13, requires_grad=True)
    target = torch.randint(1, 13, (20,))
    with caplog.at_level("WARNING", logger="aiayn"):
        loss, _, _ = label_smoothed_loss(logits, target, 0.1, 0)
        loss.backward()
    ref_in = logits.detach().clone().requires_grad_()
    ref = direct_smoothed_loss(ref_in, target, 0.1, 0)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(logits.grad, ref_in.grad, atol=1e-6, rtol=1e-4)
    assert [r.getMessage().endswith("RuntimeError: no Triton here") for r in caplog.records] == [True, True]
