"""The graphed decoding step (graphed.py) against the eager one: what a CUDA graph would replay,
emulated on the CPU — the same logits through reorders, dropped sentences and cache growth; the
same hypotheses; recorded once a batch and again only when the cache grows; and a step that a graph
can hold at all: no read back to the host, the same kernels on the same shapes at every position."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from aiayn.decode.fast import FusedDecoder, StepOptions
from aiayn.decode.fast.graphed import StepGraph, graphed_beam_search, search_beams, static_logits
from aiayn.decode.search import beam_search, greedy_search
from aiayn.models.precision import cast_bf16
from tests.decode.fast.test_fused import sources, steps_agree, toy


def graphed(model, bf16: bool, capacity: int = 2) -> FusedDecoder:
    """A fused decoder as a GPU's would be with graphs on: SDPA's attention, each step replayed."""
    return FusedDecoder(model, torch.bfloat16 if bf16 else torch.float32, capacity=capacity,
                        options=StepOptions(sdpa=True, graphs=True))


def sdpa_model(bf16: bool):
    return cast_bf16(toy(attention="sdpa")) if bf16 else toy(attention="sdpa")


@pytest.mark.parametrize("bf16", [False, True])
def test_the_graphed_step_computes_the_models_step(bf16):
    """Step by step against the model's modules (SDPA, as on a GPU), the cache growing from 2 rows:
    fp32 to 1e-5; bf16 to 2^-6 of each row's largest logit (a unit or two in bf16's last place: the
    masked later positions change the kernel's blocking, not the weights, as exp(-inf) = 0)."""
    model = sdpa_model(bf16)
    steps_agree(model, graphed(model, bf16), bf16, close=2 ** -6 if bf16 else 1e-5, of_row=bf16)


@pytest.mark.parametrize("bf16", [False, True])
def test_search_through_the_graphed_step_finds_what_the_eager_step_finds(bf16):
    model = sdpa_model(bf16)
    eager = FusedDecoder(model, torch.bfloat16 if bf16 else torch.float32, capacity=2, options=StepOptions(sdpa=True))
    src = sources()
    for beam in (1, 4):
        a, b = (beam_search(m, src, beam=beam, nbest=beam, max_len_b=12) for m in (eager, graphed(model, bf16)))
        assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]
        scores = [h.score for x in b for h in x]
        assert [h.score for x in a for h in x] == pytest.approx(scores, abs=0.1 if bf16 else 1e-4)  # bf16: ~1 ulp
    a, b = (greedy_search(m, src, max_len_b=12) for m in (eager, graphed(model, bf16)))
    assert [h.tokens for h in a] == [h.tokens for h in b]


def test_a_graph_is_recorded_once_a_batch_and_again_only_when_the_cache_grows(monkeypatch):
    """Reorders and dropped sentences write into the recorded tensors (a graph reads those addresses);
    only the cache's growth (new buffers) records again: capacity 4, 9 steps -> at steps 0, 4 and 8."""
    recorded = []
    real = StepGraph._record
    monkeypatch.setattr(StepGraph, "_record", lambda self: recorded.append(self.state.n) or real(self))
    fused = graphed(toy(), False, capacity=4)
    state = fused.start_decoding(sources(), 4)
    tensors = [state.idx, state.pad, *(t for kv in state.cross for t in kv)]
    for t in range(9):
        fused.decode_step(torch.full((12 if t < 4 else 8,), 5 + t), state)
        keep = torch.tensor([0, 2]) if t == 3 else None  # the middle sentence leaves after step 3
        state.reorder(torch.arange(8) if t >= 3 else torch.arange(12).flip(0), keep)
        if t < 3:
            assert all(a is b for a, b in zip(tensors, [state.idx, state.pad, *(t for kv in state.cross for t in kv)]))
    assert recorded == [0, 4, 8]
    assert state.graph.recorded.out.shape == (12, 97)  # every row of the batch as it started


