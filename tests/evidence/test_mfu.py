"""The training-FLOP formula of evidence/mfu.py against PyTorch's FlopCounterMode on real steps."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from aiayn.config import ModelConfig
from aiayn.evidence.mfu import forward_flops, model_flops, peak_flops, step_flops
from aiayn.models.build import build_model


@pytest.mark.parametrize("dims", [dict(d_model=32, d_ff=64, h=4, N=2), dict(d_model=24, d_ff=40, h=2, N=1, N_dec=3,
                                                                             d_k=8, d_v=16)])
@pytest.mark.parametrize("shape", [(3, 7, 5), (2, 4, 9)])
def test_formula_equals_the_counted_forward_and_backward(dims, shape):
    # fp32_logits off: the output projection is then F.linear under autocast, which the counter knows
    # (an fp32 one on a CPU is oneDNN's own op: models/linear.py)
    m = ModelConfig(vocab_size=50, p_drop=0.0, max_positions=64, fp32_logits=False, **dims)
    torch.manual_seed(0)
    model = build_model(m)
    B, S, T = shape
    src, tgt = torch.randint(3, 50, (B, S)), torch.randint(3, 50, (B, T))
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast("cpu", dtype=torch.bfloat16):  # explicit attention: QKᵀ and AV as products
        model(src, tgt).float().sum().backward()
    assert step_flops(m, B, S, T) == counter.get_total_flops()
    with torch.no_grad(), FlopCounterMode(display=False) as fwd, torch.autocast("cpu", dtype=torch.bfloat16):
        model(src, tgt)
    assert forward_flops(m, B, S, T) == fwd.get_total_flops()


def test_model_flops_count_each_sentence_at_its_own_length():
    m = ModelConfig(vocab_size=50, d_model=32, d_ff=64, h=4, N=2)
    assert model_flops(m, [(7, 5), (7, 5)]) == step_flops(m, 2, 7, 5)
    assert model_flops(m, [(3, 2), (7, 5)]) < step_flops(m, 2, 7, 5)  # padding is not model work


def test_base_model_costs_about_six_flops_per_parameter_per_token():
    """The issue's scale: base ≈ 0.38 GFLOP per target token trained (≈ 6 × 63M parameters)."""
    m = ModelConfig(vocab_size=37000)
    per_token = step_flops(m, 1, 28, 28) / 28
    assert 0.33e9 < per_token < 0.43e9


def test_peaks_by_name():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12 and peak_flops("Tesla T4") == 65e12 and peak_flops("cpu") is None
