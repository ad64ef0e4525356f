"""Ensembles (ensemble.py): each step is the mean of the members' log-probabilities, checked against
the members' own full forward passes; an ensemble of one model twice searches exactly as the model;
checkpoints of different vocabularies are refused by name."""

import pytest
import torch

from aiayn.checkpoint import CheckpointError, model_tensors, save_weights
from aiayn.config import Config, ModelConfig
from aiayn.data.tokenizer import PAD, Tokenizer
from aiayn.decode.ensemble import Ensemble, load_models
from aiayn.decode.fast import FusedDecoder
from aiayn.decode.search import beam_search, greedy_search
from aiayn.decode.translator import Translator
from aiayn.models.build import build_model
from aiayn.models.transformer import Transformer


def tiny(seed: int, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelConfig(vocab_size=23, d_model=16, d_ff=32, h=2, N=2, p_drop=0.0, **kw)).eval()


def test_steps_are_the_mean_of_the_members_log_probabilities_from_their_full_forward():
    members = [tiny(0), tiny(1, pre_norm=True), tiny(2, arch="rnn", rnn_variant="luong", rnn_attention="dot")]
    src, tgt = torch.randint(4, 23, (3, 6)), torch.randint(4, 23, (3, 7))
    src[1, 4:] = PAD
    with torch.no_grad():
        want = torch.stack([torch.log_softmax(m(src, tgt), -1) for m in members]).mean(0)
        ens = Ensemble(members)
        state = ens.start_decoding(src)
        got = torch.stack([ens.decode_step(tgt[:, t], state) for t in range(tgt.size(1))], 1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(want, torch.log_softmax(members[0](src, tgt), -1), atol=1e-3)  # every member counts


@pytest.mark.parametrize("beam", [1, 3])
def test_an_ensemble_of_one_model_twice_searches_as_the_model(beam):
    """Beams are reordered at every step: a member whose state were not would score other rows."""
    m = tiny(3)
    src = torch.randint(4, 23, (4, 7))
    src[2, 5:] = PAD
    if beam == 1:
        alone, both = greedy_search(m, src, max_len_b=12), greedy_search(Ensemble([m, m]), src, max_len_b=12)
    else:
        alone = beam_search(m, src, beam=beam, max_len_b=12, nbest=beam)
        both = beam_search(Ensemble([m, m]), src, beam=beam, max_len_b=12, nbest=beam)
    flat = [h for hs in alone for h in (hs if isinstance(hs, list) else [hs])]
    flat2 = [h for hs in both for h in (hs if isinstance(hs, list) else [hs])]
    assert [h.tokens for h in flat] == [h.tokens for h in flat2]
    assert [h.score for h in flat] == pytest.approx([h.score for h in flat2], abs=1e-4)


def test_the_ensemble_encodes_what_every_member_can():
    assert Ensemble([tiny(0, max_positions=64), tiny(1, max_positions=32)]).cfg.max_positions == 32
    with pytest.raises(ValueError, match="at least one model"):
        Ensemble([])


def _checkpoint(path, model: Transformer, sentences: list[str], vocab: int):
    cfg = Config()
    cfg.model = model.cfg
    save_weights(path, model_tensors(model), cfg, Tokenizer.train(sentences, vocab), step=1)


def test_loading_several_checkpoints_needs_one_vocabulary(tmp_path):
    words = [f"w{i} x{i % 7} y{i % 3}" for i in range(200)]
    a, b, c = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.safetensors"
    tok = Tokenizer.train(words, 40)
    for path, seed in ((a, 0), (b, 1)):
        torch.manual_seed(seed)
        m = Transformer(ModelConfig(vocab_size=len(tok), d_model=16, d_ff=32, h=2, N=1, p_drop=0.0))
        _checkpoint(path, m, words, 40)
    torch.manual_seed(2)
    _checkpoint(c, Transformer(ModelConfig(vocab_size=44, d_model=16, d_ff=32, h=2, N=1, p_drop=0.0)),
                [f"v{i} z{i % 5}" for i in range(200)], 44)
    model, _, _ = load_models([a, b])
    assert isinstance(model, Ensemble) and len(model.members) == 2
    assert isinstance(load_models([a])[0], Transformer)
    with pytest.raises(CheckpointError, match="c.safetensors: its vocabulary differs from .*a.safetensors"):
        load_models([a, c])
    lines = ["w1 x1 y1", "w5 x5", "w12 x3 y0 w7"]
    t = Translator.load([a, a], precision="fp32", max_len_b=8)
    assert t.translate(lines) == Translator.load(a, precision="fp32", max_len_b=8).translate(lines)
    # Members decode through the fused step (fusedstep.py) when all can: the same output as through their modules.
    for precision in ("fp32", "bf16"):
        fused = Translator.load([a, b], precision=precision, max_len_b=8)
        assert all(isinstance(m, FusedDecoder) for m in fused.search_model.members)
        plain = Translator(fused.model, fused.tokenizer, fused.decode_cfg, precision=precision, fused=False)
        assert not any(isinstance(m, FusedDecoder) for m in plain.search_model.members)
        assert fused.translate(lines) == plain.translate(lines)
