"""The oneDNN fp32 path of `Linear` against `F.linear`: same values and gradients (to fp32
rounding), and the cases that must fall back to `F.linear` exactly; `Int8Linear` against exact
integer arithmetic and the rounding bound."""

import pytest
import torch
import torch.nn.functional as F
from conftest import requires_int8, requires_vnni

from aiayn.models import linear
from aiayn.models.linear import Int8Linear, Linear

needs_onednn = pytest.mark.skipif(not linear.onednn_available(), reason="no oneDNN linear op in this PyTorch")


def reference(layer: Linear, x: torch.Tensor):
    """Output and gradients through plain F.linear on copies of the same tensors."""
    w = layer.weight.detach().clone().requires_grad_()
    b = None if layer.bias is None else layer.bias.detach().clone().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    y = F.linear(xr, w, b)
    return y, xr, w, b


@needs_onednn
@pytest.mark.parametrize("n_in,n_out", [(16, 16), (16, 48), (48, 16), (8, 300)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(37,), (5, 7)])
def test_onednn_linear_matches_f_linear(n_in, n_out, bias, shape, monkeypatch):
    monkeypatch.setattr(linear, "onednn_fp32", lambda: True)  # the oneDNN path, on any CPU
    torch.manual_seed(0)
    layer = Linear(n_in, n_out, bias=bias)
    x = torch.randn(*shape, n_in, requires_grad=True)
    y = layer(x)
    assert y.grad_fn is not None and "OneDNN" in type(y.grad_fn).__name__  # the oneDNN path ran
    g = torch.randn_like(y)
    y.backward(g)
    y_ref, x_ref, w_ref, b_ref = reference(layer, x)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer.weight.grad, w_ref.grad, atol=1e-4, rtol=1e-5)
    assert layer.weight.grad.is_contiguous()
    if bias:
        torch.testing.assert_close(layer.bias.grad, b_ref.grad, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_onednn_linear_non_contiguous_input_and_frozen_weight():
    torch.manual_seed(1)
    layer = Linear(12, 20)
    layer.weight.requires_grad_(False)
    x = torch.randn(12, 9, requires_grad=True)
    y = layer(x.t())  # a transposed view
    y.sum().backward()
    torch.testing.assert_close(y, F.linear(x.t(), layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(9, 12).t(), atol=1e-5, rtol=1e-5)
    assert layer.weight.grad is None


def test_falls_back_to_f_linear_exactly(monkeypatch):
    """bf16 autocast, bf16 weights and a switched-off oneDNN path give F.linear's exact result."""
    torch.manual_seed(2)
    layer = Linear(16, 24)
    x = torch.randn(6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        assert y.dtype == torch.bfloat16
        assert torch.equal(y, F.linear(x, layer.weight, layer.bias))
    monkeypatch.setattr(linear, "onednn_available", lambda: False)
    y = layer(x)
    assert y.grad_fn is not None and "OneDNN" not in type(y.grad_fn).__name__
    assert torch.equal(y, F.linear(x, layer.weight, layer.bias))


@needs_onednn
def test_fp32_products_take_onednn_only_with_avx512_in_training_and_decoding(monkeypatch):
    """On an AVX2 CPU (or under ONEDNN_MAX_CPU_ISA=AVX2) fp32 products take F.linear, in training (no
    faster there, 230 MB less at the peak) and in decoding (oneDNN 1.5-4x slower at a beam's rows on a
    real Zen 3): the modules' forward with and without gradients, and the fused decoder's own products."""
    from aiayn.config import ModelConfig
    from aiayn.decode.fast import FusedDecoder
    from aiayn.models.transformer import Transformer

    layer, x = Linear(16, 24), torch.randn(6, 16)
    model = Transformer(ModelConfig(vocab_size=20, d_model=16, d_ff=32, h=2, N=1, max_positions=16)).eval()
    real, calls = linear.onednn_linear, []
    monkeypatch.setattr(linear, "onednn_linear", lambda *a: calls.append(1) or real(*a))
    for flags, onednn in (({"avx2", "fma"}, False), ({"avx2", "avx512f", "avx512bw"}, True)):
        monkeypatch.setattr(linear, "cpu_flags", lambda flags=flags: set(flags))
        linear.onednn_fp32.cache_clear()
        assert linear.onednn_fp32() is onednn
        assert ("OneDNN" in type(layer(x).grad_fn).__name__) is onednn
        calls.clear()
        with torch.no_grad():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        assert bool(calls) is onednn
        assert (FusedDecoder(model).fp32_linear is real) is onednn
    linear.onednn_fp32.cache_clear()


def test_env_switch_disables_onednn(monkeypatch):
    monkeypatch.setenv("AIAYN_ONEDNN_LINEAR", "0")
    linear.onednn_available.cache_clear()
    try:
        assert linear.onednn_available() is False
    finally:
        monkeypatch.delenv("AIAYN_ONEDNN_LINEAR")
        linear.onednn_available.cache_clear()


def test_kernel_cache_respects_the_users_setting(monkeypatch):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
    monkeypatch.setattr(linear, "_USER_CACHE", False)
    linear.kernel_cache(1024)
    assert linear.os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    monkeypatch.setattr(linear, "_USER_CACHE", True)  # set by the user before aiayn was imported
    linear.kernel_cache(1024)
    assert linear.os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"


def test_kernel_probe_leaves_the_global_generator_alone():
    # The probe runs at the first forward of every process; if it drew random numbers, a resumed
    # process's dropout masks would be shifted against the uninterrupted run's.
    torch.manual_seed(123)
    before = torch.get_rng_state()
    linear.onednn_available.__wrapped__()
    assert torch.equal(torch.get_rng_state(), before)


def test_backward_of_an_expanded_gradient_is_right_and_not_slow():
    # y.sum() hands backward a zero-stride gradient; oneDNN took ~150x longer on it.
    import time

    torch.manual_seed(0)
    lin = Linear(256, 256)
    x = torch.randn(4, 32, 256, requires_grad=True)

    def grads(fn):
        x.grad = lin.weight.grad = lin.bias.grad = None
        fn().sum().backward()
        return x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()

    ours, ref = grads(lambda: lin(x)), grads(lambda: F.linear(x, lin.weight, lin.bias))
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=1e-4)

    def best(fn):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            grads(fn)
            times.append(time.perf_counter() - t)
        return min(times)

    assert best(lambda: lin(x)) < 10 * best(lambda: F.linear(x, lin.weight, lin.bias)) + 0.002


KERNELS = [pytest.param("int_mm", marks=requires_vnni), pytest.param("fbgemm", marks=requires_int8)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n_in,n_out,bias", [(16, 48, True), (37, 5, False), (256, 1, False)])
def test_int8_linear_is_exact_integer_arithmetic_within_the_rounding_bound(n_in, n_out, bias, kernel):
    """Int8Linear against (1) its definition computed another way — symmetric per-row/per-channel
    scales (rows: max|x| / 127 for int_mm, max|x| / 63 for fbgemm's 7 bits), rounded by hand, summed
    in int64 — and (2) fp32 `F.linear` within the bound that rounding allows:
    |xw - x̂ŵ| <= Σ_j (|x_j|·s_w/2 + |w_j|·s_x/2 + s_x·s_w/4)."""
    torch.manual_seed(1)
    layer = torch.nn.Linear(n_in, n_out, bias=bias)
    x = torch.randn(2, 9, n_in) * torch.logspace(-2, 1, 9)[:, None]  # rows of very different sizes
    q = Int8Linear(layer, kernel)
    y = q(x)
    w = layer.weight.detach()
    s_w = w.abs().amax(1) / 127
    x2 = x.reshape(-1, n_in)
    s_x = x2.abs().amax(1) / (127 if kernel == "int_mm" else 63)
    xq, wq = torch.round(x2 / s_x[:, None]).long(), torch.round(w / s_w[:, None]).long()
    exact = (xq @ wq.t()).double() * s_x[:, None].double() * s_w[None, :].double()
    if bias:
        exact = exact + layer.bias.detach().double()
    torch.testing.assert_close(y.reshape(-1, n_out).double(), exact, atol=1e-5, rtol=1e-5)
    bound = (x2.abs() @ (s_w[:, None] / 2).expand(n_out, n_in).t() + (s_x[:, None] / 2) @ w.abs().sum(1)[None]
             + n_in * s_x[:, None] * s_w[None] / 4)
    err = (y.reshape(-1, n_out) - F.linear(x2, w, layer.bias)).abs()
    assert (err <= bound * 1.001 + 1e-6).all()
    assert err.max() > 0  # it really ran in int8


@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_linear_rows_do_not_depend_on_their_batch(kernel):
    """fbgemm quantizes a tensor with one scale: the anchor row must make it the same in any batch."""
    torch.manual_seed(2)
    q = Int8Linear(torch.nn.Linear(32, 24), kernel)
    x = torch.randn(6, 32)
    x[0] *= 100  # one large row must not change the others' scales
    together = q(x)
    for i in range(6):
        assert torch.equal(together[i], q(x[i:i + 1])[0])


@pytest.mark.parametrize("kernel", KERNELS)
def test_an_int8_layer_restricted_to_some_outputs_gives_those_outputs(kernel):
    """`select` (the shortlist's output layer): the same numbers as the whole layer's columns."""
    torch.manual_seed(3)
    q = Int8Linear(torch.nn.Linear(32, 40), kernel)
    x, rows = torch.randn(5, 32), torch.tensor([39, 0, 7, 8])
    assert torch.equal(q.select(rows)(x), q(x)[:, rows])


def test_the_log_names_the_kernels_a_run_takes(monkeypatch):
    from aiayn.training import processes as runs

    monkeypatch.setattr(runs, "native_bf16", lambda: [])
    assert "native bf16 no" in runs.cpu_paths("bf16") and "bf16 through oneDNN" in runs.cpu_paths("bf16")
    monkeypatch.setattr(runs, "native_bf16", lambda: ["avx512_bf16"])
    assert "native bf16 yes (avx512_bf16)" in runs.cpu_paths("bf16")
    monkeypatch.setattr(runs, "onednn_available", lambda: False)
    assert "fp32 products through MKL" in runs.cpu_paths("fp32")
    monkeypatch.setattr(runs, "onednn_available", lambda: True)
    monkeypatch.setattr(runs, "onednn_fp32", lambda: True)
    assert "fp32 products through oneDNN" in runs.cpu_paths("fp32")
    monkeypatch.setattr(runs, "onednn_fp32", lambda: False)  # an AVX2 CPU
    assert "fp32 products through MKL" in runs.cpu_paths("fp32")


@needs_onednn
def test_the_decoding_log_names_the_fp32_kernel_and_why(monkeypatch):
    cpu = torch.device("cpu")
    assert linear.fp32_kernel_words(cpu, "int8") == "" and linear.fp32_kernel_words(torch.device("meta"), "fp32") == ""
    cases = (({"avx2"}, "MKL (F.linear): no AVX-512"), ({"avx2", "avx512f"}, "oneDNN (the CPU has AVX-512)"))
    for flags, words in cases:
        monkeypatch.setattr(linear, "cpu_flags", lambda flags=flags: set(flags))
        linear.onednn_fp32.cache_clear()
        assert words in linear.fp32_kernel_words(cpu, "fp32")
    linear.onednn_fp32.cache_clear()
