"""The recurrent attention baseline: attention against its formulas, cached decoding against the
teacher-forced forward, batch against one by one, overfitting, and the toolkit around it."""

import math

import pytest
import torch
from conftest import (
    check_baseline_toolkit,
    check_cached_steps_and_padding,
    check_grouped_cache,
    check_overfits,
    check_serves,
    tiny_config,
)

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.config import ConfigError, ModelConfig
from aiayn.models.build import build_model
from aiayn.models.rnn import AdditiveAttention, MultiplicativeAttention, RecurrentModel, attend
from aiayn.overrides import preset
from aiayn.training.session import train

KINDS = [(cell, att) for cell in ("lstm", "gru") for att in ("additive", "dot", "general", "bahdanau")]


def rnn(cell="lstm", att="additive", **kw) -> RecurrentModel:
    """att "bahdanau": Bahdanau et al.'s decoder (additive score); the others: Luong et al.'s."""
    torch.manual_seed(0)
    variant = "bahdanau" if att == "bahdanau" else "luong"
    cfg = ModelConfig(arch="rnn", vocab_size=23, d_model=16, N=2, p_drop=0.0, rnn_cell=cell,
                      rnn_attention="additive" if att == "bahdanau" else att, rnn_variant=variant)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return build_model(cfg).eval()


def test_additive_attention_is_bahdanau_formula():
    torch.manual_seed(0)
    d, B, g, S = 6, 2, 3, 5
    a = AdditiveAttention(d)
    q, mem = torch.randn(B, g, d), torch.randn(B, S, d)
    got = a.scores(q, a.keys(mem))
    with torch.no_grad():
        W, U, b, v = a.W.weight.double(), a.U.weight.double(), a.U.bias.double(), a.v.weight.double()[0]
    for i in range(B):
        for t in range(g):
            for j in range(S):
                e = sum(float(v[r]) * math.tanh(float(W[r] @ q[i, t].double() + U[r] @ mem[i, j].double() + b[r]))
                        for r in range(d))
                assert abs(got[i, t, j].item() - e) < 1e-5


@pytest.mark.parametrize("general", [False, True])
def test_multiplicative_attention_is_luong_formula(general):
    torch.manual_seed(0)
    d, B, g, S = 6, 2, 3, 5
    a = MultiplicativeAttention(d, general)
    q, mem = torch.randn(B, g, d), torch.randn(B, S, d)
    got = a.scores(q, a.keys(mem))
    Wa = a.W_a.weight.detach().double() if general else torch.eye(d, dtype=torch.float64)
    for i in range(B):
        for t in range(g):
            for j in range(S):
                e = float(q[i, t].double() @ (Wa @ mem[i, j].double()))
                assert abs(got[i, t, j].item() - e) < 1e-5


def test_attend_ignores_padding_and_averages_states():
    torch.manual_seed(0)
    scores, mem = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    ctx, w = attend(scores, mask, mem)
    assert torch.all(w[0, :, 3] == 0)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3))
    e = scores[0, 1, :3].exp()
    assert torch.allclose(ctx[0, 1], (e / e.sum()) @ mem[0, :3], atol=1e-6)


@pytest.mark.parametrize("cell,att", KINDS)
def test_cached_steps_equal_teacher_forced_forward_and_padding_changes_nothing(cell, att):
    check_cached_steps_and_padding(rnn(cell, att), atol=1e-6)


