"""The fused decoder step (fusedstep.py) against the model's own modules: the same logits, bit for
bit, step after step through beam reorders, dropped sentences and cache growth, in fp32 and bf16;
the same hypotheses from search; batch equals one by one."""

import pytest
import torch
from conftest import requires_int8, requires_vnni

from aiayn.decode.fast import FusedDecoder, StepOptions, fusable
from aiayn.decode.search import beam_search, greedy_search
from aiayn.device import int8_kernel
from aiayn.models.precision import cast_bf16
from aiayn.overrides import preset
from aiayn.parsing.model import build_any


def toy(**over):
    cfg = preset("multi30k").model
    cfg.vocab_size, cfg.d_model, cfg.d_ff, cfg.N = 97, 64, 128, 2
    for k, v in over.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    model = build_any(cfg).eval()
    with torch.no_grad():  # peaky output distributions, so search has real choices to make
        model.out_proj.weight.mul_(8.0)
    return model


def sources(B: int = 3, S: int = 9) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 97, (B, S), generator=g)
    for b, n in enumerate([S, 5, 7][:B]):
        src[b, n - 1], src[b, n:] = 2, 0  # EOS, then padding
    return src


def steps_agree(model, fused, bf16: bool, group: int = 4, steps: int = 9, close: float = 0.0,
                of_row: bool = False) -> None:
    """close: 0, bit for bit; else the largest difference allowed (SDPA's kernel reads other strides),
    or with `of_row` the largest as a fraction of the row's largest logit (bf16 rounding's scale)."""
    src = sources()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        ref = model.start_decoding(src, group)
    got = fused.start_decoding(src, group)
    n = src.size(0)
    for t in range(steps):
        tokens = torch.randint(4, 97, (n * group,), generator=g)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            a = model.decode_step(tokens, ref)
        b = fused.decode_step(tokens, got)
        a, b = a.float(), b.float()
        near = ((a - b).abs() <= close * b.abs().amax(-1, keepdim=True)).all() if of_row else torch.allclose(
            a, b, atol=close, rtol=close)
        assert torch.equal(a, b) if not close else near, (t, float((a - b).abs().max()))
        # beams reorder within their sentence; at step 4 the middle sentence leaves the batch
        perm = torch.stack([torch.randperm(group, generator=g) for _ in range(n)]) + torch.arange(n)[:, None] * group
        sources_kept = torch.tensor([0, 2][:n - 1]) if t == 4 else None
        rows = perm[sources_kept].reshape(-1) if sources_kept is not None else perm.reshape(-1)
        ref.reorder(rows, sources_kept)
        got.reorder(rows, sources_kept)
        n = n - 1 if t == 4 else n


@pytest.mark.parametrize("over", [{}, {"pre_norm": True}, {"learned_positions": True}, {"d_k": 8, "h": 2}])
def test_fused_step_equals_the_modules_bit_for_bit_fp32(over):
    model = toy(**over)
    steps_agree(model, FusedDecoder(model, capacity=2), bf16=False)  # capacity 2: the cache grows 3 times


def test_fused_step_equals_the_modules_under_autocast_bf16():
    model = cast_bf16(toy())
    steps_agree(model, FusedDecoder(model, torch.bfloat16, capacity=4), bf16=True)


def test_reordering_moves_the_row_table_not_the_cached_keys_and_values():
    """Beams reorder by rewriting which buffer row holds each position (integers); the keys and
    values written at a step stay where they were, and the logits still equal the modules'."""
    model = toy()
    fused = FusedDecoder(model, capacity=16)
    state = fused.start_decoding(sources(), 4)
    fused.decode_step(torch.full((12,), 5), state)
    before = [(x.data_ptr(), x[0].clone()) for x in state.k + state.v]
    state.reorder(torch.tensor([3, 3, 1, 0, 4, 5, 6, 7, 8, 8, 8, 8]))
    fused.decode_step(torch.full((12,), 6), state)
    for x, (ptr, first) in zip(state.k + state.v, before):  # the same storage, position 0 untouched
        assert x.data_ptr() == ptr and torch.equal(x[0], first)
    assert state.idx[:2, :4].tolist() == [[3, 3, 1, 0], [0, 1, 2, 3]]  # position 0 from the parents; 1 written in place
    steps_agree(model, fused, bf16=False)


