"""§3 model invariants: positions, causality, padding, incremental decoding, tying, counts."""

import math

import pytest
import torch
from conftest import overfit

from aiayn.cli import main
from aiayn.cli.training import count_parameters
from aiayn.config import ModelConfig
from aiayn.models.transformer import Transformer, sinusoidal_positions
from aiayn.overrides import preset


def tiny(**kw) -> Transformer:
    cfg = ModelConfig(vocab_size=13, d_model=16, d_ff=32, h=4, N=2, p_drop=0.0, max_positions=64)
    for k, v in kw.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 3), (50, 10), (999, 255), (123, 100)])
def test_positional_encoding_formula(pos, i):
    d = 512
    pe = sinusoidal_positions(1000, d)
    angle = pos / 10000 ** (2 * i / d)
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_decoder_is_causal(pre_norm):
    m = tiny(pre_norm=pre_norm)
    src = torch.randint(4, 13, (2, 6))
    tgt = torch.randint(4, 13, (2, 7))
    out = m(src, tgt)
    for t in range(7):
        changed = tgt.clone()
        changed[:, t] = (changed[:, t] - 4 + 1) % 9 + 4
        out2 = m(src, changed)
        torch.testing.assert_close(out2[:, :t], out[:, :t], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out2[:, t:], out[:, t:], atol=1e-4)