def _lstm_step(cell, x, h, c):
    """An LSTM step written out: i, f, g, o = W x + U h + b."""
    z = cell.ih.weight @ x + cell.ih.bias + cell.hh.weight @ h
    i, f, g, o = z.chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def test_bahdanau_decoder_is_the_papers_equations():
    """Bahdanau et al. (2015): e_tj = vᵀ tanh(W s_{t-1} + U h_j), c_t = Σ α_tj h_j, s_t = f(s_{t-1},
    [E y_{t-1}; c_t]), t = maxout(U_o s_t + V_o E y_{t-1} + C_o c_t), p(y_t) = softmax(E t)."""
    m = rnn("lstm", "bahdanau", N=1)
    src, tgt = torch.randint(4, 23, (1, 5)), torch.randint(4, 23, (1, 4))
    got = m(src, tgt)[0]
    with torch.no_grad():
        memory, _, h0, c0 = m.encode(src)
        H, s, c = memory[0], h0[0][0], c0[0][0]
        a, E = m.attention, m.tgt_embed.weight
        for t in range(4):
            e = torch.stack([a.v.weight[0] @ torch.tanh(a.W.weight @ s + a.U.weight @ H[j] + a.U.bias)
                             for j in range(5)])
            ctx = torch.softmax(e, 0) @ H  # from s_{t-1}: before the cell runs
            y = E[tgt[0, t]]
            s, c = _lstm_step(m.cells[0], torch.cat([y, ctx]), s, c)
            pre = m.deep_out.weight @ torch.cat([s, y, ctx]) + m.deep_out.bias
            logits = E @ pre.view(-1, 2).amax(-1)
            assert torch.allclose(got[t], logits, atol=1e-5), t


def test_luong_decoder_is_the_papers_equations():
    """Luong et al. (2015): h_t = f(h_{t-1}, [E y_{t-1}; h̃_{t-1}]), c_t from h_t (global attention),
    h̃_t = tanh(W_c [c_t; h_t]), p(y_t) = softmax(E h̃_t)."""
    m = rnn("lstm", "dot", N=1)
    src, tgt = torch.randint(4, 23, (1, 5)), torch.randint(4, 23, (1, 4))
    got = m(src, tgt)[0]
    with torch.no_grad():
        memory, _, h0, c0 = m.encode(src)
        H, h, c, feed = memory[0], h0[0][0], c0[0][0], torch.zeros(16)
        for t in range(4):
            h, c = _lstm_step(m.cells[0], torch.cat([m.tgt_embed.weight[tgt[0, t]], feed]), h, c)
            ctx = torch.softmax(H @ h, 0) @ H  # from the new h_t
            feed = torch.tanh(m.combine.weight @ torch.cat([ctx, h]))
            assert torch.allclose(got[t], m.tgt_embed.weight @ feed, atol=1e-5), t


@pytest.mark.parametrize("att", ["general", "bahdanau"])
def test_grouped_cache_and_reorder_follow_the_rows(att):
    check_grouped_cache(rnn("lstm", att))


@pytest.mark.parametrize("att", ["additive", "bahdanau"])
def test_tiny_model_overfits_a_few_pairs(att):
    check_overfits(rnn(att=att, vocab_size=20, d_model=32, N=1), 150)


def test_config_names_the_architecture():
    assert preset("multi30k").model.arch == "transformer"  # the Transformer stays the default
    cfg = preset("multi30k-rnn")
    assert cfg.model.arch == "rnn" and cfg.model.N == 2 and cfg.model.p_drop == 0.3
    cfg.model.rnn_attention = "location"
    with pytest.raises(ConfigError, match="model.rnn_attention must be one of additive, dot, general"):
        cfg.validate()
    cfg.model.rnn_attention, cfg.model.rnn_variant = "dot", "bahdanau"
    with pytest.raises(ConfigError, match="bahdanau scores with the additive attention"):
        cfg.validate()


@pytest.fixture(scope="module")
def trained_rnn(toy_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("rnn") / "run"
    cfg = tiny_config(max_steps=400, lr_scale=0.5)
    cfg.model.arch, cfg.model.rnn_attention, cfg.model.d_model, cfg.model.N = "rnn", "dot", 48, 1
    cfg.model.p_drop = 0.0
    train(cfg, toy_prepared, run)
    return run, list_checkpoints(run)[-1]


@pytest.mark.slow
def test_recurrent_model_trains_and_translates_with_the_toolkit(trained_rnn, toy_prepared, tmp_path, capsys):
    model, cfg, _, _ = load_checkpoint(trained_rnn[1])
    assert isinstance(model, RecurrentModel) and cfg.model.rnn_attention == "dot"
    check_baseline_toolkit(trained_rnn[1], toy_prepared, tmp_path, capsys, ("cross-layer1", "cross-mean"))


def test_recurrent_model_serves_translations_and_its_attention(trained_rnn):
    check_serves(trained_rnn[1])