@pytest.mark.parametrize("beam", [1, 4])
def test_search_through_the_fused_step_finds_the_same_hypotheses_batch_or_one_by_one(beam):
    model = toy()
    fused = FusedDecoder(model)
    src = sources()

    def search(m, s):
        if beam == 1:
            return [[h] for h in greedy_search(m, s, max_len_b=12)]
        return beam_search(m, s, beam, 0.6, max_len_b=12, nbest=2)

    def key(hs):
        return [[(h.tokens, h.score) for h in x] for x in hs]

    ref = key(search(model, src))
    assert key(search(fused, src)) == ref
    one = [key(search(fused, src[b:b + 1, :int((src[b] != 0).sum())]))[0] for b in range(src.size(0))]
    # alone, a sentence's products have other shapes: the same tokens, scores equal to rounding
    assert [[t for t, _ in x] for x in one] == [[t for t, _ in x] for x in ref]
    assert [s for x in one for _, s in x] == pytest.approx([s for x in ref for _, s in x], abs=1e-4)


def test_only_plain_transformers_are_fused():
    model = toy()
    assert fusable(model) and not fusable(toy(pointer_input=True))
    handle = model.decoder[0].ffn.register_forward_hook(lambda m, i, o: o * 0)
    assert not fusable(model)  # a hook must see every call: the modules' path
    handle.remove()
    with pytest.raises(ValueError, match="pointer"):
        FusedDecoder(toy(pointer_input=True))


@requires_int8
def test_fused_step_equals_the_int8_modules_bit_for_bit():
    """int8: the fused Q|K|V product quantized as one (per-channel weight scales, per-row
    activation scales) gives what the three Int8Linear products of translate.quantize_int8 give."""
    from aiayn.models.precision import quantize_int8

    model = toy()
    int8 = quantize_int8(model)
    steps_agree(int8, FusedDecoder(model, int8=True, encoder=int8, capacity=4), bf16=False)


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
@pytest.mark.parametrize("int8", [False, pytest.param(True, marks=[requires_int8, pytest.mark.long]),
                                  pytest.param("fbgemm", marks=[requires_int8, pytest.mark.long, pytest.mark.skipif(
                                      int8_kernel() == "fbgemm", reason="this CPU's own int8 kernel is fbgemm's: the "
                                      "int8 case compiled it already (48 s of CI on an AVX2 CPU, run twice)")])])
def test_compiled_step_agrees_with_eager_and_searches_the_same_batch_or_alone(int8, monkeypatch):
    """torch.compile of the fused step (one layer, to keep compiling short): logits equal the
    eager step's to rounding through reorders, a dropped sentence and cache growth; beam search
    finds the eager search's hypotheses, and (int8) a sentence alone (other graphs: batch of one) the
    same as in the batch. int8 goes through Translator: after its compile_now(), nothing the test
    decodes compiles again (warm-up lengths that collided with the beam once did). "fbgemm": the
    AVX2 kernel forced (one opaque operation in the graph)."""
    from aiayn.decode.translator import Translator
    from aiayn.models import linear
    from aiayn.models.precision import quantize_int8

    if int8 == "fbgemm":
        monkeypatch.setattr(linear, "int8_kernel", lambda: "fbgemm")

    model, start = toy(N=1), _graphs()
    kw = {"int8": True, "encoder": quantize_int8(model)} if int8 else {}
    eager = FusedDecoder(model, capacity=4, **kw)
    if int8:
        translator = Translator(model, [None] * 97, precision="int8", compiled=True)  # a 97-entry vocabulary
        translator.compile_now()
        compiled = translator.search_model
    else:
        compiled = FusedDecoder(model, capacity=4, compiled=True)
    src, g = sources(), torch.Generator().manual_seed(2)

    def key(m, s):
        return [[(h.tokens, round(h.score, 3)) for h in x] for x in beam_search(m, s, 4, 0.6, max_len_b=12, nbest=2)]

    before, ref = _graphs(), key(eager, src)
    assert key(compiled, src) == ref
    if int8:  # a batch of one compiles 2 more graphs: checked once, to keep the suite short
        assert [key(compiled, src[i:i + 1, :int((src[i] != 0).sum())])[0] for i in range(3)] == ref
        assert _graphs() == before  # compile_now compiled every graph that search needs
    a, b = eager.start_decoding(src, 4), compiled.start_decoding(src, 4)
    n = src.size(0)
    for t in range(9):
        tokens = torch.randint(4, 97, (n * 4,), generator=g)
        x, y = eager.decode_step(tokens, a), compiled.decode_step(tokens, b)
        assert torch.allclose(x, y, atol=1e-3, rtol=1e-4), (t, float((x - y).abs().max()))
        kept = torch.tensor([0, 2]) if t == 4 else None
        rows = torch.arange(n * 4).flip(0).view(n, 4).flip(0) if kept is None else torch.arange(12).view(3, 4)[kept]
        a.reorder(rows.reshape(-1), kept)
        b.reorder(rows.reshape(-1), kept)
        n = n - 1 if t == 4 else n
    assert _graphs() > start  # it did compile, not fall back to eager


