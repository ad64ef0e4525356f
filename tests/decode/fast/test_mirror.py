"""The fused step decodes only the models whose decoder it computes (decode/fast/mirror.py): a
decoder running other code, by its class, its instance or its numbers, goes through its modules."""

import pytest
import torch

from aiayn.decode.fast import FusedDecoder, agrees, fast_decoder, fusable
from aiayn.decode.search import beam_search
from aiayn.decode.translator import Translator
from aiayn.models.transformer import DecoderLayer
from tests.decode.fast.test_fused import toy


class ScaledLayer(DecoderLayer):
    """A decoder layer whose output differs from the base arithmetic (a residual scaled by 2)."""

    def forward(self, x, *args, **kw):
        y, ws, wc = super().forward(x, *args, **kw)
        return 2 * y - x, ws, wc


def src():
    return torch.randint(4, 97, (2, 7), generator=torch.Generator().manual_seed(1))


def test_the_base_model_is_fused_and_its_step_agrees():
    model = toy()
    assert fusable(model) and agrees(model)
    assert isinstance(fast_decoder(model), FusedDecoder)


def test_a_decoder_layer_of_another_class_is_refused_and_decodes_through_its_modules():
    model = toy()
    for i, layer in enumerate(model.decoder):
        scaled = ScaledLayer(model.cfg)
        scaled.load_state_dict(layer.state_dict())
        model.decoder[i] = scaled.eval()
    assert not fusable(model)
    with pytest.raises(ValueError, match="not the one the fused step computes"):
        fast_decoder(model)
    t = Translator(model, [None] * 97, precision="fp32")
    assert not isinstance(t.search_model, FusedDecoder)
    modules = beam_search(model, src(), max_len_b=8)
    fused_anyway = beam_search(FusedDecoder(model), src(), max_len_b=8)  # what fusing it would have decoded
    got = t.translate_ids([[int(x) for x in row] + [2] for row in src()])
    assert [h[0].tokens for h in got] != [] and [h[0].tokens for h in modules] != [h[0].tokens for h in fused_anyway]


def test_a_method_replaced_on_one_instance_is_refused():
    model = toy()
    layer = model.decoder[1]
    real = layer.forward
    layer.forward = lambda *a, **k: real(*a, **k)  # the same numbers, but not the code the step mirrors
    assert not fusable(model)


def test_a_decoder_whose_numbers_differ_with_the_same_code_is_refused_by_its_logits():
    """A changed attribute the step reads from the config, not the module (the FFN's activation),
    passes the code check; one step's logits against the modules' do not agree."""
    model = toy()
    assert fusable(model)
    model.decoder[0].ffn.act = torch.tanh  # ReLU in the config, tanh in the module
    assert not agrees(model) and not fusable(model)
