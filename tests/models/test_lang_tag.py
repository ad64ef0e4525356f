"""Where a many-direction model reads its target-language tag (model.lang_tag): `decoder` is the
same computation as a source-tagged model given the tag as its decoder's first input and a padded
first source position — the encoder never reads the tag, the decoder starts from it — through the
modules' step, the fused step, the graphed search and teacher forcing alike."""

import pytest
import torch

from aiayn.config import ConfigError, ModelConfig
from aiayn.decode.fast import FusedDecoder, StepOptions
from aiayn.decode.fast.graphed import graphed_beam_search
from aiayn.decode.search import beam_search, greedy_search
from aiayn.models.precision import cast_bf16
from tests.decode.fast.test_fused import sources, steps_agree, toy

TAGS = (90, 91)  # two ids standing for <2de>, <2fr>: the first token of every source


def tagged(B: int = 3, S: int = 9) -> torch.Tensor:
    src = sources(B, S)
    src[:, 0] = torch.tensor([TAGS[b % 2] for b in range(B)])
    return src


def twin(model):
    """The same weights, reading the tag in the source (the default)."""
    other = toy()
    other.load_state_dict(model.state_dict())
    return other.eval()


def test_the_decoder_reads_the_tag_in_place_of_bos_and_the_encoder_never_reads_it():
    model, src = toy(lang_tag="decoder"), tagged()
    tgt_in = torch.randint(4, 90, (3, 6))
    tgt_in[:, 0] = 2  # BOS, as batches build it
    with torch.no_grad():
        got = model(src, tgt_in)
        padded, started = src.clone(), tgt_in.clone()
        padded[:, 0], started[:, 0] = 0, src[:, 0]  # brute force: the twin, told the same in plain inputs
        assert torch.equal(got, twin(model)(padded, started))
        memory = [model.encode(s)[0][:, 1:] for s in (src, torch.where(src == TAGS[0], TAGS[1], src))]
        assert torch.equal(*memory)  # another tag: the same encoding of every source word
        assert not torch.equal(got, model(torch.where(src == TAGS[0], TAGS[1], src), tgt_in))  # the decoder sees it


def test_search_through_the_modules_follows_teacher_forcing_and_is_the_same_batched_or_alone():
    model, src = toy(lang_tag="decoder"), tagged()
    hyps = greedy_search(model, src, max_len_b=8)
    for b, h in enumerate(hyps):
        y_in = torch.tensor([[2] + h.tokens])
        with torch.no_grad():
            forced = model(src[b:b + 1], y_in).argmax(-1)[0].tolist()
        assert forced[:len(h.tokens)] == h.tokens  # each step's choice is the forced pass's argmax
    alone = [greedy_search(model, src[b:b + 1, :int((src[b] != 0).sum())], max_len_b=8)[0].tokens for b in range(3)]
    assert alone == [h.tokens for h in hyps]


@pytest.mark.parametrize("bf16", [False, True])
def test_the_fused_step_equals_the_modules(bf16):
    model = toy(lang_tag="decoder")
    if bf16:
        model = cast_bf16(model)
    steps_agree(model, FusedDecoder(model, torch.bfloat16 if bf16 else torch.float32, capacity=2), bf16)
    src = tagged()
    fused = FusedDecoder(model, torch.bfloat16 if bf16 else torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        ref = beam_search(model, src, 4, 0.6, max_len_b=10, nbest=2)
    got = beam_search(fused, src, 4, 0.6, max_len_b=10, nbest=2)
    assert [[h.tokens for h in x] for x in got] == [[h.tokens for h in x] for x in ref]


def test_the_graphed_search_starts_from_the_tag():
    model = toy(lang_tag="decoder", attention="sdpa")
    src = tagged()
    eager = FusedDecoder(model, options=StepOptions(sdpa=True))
    graphs = FusedDecoder(model, capacity=2, options=StepOptions(sdpa=True, graphs=True))
    a = beam_search(eager, src, 4, 0.6, max_len_b=10, nbest=2)
    b = graphed_beam_search(graphs, src, 4, 0.6, max_len_b=10, nbest=2)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]
    bos = beam_search(FusedDecoder(twin(model), options=StepOptions(sdpa=True)), src, 4, 0.6, max_len_b=10, nbest=2)
    assert [[h.tokens for h in x] for x in a] != [[h.tokens for h in x] for x in bos]  # not a BOS start


def test_only_the_transformer_reads_the_tag_in_the_decoder_and_export_refuses_it():
    with pytest.raises(ConfigError, match="lang_tag is a Transformer option"):
        ModelConfig(arch="rnn", lang_tag="decoder")
    with pytest.raises(ConfigError, match="lang_tag must be one of auto, source, decoder"):
        ModelConfig(lang_tag="target")
    pytest.importorskip("transformers")
    from aiayn.export import ExportError, marian_config
    with pytest.raises(ExportError, match="reads it in the decoder"):
        marian_config(toy(lang_tag="decoder"), 4, 64)
