"""ConvS2S (Gehring et al., 2017) against its equations: GLU and causal convolution written out,
causality, multi-step attention step by step, cached decoding against the teacher-forced
forward, batch against one by one, overfitting, and the toolkit around it."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    check_baseline_toolkit,
    check_cached_steps_and_padding,
    check_grouped_cache,
    check_overfits,
    check_serves,
    tiny_config,
)

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.cli import main
from aiayn.config import ConfigError, ModelConfig
from aiayn.models.build import build_model
from aiayn.models.conv import ConvS2S, glu_conv
from aiayn.overrides import preset
from aiayn.training.session import train


def conv(N=2, k=3, **kw) -> ConvS2S:
    torch.manual_seed(0)
    cfg = ModelConfig(arch="conv", vocab_size=23, d_model=16, N=N, p_drop=0.0, conv_kernel=k, conv_channels=12)
    for key, v in kw.items():
        setattr(cfg, key, v)
    return build_model(cfg).eval()


def test_glu_of_a_convolution_is_the_formula():
    """§3.2: Y = conv(X) to 2c channels, v([A B]) = A ⊗ σ(B)."""
    torch.manual_seed(0)
    layer = torch.nn.Conv1d(3, 4, 3)
    x = torch.randn(1, 3, 6)
    got = glu_conv(layer, x)
    W, b = layer.weight.double(), layer.bias.double()
    for t in range(4):
        y = torch.stack([sum((W[o, :, j] * x[0, :, t + j].double()).sum() for j in range(3)) + b[o] for o in range(4)])
        assert torch.allclose(got[0, :, t].double(), y[:2] * torch.sigmoid(y[2:]), atol=1e-6)


def test_decoder_convolution_is_causal_with_k_minus_1_zeros_on_the_left():
    m = conv(N=1, k=5)
    src, tgt = torch.randint(4, 23, (1, 4)), torch.randint(4, 23, (1, 6))
    base = m(src, tgt)
    for t in range(6):  # changing token t changes no output before t
        other = tgt.clone()
        other[0, t] = 4 + (int(tgt[0, t]) - 3) % 19
        changed = m(src, other)
        assert torch.allclose(base[0, :t], changed[0, :t], atol=1e-6)
        assert not torch.allclose(base[0, t], changed[0, t])


@pytest.mark.parametrize("N,k", [(1, 1), (1, 3), (2, 3), (3, 5)])
def test_cached_steps_equal_teacher_forced_forward_and_padding_changes_nothing(N, k):
    check_cached_steps_and_padding(conv(N=N, k=k, N_dec=N + 1))


def test_multi_step_attention_is_the_papers_equations():
    """One layer each side, written out position by position (§3.1-3.4): e = w + p; encoder
    x' = (glu(conv(x)) + x)·√½, z = W_out x'; decoder h = glu(conv over h_{i-k+1..i}),
    d = (W_d h + b_d + g)·√½, a = softmax(d·z), c = Σ a (z + e) · m·√(1/m), h' = (W c + h)·√½,
    out = (h' + x)·√½, logits = E (W_o out)."""
    m = conv(N=1, k=3)
    src, tgt = torch.randint(4, 23, (1, 5)), torch.randint(4, 23, (1, 4))
    got = m(src, tgt)[0]
    r = math.sqrt(0.5)
    with torch.no_grad():
        E = m.src_embed.weight
        e = E[src[0]] + m.src_pos.weight[:5]
        x = m.enc_in(e)
        padded = F.pad(x.T, (1, 1))
        y = torch.stack([m.enc_convs[0].weight.flatten(1) @ padded[:, j:j + 3].flatten() + m.enc_convs[0].bias
                         for j in range(5)])
        z = m.enc_out((y[:, :12] * torch.sigmoid(y[:, 12:]) + x) * r)
        g = E[tgt[0]] + m.tgt_pos.weight[:4]
        xd = m.dec_in(g)
        left = torch.cat([torch.zeros(2, 12), xd])
        W = m.dec_convs[0].weight  # (2c, c, k): tap j multiplies input position i - (k-1) + j
        for i in range(4):
            yy = sum(W[:, :, j] @ left[i + j] for j in range(3)) + m.dec_convs[0].bias
            h = yy[:12] * torch.sigmoid(yy[12:])
            d = (m.att_in[0](h) + g[i]) * r
            a = torch.softmax(z @ d, 0)
            c = (a @ (z + e)) * 5 * math.sqrt(1 / 5)
            out = ((m.att_out[0](c) + h) * r + xd[i]) * r
            assert torch.allclose(got[i], E @ m.dec_out(out), atol=1e-5), i


@pytest.mark.parametrize("k", [3, 5])
def test_grouped_cache_and_reorder_follow_the_rows(k):
    check_grouped_cache(conv(k=k))


def test_initialization_is_gehring_et_al_section_3_5():
    torch.manual_seed(0)
    m = build_model(ModelConfig(arch="conv", vocab_size=3000, d_model=64, N=2, p_drop=0.2, conv_kernel=3,
                                conv_channels=128))
    assert m.src_embed.weight[1:].std().item() == pytest.approx(0.1, rel=0.05)
    assert m.enc_convs[0].weight.std().item() == pytest.approx(math.sqrt(4 * 0.8 / (3 * 128)), rel=0.05)
    assert m.att_in[0].weight.std().item() == pytest.approx(math.sqrt(1 / 128), rel=0.05)
    assert m.enc_convs[0].bias.abs().max() == 0


def test_tiny_model_overfits_a_few_pairs():
    torch.manual_seed(0)
    check_overfits(build_model(ModelConfig(arch="conv", vocab_size=20, d_model=32, N=2, p_drop=0.0,
                                           conv_channels=32)), 200)


def test_config_names_the_architecture():
    cfg = preset("multi30k-conv")
    assert cfg.model.arch == "conv" and cfg.model.conv_kernel == 3 and cfg.train.clip_norm == 0.1
    cfg.model.conv_kernel = 4
    with pytest.raises(ConfigError, match="model.conv_kernel must be odd"):
        cfg.validate()


@pytest.fixture(scope="module")
def trained_conv(toy_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("conv") / "run"
    cfg = tiny_config(max_steps=300, lr_scale=1.0)
    cfg.model.arch, cfg.model.d_model, cfg.model.N, cfg.model.conv_channels = "conv", 48, 2, 48
    cfg.model.p_drop, cfg.train.peak_lr, cfg.train.clip_norm = 0.0, 3e-3, 0.1
    train(cfg, toy_prepared, run)
    return run, list_checkpoints(run)[-1]


def test_conv_model_trains_and_translates_with_the_toolkit(trained_conv, toy_prepared, tmp_path, capsys):
    model, cfg, _, _ = load_checkpoint(trained_conv[1])
    assert isinstance(model, ConvS2S) and cfg.model.arch == "conv"
    # multi-step attention: one map per decoder layer
    maps = ("cross-layer1", "cross-layer2", "cross-mean")
    check_baseline_toolkit(trained_conv[1], toy_prepared, tmp_path, capsys, maps)


def test_conv_model_serves_translations_and_its_attention(trained_conv):
    check_serves(trained_conv[1])


def test_the_readme_trains_the_conv_preset_from_the_command_line(toy_prepared, tmp_path):
    """`aiayn train --preset multi30k-conv` (README), shrunk to toy size by overrides."""
    run = tmp_path / "run"
    assert main(["train", "--data", str(toy_prepared), "--run", str(run), "--preset", "multi30k-conv",
                 "--train.max_steps", "3", "--train.max_minutes", "0", "--model.d_model", "32",
                 "--model.conv_channels", "32", "--model.N", "1", "--train.threads", "1",
                 "--train.valid_bleu_sentences", "0", "--data.max_tokens", "400"]) == 0
    model, cfg, _, step = load_checkpoint(list_checkpoints(run)[-1])
    assert isinstance(model, ConvS2S) and step == 3 and cfg.train.clip_norm == 0.1
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "--preset multi30k-conv" in readme
