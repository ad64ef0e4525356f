"""Bucketed batches for `train.compile`: a few padded lengths, one graph per length,
and the same update as the paper's unpadded batches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from aiayn.data.batches import TokenData, bucket_length, collate, make_batches
from aiayn.models.transformer import Transformer
from aiayn.training import step as S
from aiayn.training.optim import make_optimizer
from tests.conftest import tiny_config


def test_the_bucket_ladder_has_four_lengths_an_octave_and_pads_by_at_most_a_quarter():
    ladder = sorted({bucket_length(n) for n in range(1, 257)})
    assert ladder == [8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256]
    for n in range(1, 2049):  # brute force: the smallest ladder length at or above n
        b = bucket_length(n)
        assert b >= n and (n <= 8 or b <= 1.25 * n)
        assert b == min(x for x in {bucket_length(m) for m in range(n, 2 * n + 9)} if x >= n)


def _setup(data_dir, compiled: bool):
    cfg = tiny_config(compile=compiled, compile_buckets=compiled)
    cfg.model.p_drop, cfg.model.vocab_size = 0.0, 60  # no dropout: the two runs draw no random numbers
    data = TokenData(data_dir, "train")
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    return cfg, data, model, make_optimizer(model, cfg.train)


def test_compiled_training_on_bucketed_batches_is_one_graph_per_length_and_the_eager_update(
        toy_prepared, monkeypatch):
    """Eight updates on batches of varied lengths: the compiled model (a counting backend standing in
    for TorchInductor) builds one graph per padded length whatever the batch size, and its weights
    equal eager training on the unpadded batches within rounding."""
    graphs: list[tuple] = []

    def counting(gm, example_inputs):
        graphs.append(tuple(tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor) and x.dim() == 2))
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend=counting, **kw))
    torch._dynamo.reset()
    cfg_e, data, eager, opt_e = _setup(toy_prepared, False)
    cfg_c, _, model, opt_c = _setup(toy_prepared, True)
    compiled = S.compile_model(model)
    batches = make_batches(data.src_lens, data.tgt_lens, 160, 1, 0)[:8]
    lengths = {bucket_length(max(data.src_lens[b].max(), data.tgt_lens[b].max())) for b in batches}
    sizes = {len(b) for b in batches}
    assert len(lengths) >= 2 and len(sizes) >= 3  # the test means something: shapes vary
    dev = torch.device("cpu")
    for b in batches:
        n = int(data.tgt_lens[b].sum())
        S.train_step(eager, opt_e, [(collate(data, b), 1.0)], n, cfg_e, 1e-3, 1, dev)
        S.train_step(compiled, opt_c, [(collate(data, b, bucketed=True), 1.0)], n, cfg_c, 1e-3, 1, dev)
    assert len(graphs) == len(lengths)
    assert {g[0][1] for g in graphs} == lengths  # static lengths: each graph one of the ladder's
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        if name.endswith("w_k.bias"):  # its true gradient is 0 (a constant on every key of a row: softmax
            continue  # ignores it), so Adam turns rounding noise into lr-sized steps in any two runs
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6, msg=name)


def test_a_bucketed_batch_pads_both_sides_to_one_ladder_length_and_keeps_every_token(toy_prepared):
    data = TokenData(toy_prepared, "train")
    b = make_batches(data.src_lens, data.tgt_lens, 160, 1, 0)[0]
    plain, padded = collate(data, b), collate(data, b, bucketed=True)
    L = bucket_length(max(plain.src.shape[1], plain.tgt_in.shape[1]))
    assert padded.src.shape == padded.tgt_in.shape == padded.tgt_out.shape == (len(b), L)
    for a, p in ((plain.src, padded.src), (plain.tgt_in, padded.tgt_in), (plain.tgt_out, padded.tgt_out)):
        assert torch.equal(p[:, :a.shape[1]], a) and bool((p[:, a.shape[1]:] == 0).all())
    assert padded.n_tokens == plain.n_tokens
    cfg = tiny_config()
    model = Transformer(dataclasses.replace(cfg.model, vocab_size=60, p_drop=0.0)).eval()
    with torch.no_grad():
        la, lp = model(plain.src, plain.tgt_in), model(padded.src, padded.tgt_in)
    torch.testing.assert_close(lp[:, :la.shape[1]], la, rtol=1e-5, atol=1e-5)
    assert np.isfinite(lp.numpy()).all()


def test_buckets_without_compile_are_refused_in_one_line():
    from aiayn.config import ConfigError

    cfg = tiny_config(compile_buckets=True)
    with pytest.raises(ConfigError, match="train.compile_buckets pads batches for torch.compile: set train.compile"):
        cfg.validate()
    tiny_config(compile=True, compile_buckets=True).validate()
    with pytest.raises(ConfigError, match="train.keep_last must be positive, got 0"):
        tiny_config(keep_last=0).validate()
