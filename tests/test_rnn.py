"""The recurrent attention baseline: attention against its formulas, cached decoding against the
teacher-forced forward, batch against one by one, overfitting, and the toolkit around it."""

import math

import pytest
import sacrebleu
import torch
from conftest import overfit, tiny_config

from aiayn.baselines.rnn import AdditiveAttention, MultiplicativeAttention, RecurrentModel, attend
from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.cli import main
from aiayn.config import ConfigError, ModelConfig, preset
from aiayn.models import build_model
from aiayn.search import beam_search
from aiayn.train import train
from aiayn.translate import Translator

KINDS = [(cell, att) for cell in ("lstm", "gru") for att in ("additive", "dot", "general")]


def rnn(cell="lstm", att="additive", **kw) -> RecurrentModel:
    torch.manual_seed(0)
    cfg = ModelConfig(arch="rnn", vocab_size=23, d_model=16, N=2, p_drop=0.0, rnn_cell=cell, rnn_attention=att)
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
def test_cached_steps_equal_teacher_forced_forward(cell, att):
    m = rnn(cell, att)
    src = torch.randint(4, 23, (3, 7))
    src[1, 4:] = 0  # padding
    tgt = torch.randint(4, 23, (3, 6))
    full = m(src, tgt)
    cache = m.start_decoding(src)
    steps = torch.stack([m.decode_step(tgt[:, t], cache) for t in range(6)], 1)
    assert torch.allclose(full, steps, atol=1e-6)


def test_padding_does_not_change_the_encoding():
    m = rnn()
    src = torch.randint(4, 23, (1, 5))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    tgt = torch.randint(4, 23, (1, 4))
    assert torch.allclose(m(src, tgt), m(padded, tgt), atol=1e-6)


def test_grouped_cache_and_reorder_follow_the_rows():
    m = rnn("lstm", "general")
    src = torch.randint(4, 23, (2, 6))
    tok = torch.randint(4, 23, (6,))
    grouped = m.start_decoding(src, group=3)
    single = m.start_decoding(src.repeat_interleave(3, 0))
    assert torch.allclose(m.decode_step(tok, grouped), m.decode_step(tok, single), atol=1e-6)
    rows = torch.tensor([2, 2, 0, 4, 3, 5])  # beams move within their sentence
    grouped.reorder(rows)
    single.reorder(rows, rows)
    tok2 = torch.randint(4, 23, (6,))
    assert torch.allclose(m.decode_step(tok2, grouped), m.decode_step(tok2, single), atol=1e-6)
    grouped.reorder(torch.tensor([3, 4, 5]), torch.tensor([1]))  # sentence 0 finished
    single.reorder(torch.tensor([3, 4, 5]), torch.tensor([3, 4, 5]))
    assert torch.allclose(m.decode_step(tok2[3:], grouped), m.decode_step(tok2[3:], single), atol=1e-6)


def test_tiny_model_overfits_a_few_pairs():
    m = rnn(vocab_size=20, d_model=32, N=1).train()
    loss, src, tgt = overfit(m, 20, 150, 1e-2)
    assert loss < 0.05
    assert torch.equal(m.eval()(src, tgt[:, :-1]).argmax(-1), tgt[:, 1:])
    hyps = beam_search(m, src, beam=4, max_len_b=8)  # the one beam search serves this model too
    assert [h[0].tokens for h in hyps] == tgt[:, 1:-1].tolist()


def test_config_names_the_architecture():
    assert preset("multi30k").model.arch == "transformer"  # the Transformer stays the default
    cfg = preset("multi30k-rnn")
    assert cfg.model.arch == "rnn" and cfg.model.N == 2 and cfg.model.p_drop == 0.3
    cfg.model.rnn_attention = "location"
    with pytest.raises(ConfigError, match="model.rnn_attention must be one of additive, dot, general"):
        cfg.validate()


@pytest.fixture(scope="module")
def trained_rnn(toy_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("rnn") / "run"
    cfg = tiny_config(max_steps=400, lr_scale=0.5)
    cfg.model.arch, cfg.model.rnn_attention, cfg.model.d_model, cfg.model.N = "rnn", "dot", 48, 1
    cfg.model.p_drop = 0.0
    train(cfg, toy_prepared, run)
    return run, list_checkpoints(run)[-1]


def test_recurrent_model_trains_and_translates_with_the_toolkit(trained_rnn, toy_prepared, tmp_path, capsys):
    run, ckpt = trained_rnn
    model, cfg, _, _ = load_checkpoint(ckpt)
    assert isinstance(model, RecurrentModel) and cfg.model.rnn_attention == "dot"
    src = (toy_prepared / "valid.en.txt").read_text().splitlines()
    ref = (toy_prepared / "valid.de.txt").read_text().splitlines()
    out = tmp_path / "hyp.txt"
    # fp32: the recurrent model's bf16 batches are not yet equal to one by one (rounding in the
    # padded, packed encoder); the Transformer's are (tests/test_inference.py)
    assert main(["translate", "--checkpoint", str(ckpt), "--input", str(toy_prepared / "valid.en.txt"),
                 "--output", str(out), "--ref", str(toy_prepared / "valid.de.txt"), "--precision", "fp32"]) == 0
    hyps = out.read_text().splitlines()
    assert sacrebleu.corpus_bleu(hyps, [ref]).score > 10  # an untrained model scores about 0
    t = Translator.load(ckpt, precision="fp32")
    assert t.translate(src) == hyps
    assert t.translate(src) == [t.translate([s])[0] for s in src]  # batch == one by one
    assert main(["plot", "attention", "--checkpoint", str(ckpt), "--src", src[0], "-o", str(tmp_path / "att")]) == 0
    assert (tmp_path / "att" / "cross-layer1.png").exists() and (tmp_path / "att" / "cross-mean.png").exists()
    assert main(["export", "hf", "--checkpoint", str(ckpt), "-o", str(tmp_path / "hf")]) == 2
    assert "only the Transformer can be exported" in capsys.readouterr().err


def test_recurrent_model_serves_translations_and_its_attention(trained_rnn):
    from fastapi.testclient import TestClient

    from aiayn.apps.serve import create_app

    t = Translator.load(trained_rnn[1])
    with TestClient(create_app(t)) as client:
        r = client.post("/translate", json={"sentences": ["the big dog"]})
        assert r.status_code == 200 and r.json()["translations"] == t.translate(["the big dog"])
        r = client.post("/attention", json={"sentence": "the big dog"})
        assert r.status_code == 200
        body = r.json()  # the cross-attention: a row per output token, a column per source token
        w = body["weights"]
        assert len(w) == len(body["target_tokens"]) and all(len(row) == len(body["source_tokens"]) for row in w)
        assert all(abs(sum(row) - 1) < 1e-4 for row in w)