def test_padding_does_not_change_outputs():
    m = tiny()
    src = torch.randint(4, 13, (1, 5))
    tgt = torch.randint(4, 13, (1, 4))
    alone = m(src, tgt)
    # Batch it with a longer pair so both sides get right-padding.
    src_b = torch.full((2, 9), 0)
    tgt_b = torch.full((2, 8), 0)
    src_b[0, :5], tgt_b[0, :4] = src[0], tgt[0]
    src_b[1], tgt_b[1] = torch.randint(4, 13, (9,)), torch.randint(4, 13, (8,))
    batched = m(src_b, tgt_b)
    torch.testing.assert_close(batched[0, :4], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_incremental_decoding_equals_full_forward(pre_norm):
    m = tiny(pre_norm=pre_norm)
    src = torch.randint(4, 13, (3, 6))
    src[1, 4:] = 0  # padding in one source
    tgt = torch.randint(4, 13, (3, 8))
    full = m(src, tgt)
    cache = m.start_decoding(src)
    steps = torch.stack([m.decode_step(tgt[:, t], cache) for t in range(8)], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_cache_survives_growth_and_reorders_every_step():
    """The self-attention cache's buffers start at 64 positions and grow; beams reordered at every
    step (rows repeated and dropped, as beam search does) must still see exactly their own
    history: the last step's logits equal a full forward over each row's token sequence."""
    m = tiny(max_positions=100)
    g, T = 3, 80
    src = torch.randint(4, 13, (2, 6))
    gen = torch.Generator().manual_seed(1)
    cache = m.start_decoding(src, group=g)
    hist = torch.empty(2 * g, 0, dtype=torch.long)
    with torch.no_grad():
        for t in range(T):
            tok = torch.randint(4, 13, (2 * g,), generator=gen)
            hist = torch.cat([hist, tok[:, None]], 1)
            last = m.decode_step(tok, cache)
            if t < T - 1:  # rows move within their sentence: row r takes a row of the same group
                rows = torch.randint(0, g, (2 * g,), generator=gen) + torch.arange(2 * g) // g * g
                cache.reorder(rows)
                hist = hist[rows]
        full = m(src.repeat_interleave(g, 0), hist)
    torch.testing.assert_close(last, full[:, -1], atol=1e-5, rtol=1e-5)


def test_cache_reorder_selects_rows():
    m = tiny()
    src = torch.randint(4, 13, (3, 5))
    tgt = torch.randint(4, 13, (3, 6))
    cache = m.start_decoding(src)
    for t in range(3):
        m.decode_step(tgt[:, t], cache)
    index = torch.tensor([2, 0, 0, 1])
    cache.reorder(index, sources=index)
    rest = torch.stack([m.decode_step(tgt[index, t], cache) for t in range(3, 6)], 1)
    full = m(src[index], tgt[index])
    torch.testing.assert_close(rest, full[:, 3:], atol=1e-5, rtol=1e-5)


def test_grouped_cache_equals_repeated_sources():
    """Beams share one copy of their source's encoder keys/values: decoding B·g rows against B
    sources must equal decoding against each source repeated g times, also after rows are
    reordered within groups and a source leaves."""
    m = tiny()
    g = 3
    src = torch.randint(4, 13, (2, 5))
    src[1, 3:] = 0
    tgt = torch.randint(4, 13, (2 * g, 6))
    grouped, repeated = m.start_decoding(src, group=g), m.start_decoding(src.repeat_interleave(g, 0))
    for t in range(3):
        torch.testing.assert_close(m.decode_step(tgt[:, t], grouped), m.decode_step(tgt[:, t], repeated),
                                   atol=1e-5, rtol=1e-5)
    rows = torch.tensor([2, 2, 0, 4, 3, 3])  # beams move within their sentence
    grouped.reorder(rows)
    repeated.reorder(rows)
    torch.testing.assert_close(m.decode_step(tgt[:, 3], grouped), m.decode_step(tgt[:, 3], repeated),
                               atol=1e-5, rtol=1e-5)
    rows = torch.tensor([5, 3, 4])  # sentence 0 finished: only sentence 1 is left
    grouped.reorder(rows, sources=torch.tensor([1]))
    repeated.reorder(rows, sources=rows)
    torch.testing.assert_close(m.decode_step(tgt[3:, 4], grouped), m.decode_step(tgt[3:, 4], repeated),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="decoder rows"):
        grouped.reorder(torch.tensor([0, 1]))


def closed_form_params(V, d, d_ff, h, d_k, d_v, N):
    """Parameter count from the paper's dimensions: shared V×d embedding (§3.4), per layer
    attention projections with biases, FFN (Eq. 2), and LayerNorm gains/biases."""
    attn = 2 * (d * h * d_k + h * d_k) + (d * h * d_v + h * d_v) + (h * d_v * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    enc_layer = attn + ffn + 2 * 2 * d
    dec_layer = 2 * attn + ffn + 3 * 2 * d
    return V * d + N * enc_layer + N * dec_layer


def test_parameter_counts_match_closed_form():
    assert count_parameters("base", 37000) == closed_form_params(37000, 512, 2048, 8, 64, 64, 6)
    assert count_parameters("big", 37000) == closed_form_params(37000, 1024, 4096, 16, 64, 64, 6)
    assert count_parameters("table3-B-dk16", 37000) == closed_form_params(37000, 512, 2048, 8, 16, 64, 6)


def test_params_command_reports_paper_counts(capsys):
    assert main(["params", "--preset", "base", "--vocab-size", "37000"]) == 0
    base = int(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(base / 65e6 - 1) < 0.04
    assert main(["params", "--preset", "big"]) == 0
    big = int(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(big / 213e6 - 1) < 0.01
    assert main(["params"]) == 0
    table = capsys.readouterr().out
    assert "table3-C-N2" in table and "table3-E" in table


def test_weight_tying_is_one_tensor_with_three_gradient_paths():
    m = tiny()
    assert m.src_embed.weight is m.tgt_embed.weight is m.out_proj.weight
    src, tgt = torch.tensor([[5, 6]]), torch.tensor([[7]])
    # Each use alone contributes gradient to the shared tensor on its own rows.
    logits = m(src, tgt)
    logits[0, 0, 9].backward()
    g = m.src_embed.weight.grad
    assert g[5].abs().sum() > 0 and g[6].abs().sum() > 0  # source embedding
    assert g[7].abs().sum() > 0  # target embedding
    assert g[9].abs().sum() > 0  # pre-softmax projection
    assert g[11].abs().sum() == 0  # unused row
    untied = tiny(share_embeddings=False)
    assert untied.src_embed.weight is not untied.tgt_embed.weight
    assert untied.out_proj.weight is not untied.src_embed.weight


def test_embeddings_are_scaled_by_sqrt_d_model():
    m = tiny()
    tokens = torch.tensor([[5, 6, 7]])
    x = m._embed(tokens, m.src_embed, "src")
    expected = m.src_embed.weight[tokens] * 4.0 + m.pe[:3]
    torch.testing.assert_close(x, expected)


def test_learned_positions_option():
    m = tiny(learned_positions=True)
    assert m.src_pos.requires_grad and not hasattr(m, "pe")
    assert preset("table3-E").model.learned_positions and not preset("base").model.learned_positions


def test_tiny_model_overfits_a_few_pairs():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=20, d_model=32, d_ff=64, h=4, N=1, p_drop=0.0, max_positions=32)
    m = Transformer(cfg)
    loss, src, tgt = overfit(m, 20, 150, 3e-3)
    assert loss < 0.05
    assert torch.equal(m.eval()(src, tgt[:, :-1]).argmax(-1), tgt[:, 1:])


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_logits_and_loss_stay_fp32_under_bf16_autocast(arch):
    """§3.4's projection under autocast: fp32 logits equal to an fp32 product of the (bf16-computed)
    decoder output with the embedding matrix, not bf16 values cast up."""
    from aiayn.models.build import build_model
    from aiayn.training.loss import label_smoothed_loss

    cfg = ModelConfig(arch=arch, vocab_size=50, d_model=32, d_ff=64, h=4, N=2, p_drop=0.0, max_positions=64)
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():  # logits far from zero, where bf16 is coarse
        model.out_proj.weight.mul_(40)
    captured = {}
    model.out_proj.register_forward_hook(lambda m, inp, out: captured.update(h=inp[0]))
    src, tgt = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
        loss, _, _ = label_smoothed_loss(logits, tgt, 0.1, 0)
    assert logits.dtype == torch.float32 and loss.dtype == torch.float32
    reference = captured["h"].float() @ model.out_proj.weight.detach().float().T
    torch.testing.assert_close(logits, reference.view_as(logits), atol=1e-4, rtol=1e-5)
    assert (logits != logits.bfloat16().float()).float().mean() > 0.9  # not bf16 values
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tgt.reshape(-1), label_smoothing=0.1,
                                                 reduction="sum")
    torch.testing.assert_close(loss, expected, atol=1e-3, rtol=1e-5)
    loss.backward()
    assert model.src_embed.weight.grad is not None and model.src_embed.weight.grad.dtype == torch.float32


def test_fp32_logits_can_be_turned_off_for_speed():
    """model.fp32_logits false (the `multi30k` preset's CPU choice): bf16 logits, as any projection."""
    cfg = ModelConfig(vocab_size=50, d_model=32, d_ff=64, h=4, N=1, p_drop=0.0, max_positions=64, fp32_logits=False)
    model = Transformer(cfg)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 4))).dtype == torch.bfloat16
    assert preset("multi30k").model.fp32_logits is False and preset("base").model.fp32_logits is True


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_cpu_dropout_is_bernoulli_with_its_own_scale(p):
    """§5.4: each element dropped with probability p (to 1/65536), independently, the rest scaled so
    that E[output] = input; the mask is the global generator's (a seed replays it)."""
    from aiayn.models.transformer import Dropout

    d = Dropout(p).train()
    torch.manual_seed(3)
    x = torch.full((301, 997), 2.0)  # an element count not divisible by 4
    y = d(x)
    dropped = y == 0
    n = dropped.numel()
    p_eff = round(p * 65536) / 65536
    assert abs(p_eff - p) <= 1 / 131072
    # the drop rate within 5 binomial standard deviations of p
    assert abs(dropped.float().mean().item() - p_eff) < 5 * math.sqrt(p_eff * (1 - p_eff) / n)
    assert torch.allclose(y[~dropped], torch.tensor(2.0 / (1 - p_eff)))
    # neighbours (lanes of one 64-bit draw) are independent: P(both dropped) = p²
    flat = dropped.flatten()[: n - n % 4].view(-1, 4).float()
    for a, b in [(0, 1), (1, 2), (2, 3), (0, 3)]:
        both = (flat[:, a] * flat[:, b]).mean().item()
        assert abs(both - p_eff**2) < 5 * math.sqrt(p_eff**2 * (1 - p_eff**2) / flat.size(0))
    torch.manual_seed(3)
    assert torch.equal(d(x), y)
    assert torch.equal(d.eval()(x), x)


