"""The learned linear projections of §3.2.2, §3.3 and §3.4 (y = x Wᵀ + b), with a CPU kernel choice.

PyTorch runs fp32 `F.linear` on the CPU through MKL, which on AMD processors takes a slower code
path: on this 2-core Zen 5, MKL reached 150 GFLOP/s and oneDNN (shipped inside PyTorch, used for
its bf16 matmuls) 270 GFLOP/s on the same fp32 product. `Linear` sends fp32 CPU products to
oneDNN, forward and backward, where the CPU has AVX-512 (`onednn_fp32`: training and decoding); the
arithmetic is still IEEE fp32, only the kernel differs (results agree with `F.linear` to rounding).
Everything else — GPU, bf16 autocast, `torch.compile`, a PyTorch without the oneDNN op — uses
`F.linear`. Set AIAYN_ONEDNN_LINEAR=0 to always use `F.linear` (bench/train/linear_cpu.py measures both).

oneDNN keeps a compiled kernel per product shape (1,024 by default). In training, token-count
batches bring new shapes all the time and the cache grew bf16 training of the small model to
2 GB, so aiayn's training asks for 16 (1.46 GB, same speed); decoding reuses its shapes step
after step and is about 20 % faster with 1,024, which `Translator` asks for (`kernel_cache`).
Importing aiayn changes nothing: the variable is set where aiayn's training or decoding starts,
never when the user has set ONEDNN_PRIMITIVE_CACHE_CAPACITY, and oneDNN reads it once, at the
process's first oneDNN product.
"""

from __future__ import annotations

import functools
import itertools
import os
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..device import cpu_flags, int8_kernel

_CACHE_VAR = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
_USER_CACHE = _CACHE_VAR in os.environ  # the user's choice always wins


def kernel_cache(capacity: int) -> None:
    """Ask for a oneDNN kernel cache of `capacity` shapes, unless ONEDNN_PRIMITIVE_CACHE_CAPACITY
    was set by the user. oneDNN reads it once, at this process's first oneDNN product."""
    if not _USER_CACHE:
        os.environ[_CACHE_VAR] = str(capacity)