def test_compiled_decoding_is_off_by_default_and_selectable():
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.decode.translator import Translator

    tok = Tokenizer.__new__(Tokenizer)
    model = toy(N=1)
    assert not Translator(model, tok, precision="fp32").search_model.compiled
    on = Translator(model, tok, precision="fp32", compiled=True)
    assert on.search_model.compiled and on.search_model._step is not on.search_model._tensor_step


def test_a_gpu_leaves_the_compiled_steps_first_position_to_eager():
    """A history of length 1 is a size PyTorch specializes: compiled, position 0 made two more step
    graphs (1 and 3 sentences), ~55 s each on an H200 (bench/gpu/README.md), so on a GPU it
    runs eagerly, every later position through the compiled step, for logits and decode_hidden alike.
    A CPU keeps it compiled (seconds to compile; int8 single sentences ran ~1 ms slower eagerly).
    A meta device stands in for the GPU in the rule; the routing runs on the CPU with the rule set."""
    assert not FusedDecoder(toy(N=1), capacity=4, compiled=True).eager_first
    assert FusedDecoder(toy(N=1).to("meta"), capacity=4, compiled=True).eager_first
    assert not FusedDecoder(toy(N=1).to("meta"), capacity=4).eager_first  # eager anyway
    assert FusedDecoder(toy(N=1).to("meta"), capacity=4, compiled=True).unbacked
    assert not FusedDecoder(toy(N=1), capacity=4, compiled=True).unbacked
    for gpu, first in ((True, "_tensor_step"), (False, "_step")):
        assert _routed(gpu) == [(first, 0), ("_step", 1), ("_step", 2), ("_hidden", 3),
                                (first.replace("step", "hidden"), 0)], gpu



@pytest.mark.parametrize("gpu", [False, True])
def test_on_a_gpu_one_sentence_and_a_batch_share_the_compiled_graphs(gpu, monkeypatch):
    """Compiled on a GPU, rows and sources are unbacked symbols (`FusedDecoder.unbacked`), so PyTorch
    does not specialize them at 1: with the first position eager there, start and step make 2 graphs
    for one sentence and a batch, where specialized they made 4 (a CPU, whose first position is
    compiled too: 6). Dynamo's graphs are counted by a backend that runs them as captured (no
    compiling); the search finds the eager one's hypotheses, alone and in a batch. The rules are set on
    the CPU as a GPU has them (test_a_gpu_leaves_the_compiled_steps_first_position_to_eager)."""
    graphs: list[str] = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": record}))
    torch._dynamo.reset()
    model = toy(N=1)
    eager = FusedDecoder(model, capacity=4)
    compiled = FusedDecoder(model, capacity=4, options=StepOptions(compiled=True, eager_first=gpu, unbacked=gpu))
    src = sources()

    def key(m, s):
        return [[(h.tokens, round(h.score, 3)) for h in x] for x in beam_search(m, s, 4, 0.6, max_len_b=12)]

    for s in (src[1:2, :5], src):  # one sentence, then three
        assert key(compiled, s) == key(eager, s)
    assert len(graphs) == (2 if gpu else 6), len(graphs)

def _routed(eager_first: bool) -> list[tuple[str, int]]:
    """Which of the step's callables decode_step and decode_hidden hand to _advance, at which position:
    three steps and a decode_hidden, then decode_hidden at position 0 of a fresh state."""
    fused = FusedDecoder(toy(N=1), capacity=4, options=StepOptions(compiled=True, eager_first=eager_first))
    fused._step = lambda *a, **k: fused._tensor_step(*a, **k)  # stand-ins for the compiled: no compiling
    fused._hidden = lambda *a, **k: fused._tensor_hidden(*a, **k)
    fused._start = fused._tensor_start
    names = {"_step": fused._step, "_hidden": fused._hidden, "_tensor_step": fused._tensor_step,
             "_tensor_hidden": fused._tensor_hidden}
    seen, advance = [], fused._advance

    def recording(step, tokens, state):
        seen.append((next(n for n, f in names.items() if f == step), state.n))
        return advance(step, tokens, state)
    fused._advance = recording
    state, tokens = fused.start_decoding(sources(), 4), torch.full((12,), 5)
    for _ in range(3):
        fused.decode_step(tokens, state)
    fused.decode_hidden(tokens, state)
    fused.decode_hidden(tokens, fused.start_decoding(sources(), 4))
    return seen