class Seen(TorchDispatchMode):
    """Each ATen operation with its output shapes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = [tuple(o.shape) for o in (out if isinstance(out, (list, tuple)) else [out]) if torch.is_tensor(o)]
        self.ops.append((func.overloadpacket.__name__, shapes))
        return out


def test_the_graphed_step_waits_for_nothing_and_launches_the_same_kernels_at_every_position():
    """What a CUDA graph can replay: no operation that reads a value back to the host (an .item(),
    a nonzero, a data-dependent size), and the same operations on the same shapes whatever the
    position and the tokens (a graph replays what it recorded, sizes included)."""
    fused = graphed(sdpa_model(True), True, capacity=8)
    state = fused.start_decoding(sources(), 4)
    graph = state.graph
    runs = []
    for n in (1, 6):
        graph.tokens.random_(4, 97)
        graph.n.fill_(n)
        with Seen() as seen:
            static_logits(fused, *graph._args())
        runs.append(seen.ops)
    assert runs[0] == runs[1]
    reads_back = {"_local_scalar_dense", "item", "nonzero", "is_nonzero", "equal", "masked_select", "unique",
                  "_unique2", "repeat_interleave", "to"}
    names = {name for name, _ in runs[0]}
    assert not names & reads_back and "_scaled_dot_product_flash_attention_for_cpu" in names


def test_graphs_are_off_unless_asked_and_never_with_alignments_compiling_or_a_shortlist():
    model = toy()
    assert not FusedDecoder(model).graphs and FusedDecoder(model).start_decoding(sources(), 4).graph is None
    fused = graphed(model, False)
    fused.align_head = (1, None)
    assert fused.start_decoding(sources(), 4).graph is None
    fused.align_head = None
    with pytest.raises(ValueError, match="decode_step only"):
        fused.decode_hidden(torch.full((12,), 5), fused.start_decoding(sources(), 4))


@pytest.mark.parametrize("bf16", [False, True])
def test_graphed_beam_search_finds_what_beam_search_finds(bf16):
    """The whole search step as one graph (emulated): every sentence kept while half the batch is open,
    done ones searching on: the hypotheses and scores of search.beam_search, any beam, n-best and α,
    sentences that end early and ones cut at their maximum length; in fp32 through the eager step,
    in bf16 through the graphed step (bf16's rounding otherwise decides near-ties; the scores agree
    to 0.1, as the caches' capacities, so the masked lengths, differ)."""
    model = sdpa_model(bf16)
    eager = FusedDecoder(model, torch.bfloat16 if bf16 else torch.float32, options=StepOptions(sdpa=True))
    eager = graphed(model, bf16) if bf16 else eager
    src = sources()
    ends = set()
    for beam, nbest, alpha, max_b in [(4, 2, 0.6, 12), (2, 1, 0.0, 3), (5, 5, 1.0, 9), (4, 1, 0.6, 50)]:
        want = beam_search(eager, src, beam, alpha, 1.0, max_b, nbest)
        got = graphed_beam_search(graphed(model, bf16), src, beam, alpha, 1.0, max_b, nbest)
        assert [[h.tokens for h in x] for x in want] == [[h.tokens for h in x] for x in got]
        scores = [h.score for x in want for h in x]
        assert [h.score for x in got for h in x] == pytest.approx(scores, abs=0.1 if bf16 else 1e-5)
        ends |= {len(h[0].tokens) for h in want}
    assert len(ends) >= 3


def test_the_graphed_search_step_reads_nothing_back_and_looks_every_few_steps(monkeypatch):
    """The search step a graph records reads nothing back to the host and runs the same operations on
    the same shapes at every step; the host reads which sentences are done once every LOOK_EVERY steps."""
    from aiayn.decode.fast import graphed as g
    runs, looks = [], []
    real_step, real_open = g._search_step, g.open_sentences

    def step(*args):
        with Seen() as seen:
            real_step(*args)
        runs.append(seen.ops)

    monkeypatch.setattr(g, "_search_step", step)
    monkeypatch.setattr(g, "open_sentences", lambda *a: looks.append(1) or real_open(*a))
    g.graphed_beam_search(graphed(sdpa_model(True), True), sources(), 4, 0.6, 1.0, 20, 1, shrink=0.0)
    assert len(runs) == 30 and all(r == runs[0] for r in runs)  # max length 9 + 20, plus the EOS step
    assert len(looks) == 8  # steps 3, 7, ..., 27 and the last
    reads_back = {"_local_scalar_dense", "item", "nonzero", "is_nonzero", "equal", "masked_select", "unique"}
    assert not {name for name, _ in runs[0]} & reads_back


def many_sources(B: int = 8, S: int = 11) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 97, (B, S), generator=g)
    for b in range(B):
        n = 3 + (b * 5) % (S - 2)  # lengths 3..S, in no order
        src[b, n - 1], src[b, n:] = 2, 0
    return src