@functools.cache
def onednn_available() -> bool:
    """True if this PyTorch has oneDNN's dense linear op and it computes x Wᵀ + b."""
    if os.environ.get("AIAYN_ONEDNN_LINEAR", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    try:
        # Fixed values, not torch.randn: drawing from the global generator here would shift every
        # later dropout mask of the process, and a resumed run would no longer replay its RNG.
        x = torch.linspace(-1.0, 1.0, 15).reshape(3, 5)
        w, b = torch.linspace(0.5, -0.7, 20).reshape(4, 5), torch.tensor([0.1, -0.2, 0.3, 0.0])
        y = torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
        return bool(torch.allclose(y, F.linear(x, w, b), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def onednn_fp32() -> bool:
    """Whether fp32 products go to oneDNN, in training and in decoding: with AVX-512 they are up to 1.8x
    faster than MKL's. On an AVX2 CPU (device.cpu_flags, so ONEDNN_MAX_CPU_ISA=AVX2 too) they are not:
    training ran no faster end to end and peaked 230 MB higher (the weight gradient's transposed operands
    cost oneDNN copies; bench/README.md), and on a real AVX2 Zen 3 a beam's 4-16 rows took 1.5-4x MKL's
    time (bench/decode/2026-12-03_family25-zen3_fp32_products.json), so both take F.linear there."""
    return "avx512f" in cpu_flags()


def fp32_kernel_words(device: torch.device, precision: str) -> str:
    """For a decoding log line: which kernel fp32 CPU products take here and why (empty elsewhere)."""
    if device.type != "cpu" or precision != "fp32":
        return ""
    if onednn_available() and onednn_fp32():
        return "; fp32 products through oneDNN (the CPU has AVX-512)"
    why = "no AVX-512, where oneDNN's are slower" if onednn_available() else "no oneDNN linear op in this PyTorch"
    return f"; fp32 products through MKL (F.linear): {why}"


def onednn_linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """y = x Wᵀ + b; backward: dx = dy W, dW = dyᵀ x, db = Σ dy, each one oneDNN product."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        n_out, n_in = weight.shape
        # A gradient with zero strides (that of `y.sum()` is ones expanded) sends oneDNN to a
        # kernel about 150x slower; a dense copy costs almost nothing beside the products.
        g, x2 = grad.contiguous().reshape(-1, n_out), x.reshape(-1, n_in)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = onednn_linear(g, weight.t()).view(x.shape)
        if ctx.needs_input_grad[1]:
            # oneDNN is about 2x faster with the smaller dimension as the product's rows.
            dw = onednn_linear(x2.t(), g.t()).t().contiguous() if n_out >= n_in else onednn_linear(g.t(), x2.t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum(0)
        return dx, dw, db


def _autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def _compiling() -> bool:
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling and is_compiling())


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state-dict keys) whose fp32 CPU products run on oneDNN."""

    def forward(self, x: Tensor) -> Tensor:
        if (x.device.type == "cpu" and x.dtype == torch.float32 and self.weight.dtype == torch.float32
                and not _autocast_on() and not _compiling() and onednn_available() and onednn_fp32()):
            return _OneDNNLinear.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


_FBGEMM_LAYERS: weakref.WeakValueDictionary[int, Int8Linear] = weakref.WeakValueDictionary()
_HANDLES = itertools.count()


@torch.library.custom_op("aiayn::fbgemm_int8_linear", mutates_args=(), schema="(Tensor x, int layer) -> Tensor")
def _fbgemm_op(x: Tensor, layer: int) -> Tensor:
    """An fbgemm Int8Linear as one opaque operation for torch.compile (its packed weights are no
    tensor, and dynamo would split the graph at each product)."""
    return _FBGEMM_LAYERS[layer].forward(x)


@_fbgemm_op.register_fake
def _(x: Tensor, layer: int) -> Tensor:
    return x.new_empty(*x.shape[:-1], _FBGEMM_LAYERS[layer].out_features)


class Int8Linear(nn.Module):
    """y ≈ x Wᵀ + b (§3.2.2, §3.3, §3.4) with int8 weights (one scale per output channel) and integer
    activations with one scale per row, computed when the row arrives (dynamic quantization). A
    row's result depends on that row only, so a sentence translates the same in any batch — which
    PyTorch's `quantize_dynamic` (one activation scale per tensor) does not give. The product is
    exact integer arithmetic by one of two kernels (`kernel`, default device.int8_kernel()):
    - "int_mm" (VNNI): rows x_q = round(x / s), s = max|x| / 127, `torch._int_mm` (32-bit sums);
    - "fbgemm" (AVX2 without VNNI, whose 16-bit pair sums would saturate 8-bit operands): rows
      scaled to max|x| = 1 plus one anchor row [1, -64/63, 0, ...] fix fbgemm's per-tensor
      activation range to [-64/63, 1] in every batch, so its reduce-range (7-bit) quantization is
      x_q = round(63 x / max|x|) + 64 for each row; the result is scaled back by max|x|.
    Weights: w_q = round(W / s_w), s_w = max|W_row| / 127, the same for both kernels."""

    def __init__(self, linear: nn.Linear, kernel: str | None = None):
        super().__init__()
        w = linear.weight.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernel = kernel or int8_kernel() or "int_mm"
        scale = w.abs().amax(1).clamp_min(1e-12) / 127
        self.register_buffer("w_scale", scale)  # (out,)
        self.register_buffer("w_q", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8).t().contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self._pack()

    def _pack(self) -> None:
        """fbgemm's packed weights (not a buffer: rebuilt from w_q and w_scale), and the anchor row."""
        if self.kernel != "fbgemm":
            return
        zero = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated (torch 2.13); int8_kernel checks the op
            warnings.simplefilter("ignore", UserWarning)
            w = torch._make_per_channel_quantized_tensor(self.w_q.t().contiguous(), self.w_scale.double(), zero, 0)
        self._packed = torch.ops.quantized.linear_prepack(w, None)
        self._handle = next(_HANDLES)
        _FBGEMM_LAYERS[self._handle] = self
        self._anchor = torch.zeros(2 if self.in_features == 1 else 1, self.in_features)
        self._anchor.view(-1)[:2] = torch.tensor([1.0, -64 / 63])

    @staticmethod
    def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
        """x (m, k) float -> int8 rows and their scales (m, 1): x ≈ x_q · s."""
        s = x.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
        return (x / s).round_().clamp_(-127, 127).to(torch.int8), s

    def _products(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """x (m, k) -> (y, s, s_w): x Wᵀ = y · s (· s_w), y (m, out) the kernel's result, s (m, 1)
        the rows' scales, s_w the channels' (None: the kernel applied them)."""
        if self.kernel == "int_mm":
            x_q, s = self.quantize_rows(x)
            return torch._int_mm(x_q, self.w_q), s, self.w_scale  # exact integer sums
        m = x.size(0)
        s = x.abs().amax(1, keepdim=True).clamp_min_(1e-30)
        rows = x.new_empty(m + self._anchor.size(0), self.in_features)
        torch.div(x, s, out=rows[:m])
        rows[m:] = self._anchor
        return torch.ops.quantized.linear_dynamic(rows, self._packed, True)[:m], s, None

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "fbgemm" and _compiling():
            return _fbgemm_op(x, self._handle)
        shape = x.shape
        y, s, s_w = self._products(x.reshape(-1, self.in_features).float())
        if s_w is None and not _compiling():  # fbgemm's fresh fp32 result, scaled in place (one pass)
            out = y.mul_(s) if self.bias is None else torch.addcmul(self.bias, y, s, out=y)
            return out.view(*shape[:-1], self.out_features)
        if _compiling():  # inductor fuses the epilogue; a Python loop over rows would fix their number
            out = y * s * s_w
            return (out if self.bias is None else out + self.bias).view(*shape[:-1], self.out_features)
        out = torch.empty(y.shape, device=y.device)
        # Back to floats by blocks of rows that stay in cache (the output layer's (m, 8000) result
        # is memory-bound: 2.4 vs 3.2 ms for 1,000 rows in one pass on a 2-core CPU).
        step = max(1, (1 << 18) // self.out_features)
        for i in range(0, y.size(0), step):
            o = torch.mul(y[i:i + step], s[i:i + step], out=out[i:i + step]).mul_(s_w)
            if self.bias is not None:
                o.add_(self.bias)
        return out.view(*shape[:-1], self.out_features)

    def select(self, rows: Tensor) -> Int8Linear:
        """The same layer restricted to output channels `rows`, with the same numbers."""
        sub = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(sub)
        sub.in_features, sub.out_features, sub.kernel = self.in_features, rows.numel(), self.kernel
        sub.register_buffer("w_scale", self.w_scale.index_select(0, rows))
        sub.register_buffer("w_q", self.w_q.index_select(1, rows).contiguous())
        sub.register_buffer("bias", None if self.bias is None else self.bias.index_select(0, rows))
        sub._pack()
        return sub

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int8 weights and rows ({self.kernel})")