def test_a_gpus_eager_step_attends_through_sdpa_as_the_model_does_there():
    """Off the CPU the eager step's attention is SDPA, as the model's own there (models/attention.py):
    one kernel where the written-out products took 8 a self-attention and 7 a cross (a GPU step is
    launch-bound; bench/decode/decode_launches.py counts them). A meta device stands in for the GPU in the
    rule; on the CPU, with the rule set, the step equals the model's modules switched to SDPA, through
    reorders, dropped sentences and cache growth, and search finds what the explicit step finds."""
    assert FusedDecoder(toy(N=1).to("meta"), capacity=4).sdpa
    assert not FusedDecoder(toy(N=1), capacity=4).sdpa
    assert not FusedDecoder(toy(N=1).to("meta"), capacity=4, compiled=True).sdpa  # inductor fuses its own
    for bf16 in (False, True):
        model = cast_bf16(toy(attention="sdpa")) if bf16 else toy(attention="sdpa")
        fused = FusedDecoder(model, torch.bfloat16 if bf16 else torch.float32, capacity=2)
        assert fused.sdpa  # model.attention sdpa: the fused step's too
        close = 1e-2 if bf16 else 1e-5
        steps_agree(model, fused, bf16, close=close)
        explicit = FusedDecoder(model, torch.bfloat16 if bf16 else torch.float32, capacity=2,
                                options=StepOptions(sdpa=False))
        for a, b in zip(beam_search(fused, sources()), beam_search(explicit, sources())):
            assert a[0].tokens == b[0].tokens and a[0].score == pytest.approx(b[0].score, abs=close * 10), bf16


def test_alignments_under_sdpa_read_the_same_attention():
    """Asked for alignments, the probed layer's cross-attention stays written out (it needs the
    weights) over SDPA's additive mask: the same source positions as the boolean mask's route."""
    model = toy()
    got = []
    for sdpa in (False, True):
        fused = FusedDecoder(model, capacity=4, options=StepOptions(sdpa=sdpa))
        fused.align_head = (1, None)
        state = fused.start_decoding(sources(), 4)
        assert state.pad.dtype == (torch.float32 if sdpa else torch.bool)
        seen = []
        for t in range(4):
            fused.decode_step(torch.full((12,), 5 + t), state)
            seen.append(state.attended)
        got.append(torch.stack(seen))
    assert torch.equal(*got)

@pytest.mark.slow
@requires_vnni
def test_the_compiled_step_has_the_batch_sizes_as_symbols_and_the_weights_sizes_fixed(monkeypatch):
    """Dynamic shapes are for what varies (rows, sources, lengths, positions). A weight whose sizes
    entered the graph as symbols made the generated code generic: single-sentence int8 decoding
    took 50 ms instead of 25 (p50, 1 thread) until the weights were marked static. (torch._int_mm's
    weights are graph inputs; fbgemm's packed weights stay inside one opaque operation.)"""
    from aiayn.models.precision import quantize_int8

    seen: list[tuple[str, tuple]] = []

    def record(gm, example_inputs):  # a backend that notes each graph input's source and shape
        for node in gm.graph.find_nodes(op="placeholder"):
            value, arg = node.meta.get("example_value"), node.meta.get("grapharg")
            if isinstance(value, torch.Tensor) and arg is not None:
                seen.append((arg.source.name, tuple(value.shape)))
        return gm.forward

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": record}))
    model = toy(N=1)
    fused = FusedDecoder(model, capacity=4, compiled=True, int8=True, encoder=quantize_int8(model))  # tensors, modules
    beam_search(fused, sources(), 4, 0.6, max_len_b=3)
    weights = [(name, shape) for name, shape in seen if name.startswith("L['self']")]
    state = [(name, shape) for name, shape in seen if not name.startswith("L['self']")]
    assert len(weights) >= 15 and all(isinstance(n, int) for _, shape in weights for n in shape), weights
    assert any(isinstance(n, torch.SymInt) for _, shape in state for n in shape), state  # rows etc. stay dynamic


def test_the_search_state_lives_on_the_sources_device():
    """Its key/value buffers and index table sit where the model runs: on a GPU, CPU buffers broke
    every decode (found by bench/gpu/gpu.py's first run). A meta device stands in for the GPU here."""
    from types import SimpleNamespace

    from aiayn.decode.fast import FusedState

    pad = torch.zeros(2, 1, 1, 5, dtype=torch.bool, device="meta")
    state = FusedState([], pad, 1, 2, [SimpleNamespace(heads=(2, 4, 4, 2, 4, 4))] * 3, torch.bfloat16, capacity=8)
    assert {t.device.type for t in (*state.k, *state.v, state.idx)} == {"meta"}
    state.grow()
    assert {t.device.type for t in (*state.k, *state.v, state.idx)} == {"meta"}