@pytest.mark.parametrize("shrink", [0.5, 1.0])
def test_a_graphed_search_goes_on_with_its_open_sentences_alone_and_finds_the_same(monkeypatch, shrink):
    """Once at most `shrink` of the batch is open (1.0: at every look), the open sentences' rows go on
    in new tensors, recorded again: each row's cache gathered through the row table, the sources,
    scores and finished hypotheses selected, the done sentences' results kept in their places. The
    hypotheses and scores stay beam_search's (fp32, eager step), over beams, n-best and α; the batch
    was recorded more than once, each time smaller, and once with no shrinking."""
    from aiayn.decode.fast import graphed as g
    sizes = []

    class Counted(g.Recorded):
        def __init__(self, fn, device):
            sizes.append(None)
            super().__init__(fn, device)

    monkeypatch.setattr(g, "Recorded", Counted)
    real = g._shrunk
    monkeypatch.setattr(g, "_shrunk", lambda b, state, keep, k: sizes.append(keep.numel()) or real(b, state, keep, k))
    model = sdpa_model(False)
    eager = FusedDecoder(model, torch.float32, options=StepOptions(sdpa=True))
    src = many_sources()
    for beam, nbest, alpha, max_b in [(4, 2, 0.6, 12), (2, 1, 0.0, 6), (5, 5, 1.0, 9), (3, 1, 0.6, 30)]:
        sizes.clear()
        want = beam_search(eager, src, beam, alpha, 1.0, max_b, nbest)
        got = g.graphed_beam_search(graphed(model, False), src, beam, alpha, 1.0, max_b, nbest, shrink=shrink)
        assert [[h.tokens for h in x] for x in want] == [[h.tokens for h in x] for x in got]
        assert [h.score for x in got for h in x] == pytest.approx([h.score for x in want for h in x], abs=1e-5)
        shrunk = [n for n in sizes if n is not None]
        assert shrunk and all(a > b for a, b in zip(shrunk, shrunk[1:])) and shrunk[0] <= shrink * src.size(0)
        assert sizes.count(None) == len(shrunk) + 1
        sizes.clear()
        g.graphed_beam_search(graphed(model, False), src, beam, alpha, 1.0, max_b, nbest, shrink=0.0)
        assert sizes == [None]


def test_the_translator_searches_through_graphs_when_they_are_on(monkeypatch):
    from aiayn.decode.fast import graphed as g
    used = []
    monkeypatch.setattr(g, "graphed_beam_search",
                        lambda *a, shrink: used.append(shrink) or [[] for _ in range(a[1].size(0))])
    fused = graphed(toy(), False)
    search_beams(fused, sources(), 4, 0.6, 1.0, 5, 1, 100)
    fused = FusedDecoder(toy(), options=StepOptions(sdpa=True, graphs=True, shrink=0.0))
    search_beams(fused, sources(), 4, 0.6, 1.0, 5, 1, 100)
    search_beams(fused, sources(), 4, 0.6, 1.0, 5, 1, 100, abandoned=lambda ids: ids < 0)  # a server's: eager
    fused = FusedDecoder(toy(), options=StepOptions(sdpa=True))
    search_beams(fused, sources(), 4, 0.6, 1.0, 5, 1, 100)
    assert used == [0.5, 0.0]  # the decoder's shrink
