"""Head gates against heads removed by hand, the gradient proxy against finite differences, and
the role statistics on hand-built attention patterns."""

import copy
import math

import pytest
import torch
from conftest import tiny_config

from aiayn.batches import TokenData
from aiayn.heads import (
    HeadGates,
    ablation_importance,
    attention_modules,
    entropy,
    gradient_importance,
    positional,
    rare_word,
    sink,
)
from aiayn.models import build_model


def tiny_model(vocab: int = 60):
    torch.manual_seed(0)
    cfg = tiny_config()
    cfg.model.vocab_size, cfg.model.p_drop = vocab, 0.0
    return build_model(cfg.model).eval(), cfg


def zeroed(model, sublayer: str, layer: int, head: int):
    """A copy whose W^O ignores one head: its d_v input columns set to zero."""
    m = copy.deepcopy(model)
    mha = attention_modules(m)[sublayer][layer]
    with torch.no_grad():
        mha.w_o.weight[:, head * mha.d_v:(head + 1) * mha.d_v] = 0
    return m


@pytest.mark.parametrize("sublayer,layer,head", [("encoder_self", 0, 1), ("decoder_self", 1, 3), ("cross", 0, 0)])
def test_a_gate_of_zero_removes_the_head_as_zeroing_its_weights_does(sublayer, layer, head):
    model, _ = tiny_model()
    src, tgt = torch.randint(4, 60, (2, 7)), torch.randint(4, 60, (2, 5))
    gates = HeadGates(model)
    with gates.applied():
        assert torch.equal(model(src, tgt), model(src, tgt))  # gates of 1 change nothing
        full = model(src, tgt)
        gates.gates[sublayer][layer, head] = 0.0
        masked = model(src, tgt)
    assert torch.allclose(full, model(src, tgt))  # hooks gone after the block
    assert torch.allclose(masked, zeroed(model, sublayer, layer, head)(src, tgt), atol=1e-5)
    assert not torch.allclose(masked, full)


@pytest.fixture(scope="module")
def valid(toy_prepared):
    return TokenData(toy_prepared, "valid")


def test_ablation_importance_is_the_nll_of_the_model_without_the_head(valid):
    from aiayn.heads import _batches, _nll

    model, cfg = tiny_model()
    base, delta = ablation_importance(model, valid, cfg, torch.device("cpu"))
    bs = _batches(valid, cfg)
    with torch.no_grad():
        assert base == pytest.approx(float(_nll(model, bs, cfg, torch.device("cpu"))), rel=1e-6)
        by_hand = float(_nll(zeroed(model, "cross", 1, 2), bs, cfg, torch.device("cpu"))) - base
    assert delta["cross"][1, 2].item() == pytest.approx(by_hand, abs=1e-5)
    assert {k: tuple(v.shape) for k, v in delta.items()} == {"encoder_self": (2, 4), "decoder_self": (2, 4),
                                                              "cross": (2, 4)}


def test_gradient_importance_is_the_gates_derivative(valid):
    """|∂L/∂g| at g = 1 against central finite differences, on a one-batch set."""
    from aiayn.heads import _batches, _nll

    model, cfg = tiny_model()
    model.double()
    model.out_proj.fp32 = False  # its fp32 cast would meet double weights
    imp = gradient_importance(model, valid, cfg, torch.device("cpu"), batches=1)
    bs, eps = _batches(valid, cfg, 1), 3e-3  # the loss computes in fp32: not too narrow a step
    gates = HeadGates(model)
    with gates.applied(), torch.no_grad():
        for name, (i, j) in (("encoder_self", (0, 0)), ("cross", (1, 3))):
            gates.gates[name] = gates.gates[name].double()
            gates.gates[name][i, j] = 1 + eps
            up = float(_nll(model, bs, cfg, torch.device("cpu")))
            gates.gates[name][i, j] = 1 - eps
            down = float(_nll(model, bs, cfg, torch.device("cpu")))
            gates.gates[name][i, j] = 1.0
            assert imp[name][i, j].item() == pytest.approx(abs(up - down) / (2 * eps), rel=5e-3)


def test_roles_on_hand_built_patterns():
    T = 5
    prev = torch.zeros(T, T)
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1  # every query on the token before it
    uniform = torch.full((T, T), 1 / T)
    keys = torch.tensor([7, 9, 8, 11, 3])  # 3 = EOS
    eos = torch.zeros(T, T)
    eos[:, 4] = 1
    w = torch.stack([prev, uniform, eos])  # (h = 3, T, S)
    assert positional(w, -1).tolist() == pytest.approx([1.0, 0.2, 0.0])  # no query after the EOS key
    assert positional(w, +1).tolist() == pytest.approx([0.0, 0.2, 0.25])  # query 3 of queries 0-3
    assert entropy(w).tolist() == pytest.approx([0.0, math.log(T), 0.0], abs=1e-6)
    assert sink(w, keys, {3}).tolist() == pytest.approx([0.0, 0.2, 1.0])
    freq = {7: 50, 9: 2, 8: 40, 11: 30, 3: 1000}
    assert rare_word(w, keys, freq, skip={3}).tolist() == pytest.approx([0.2, 0.2, 0.0])  # token 9 at key 1
