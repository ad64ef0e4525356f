"""The FLOPs of a Transformer training step by formula (§3.2-§3.4, Table 1's per-layer costs), and
model FLOPs utilisation (MFU) against a GPU's peak.

Counted: every matrix product, forward and backward — the projections W^Q, W^K, W^V, W^O (§3.2.2),
both feed-forward layers (§3.3), the output projection (§3.4), and attention's QKᵀ and AV (Eq. 1)
over the full T × S score matrix (the causal mask does not halve what is written). Backward is twice
forward: each product's input gradient and weight gradient cost one forward product each. Not
counted: biases, softmax, LayerNorm, dropout, embeddings (lookups), the optimizer. This is what
PyTorch's FlopCounterMode counts for the same step (tests/evidence/test_mfu.py checks equality).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..config import ModelConfig

# Dense bf16/fp16 tensor-core peaks (vendor datasheets), by a name fragment of torch.cuda.get_device_name.
PEAK_FLOPS = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12), ("GH200", 989e12),
              ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10G", 70e12),
              ("V100", 125e12), ("T4", 65e12))


def forward_flops(m: ModelConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Forward FLOPs (2 per multiply-add) of a (batch, src_len) → (batch, tgt_len) Transformer step."""
    d, f, h, dk, dv, V = m.d_model, m.d_ff, m.h, m.head_dim_k, m.head_dim_v, m.vocab_size
    S, T = src_len, tgt_len
    qkvo = 2 * d * h * dk + 2 * d * h * dv  # W^Q, W^K (d_k) and W^V, W^O (d_v), per token
    ffn = 2 * d * f
    encoder = S * 2 * (qkvo + ffn) + 2 * h * S * S * (dk + dv)
    self_attn = T * 2 * qkvo + 2 * h * T * T * (dk + dv)
    cross = T * 2 * (d * h * dk + h * dv * d) + S * 2 * (d * h * dk + d * h * dv) + 2 * h * T * S * (dk + dv)
    decoder = self_attn + cross + T * 2 * ffn
    return batch * (m.N * encoder + m.n_dec * decoder + T * 2 * d * V)


def step_flops(m: ModelConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Training FLOPs of one step: forward + backward (2 × forward)."""
    return 3 * forward_flops(m, batch, src_len, tgt_len)


def model_flops(m: ModelConfig, pairs: Iterable[tuple[int, int]]) -> int:
    """Training FLOPs of the sentence pairs themselves, at their own lengths (padding not counted):
    the numerator of MFU. `pairs`: (source length, target length) per sentence, EOS/BOS included."""
    return sum(step_flops(m, 1, s, t) for s, t in pairs)


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named `device_name`, or None when it is not in PEAK_FLOPS."""
    return next((peak for key, peak in PEAK_FLOPS if key in device_name), None)