def test_a_shapes_only_build_has_every_parameter_shape_allocates_nothing_and_stays_fast():
    """models/build.shapes_only (a checkpoint's shapes checked before its model is allocated): the same
    names and shapes as a real build for every architecture and the parser, on the meta device, and the
    real build after it draws the same weights from the same seed (it consumed no random numbers). In a
    fresh process it must not import torch._dynamo (meta tensors' initializers do: ~1 s a command)."""
    import subprocess
    import sys

    from aiayn.models.build import shapes_only
    from aiayn.parsing.model import build_any

    for name in ("multi30k", "multi30k-rnn", "multi30k-conv", "parse"):
        cfg = preset(name).model
        cfg.vocab_size = 300
        torch.manual_seed(5)
        with shapes_only():
            skeleton = build_any(cfg)
        real = build_any(cfg)
        torch.manual_seed(5)
        again = build_any(cfg)
        assert all(p.is_meta for p in skeleton.parameters()), name
        assert {k: p.shape for k, p in skeleton.named_parameters()} == {k: p.shape for k, p in real.named_parameters()}
        assert all(torch.equal(a, b) for a, b in zip(real.parameters(), again.parameters())), name
    code = ("import sys, time\nfrom aiayn.overrides import preset\n"
            "from aiayn.models.build import build_model, shapes_only\n"
            "t = time.perf_counter()\nwith shapes_only(): build_model(preset('base').model)\n"
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo imported'\nprint(time.perf_counter() - t)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert float(res.stdout) < 0.5
