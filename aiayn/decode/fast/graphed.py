"""The fused decoder step (§3.2.3, §6.1) replayed as one CUDA graph: one launch a step instead of ~140.

On a GPU the eager step is bound by the host, not by arithmetic (bench/README.md, profiled on an H200: 911 ms
of host time to 64 ms of GPU time over a search on an H200; `bench/decode/decode_launches.py` counts 141 kernels a base
bf16 step). A CUDA graph records a step's kernels once and launches them all with one call, but only
a step whose every tensor keeps its size and place: so a graphed batch's step attends over the whole
self-attention cache, the positions after the current one masked (Eq. 1 with -inf added to their
scores, which gives them weight 0), with the position a tensor on the device (`n`), and computes every
row of the batch as it started: finished sentences' rows and sources stay, stale, behind the live
prefix (`FusedState.static`). The graph is recorded at a batch's first step and again when its cache
grows; in between each step copies the tokens in, sets the position and replays. Beam search can go
further (`graphed_beam_search`): the whole search step — the decoder step, the top-k, the finished
hypotheses, the beams' reorder — is one graph, and only each look at which sentences are done
(every LOOK_EVERY steps) waits for the device; once at most SHRINK of the batch is open, the open
sentences go on alone, recorded again.

On a CPU the same static step runs eagerly, "replayed" by calling it again on the tensors it was
recorded with (not the state's current ones, as a graph's recorded addresses): the tests check there
what a graph would compute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ...data.tokenizer import BOS, PAD
from ..beams import (
    Hypothesis,
    candidates,
    finished_hypotheses,
    length_penalty,
    live_beams,
    max_lengths,
    merge_finished,
    open_sentences,
    top_lprobs,
)
from ..search import LOOK_EVERY, beam_search

log = logging.getLogger("aiayn")
SHRINK = 0.5  # graphed search: the open sentences go on alone once at most this fraction of the batch


def static_logits(dec, tokens: Tensor, n: Tensor, ks: list[Tensor], vs: list[Tensor], idx: Tensor,
                  cross: list[tuple[Tensor, Tensor]], pad: Tensor, group: int) -> Tensor:
    """The step at position n (a (1,) tensor) for every row of the buffers: tokens (rows,), caches
    (capacity, rows, h, d), row table idx (capacity, rows) -> logits (rows, V). Sizes never depend on
    n, and nothing is read back to the host (a graph may not wait for the device)."""
    cap, rows = idx.shape
    idx.index_copy_(0, n, torch.arange(rows, device=idx.device).view(1, rows))  # row r's new entry: buffer row r
    # Where each row's positions 0..capacity-1 lie in a buffer seen as (capacity · rows, h, d); a later
    # position's entry may be stale (a dropped row's) or unset (0): masked either way.
    where = (idx + torch.arange(cap, device=idx.device)[:, None] * rows).view(-1)
    later = torch.arange(cap, device=idx.device) > n  # (capacity,)
    mask = torch.zeros(1, cap, dtype=ks[0].dtype, device=idx.device).masked_fill(later, float("-inf"))  # (1, cap)
    x = dec.embed.index_select(0, tokens) * dec.scale + dec.pos.index_select(0, n)
    x = dec.run_layers(x, lambda y, i, L: _self_attention(dec, y, L, ks[i], vs[i], n, where, mask), cross, pad, group)
    return dec.linear(x, dec.out, dec.out_dtype)


def _self_attention(dec, y: Tensor, L, kc: Tensor, vc: Tensor, n: Tensor, where: Tensor, mask: Tensor) -> Tensor:
    """Eq. 1 over the whole cache (capacity, rows, h, d), position n written first, later ones masked."""
    h, dk, dv = L.heads[:3]
    R, cap = y.size(0), kc.size(0)
    q, k, v = dec.linear(y, L.qkv).split([h * dk, h * dk, h * dv], 1)
    kc.index_copy_(0, n, k.reshape(1, R, h, dk))
    vc.index_copy_(0, n, v.reshape(1, R, h, dv))
    keys = kc.view(-1, h, dk).index_select(0, where).view(cap, R, h, dk)
    values = vc.view(-1, h, dv).index_select(0, where).view(cap, R, h, dv)
    a = F.scaled_dot_product_attention(q.view(R, h, 1, dk), keys.permute(1, 2, 0, 3), values.permute(1, 2, 0, 3),
                                       attn_mask=mask)  # (R, h, 1, d_v)
    return dec.linear(a.reshape(R, h * dv), L.o)


class Recorded:
    """`fn()` over tensors that keep their places, run once (the warm-up, a real call: its result is
    returned by `first`), then recorded as a CUDA graph; `replay()` runs the recording. On a CPU
    nothing is recorded and `replay()` calls `fn` again (fn must read the tensors it was given, as a
    graph reads its recorded addresses)."""

    def __init__(self, fn: Callable[[], Tensor | None], device: torch.device) -> None:
        self.fn, self.graph = fn, None
        if device.type != "cuda":
            self.first = self.out = fn()
            return
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # lazy set-up (cuBLAS workspaces) must not happen inside the capture
            self.first = fn()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):  # records; runs nothing
            self.out = fn()

    def replay(self) -> Tensor | None:
        if self.graph is None:
            out = self.fn()
            if out is not None:
                self.out.copy_(out)  # the one output tensor a graph has
        else:
            self.graph.replay()
        return self.out


class StepGraph:
    """One batch's step (`static_logits` over a static FusedState), recorded on its first call and
    whenever the cache has grown (new buffers), replayed otherwise. Returns the first R rows of the
    graph's output, overwritten by the next step."""

    def __init__(self, dec, state) -> None:
        self.dec, self.state = dec, state
        rows = state.idx.size(1)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=state.idx.device)
        self.n = torch.zeros(1, dtype=torch.long, device=state.idx.device)
        self.recorded: Recorded | None = None
        self.k0: Tensor | None = None  # the first cache buffer recorded: a new one means the cache grew

    def __call__(self, tokens: Tensor) -> Tensor:
        st = self.state
        self.tokens[:tokens.numel()] = tokens  # rows past the live ones keep stale tokens: computed, never read
        self.n.fill_(st.n)
        if self.k0 is not st.k[0]:  # first step, or the cache grew
            out = self._record()
        else:
            out = self.recorded.replay()
        return out[:tokens.numel()]

    def _args(self) -> tuple:
        st = self.state
        return (self.tokens, self.n, list(st.k), list(st.v), st.idx, [tuple(kv) for kv in st.cross], st.pad, st.group)

    def _record(self) -> Tensor:
        self.k0, args = self.state.k[0], self._args()
        self.recorded = None  # the old graph's memory goes first
        self.recorded = Recorded(lambda: static_logits(self.dec, *args), self.state.idx.device)
        log.debug("decoding step recorded as a CUDA graph (%d rows, capacity %d)", *self.state.idx.shape[::-1])
        return self.recorded.first  # the warm-up's logits: this step's (writing position n again gives the same)


@dataclass(frozen=True)
class _Beams:
    """Beam search's state in tensors that keep their places: each row's next token and history
    (B·k, L), the live scores (B, k), the k best finished hypotheses (float64 scores (B, k), tokens
    (B, k, L)), the step t (1,), each sentence's maximum length (B,) and its ids (B,)."""

    tokens: Tensor
    hist: Tensor
    scores: Tensor
    fin_score: Tensor
    fins: Tensor
    t: Tensor
    max_len: Tensor
    ids: Tensor

    @staticmethod
    def start(max_len: Tensor, k: int, L: int) -> _Beams:
        B, dev = max_len.numel(), max_len.device
        scores = torch.full((B, k), float("-inf"), device=dev)
        scores[:, 0] = 0.0  # one live beam at the start
        return _Beams(torch.full((B * k,), BOS, dtype=torch.long, device=dev),
                      torch.full((B * k, L), PAD, dtype=torch.long, device=dev), scores,
                      torch.full((B, k), float("-inf"), dtype=torch.float64, device=dev),
                      torch.full((B, k, L), PAD, dtype=torch.long, device=dev),
                      torch.zeros(1, dtype=torch.long, device=dev), max_len, torch.arange(B, device=dev))


def _search_step(dec, b: _Beams, state: tuple, k: int, alpha: float) -> None:
    """One step of beam search (search.beam_search's, every sentence kept, nothing read back): the
    decoder step at position t, the 2k best continuations, those ending in EOS set aside, the k best
    others continued (histories and the cache's row table reordered in place), t + 1."""
    ks, vs, idx, cross, pad = state
    B = b.scores.size(0)
    logits = static_logits(dec, b.tokens, b.t, ks, vs, idx, cross, pad, k)
    at_max = (b.t >= b.max_len)[:, None].expand(B, k).reshape(-1)
    row_lp, row_tok = top_lprobs(logits, 2 * k, at_max, branchless=True)
    top_scores, top_beam, top_tok, is_eos = candidates(b.scores, row_lp, row_tok, k)
    row_base = b.ids.unsqueeze(1) * k
    rows = (row_base + top_beam[:, :k]).view(-1)
    merge_finished(b.fin_score, [b.fins], b.ids, top_scores[:, :k], [b.hist[rows]], is_eos[:, :k],
                    length_penalty(b.t.double() + 1, alpha))
    new_scores, new_tok, src_rows = live_beams(top_scores, top_tok, top_beam, is_eos, row_base, k)
    b.hist.copy_(b.hist.index_select(0, src_rows))
    b.hist.index_copy_(1, b.t, new_tok.view(-1, 1))
    idx.copy_(idx.index_select(1, src_rows))  # every position: later ones are masked, whatever they hold
    b.scores.copy_(new_scores)
    b.tokens.copy_(new_tok.view(-1))
    b.t.add_(1)


def _shrunk(b: _Beams, state: tuple, keep: Tensor, k: int) -> tuple[_Beams, tuple]:
    """The open sentences `keep` alone, in new tensors (a graph recorded again): each row's cache
    gathered through the row table into its own buffer row (its positions in order, the table then
    the identity), the sources, scores, finished hypotheses and histories selected."""
    ks, vs, idx, cross, pad = state
    cap, R = idx.shape
    rows = (keep[:, None] * k + torch.arange(k, device=keep.device)).view(-1)
    where = (idx.index_select(1, rows) + torch.arange(cap, device=idx.device)[:, None] * R).view(-1)

    def gather(c: Tensor) -> Tensor:
        return c.view(-1, *c.shape[2:]).index_select(0, where).view(cap, rows.numel(), *c.shape[2:])

    new_idx = torch.arange(rows.numel(), device=idx.device).expand(cap, -1).contiguous()
    state = ([gather(c) for c in ks], [gather(c) for c in vs], new_idx,
             [(ck.index_select(0, keep), cv.index_select(0, keep)) for ck, cv in cross], pad.index_select(0, keep))
    b = _Beams(b.tokens[rows], b.hist[rows], b.scores[keep], b.fin_score[keep], b.fins[keep], b.t.clone(),
               b.max_len[keep], torch.arange(keep.numel(), device=keep.device))
    return b, state


@torch.no_grad()
def graphed_beam_search(dec, src: Tensor, beam: int = 4, alpha: float = 0.6, max_len_a: float = 1.0,
                        max_len_b: int = 50, nbest: int = 1, limit: int = 1023, look_every: int = LOOK_EVERY,
                        shrink: float = SHRINK) -> list[list[Hypothesis]]:
    """search.beam_search (§6.1) with each step one CUDA graph replay (emulated on a CPU): the same
    hypotheses. Sentences that are done stay in the batch (they search on without changing their n
    best, as between two looks in beam_search), read every `look_every` steps, until at most
    `shrink` of the batch is open: then the open ones go on alone, recorded again (0: never)."""
    k = beam
    max_len = max_lengths(src, max_len_a, max_len_b, limit)
    L = int(max_len.max()) + 1
    st = dec.start_decoding(src, group=k, capacity=L)  # never grows: recorded again only to shrink
    if not st.static:
        raise ValueError("graphed_beam_search needs a fused decoder with graphs on (StepOptions.graphs)")
    b = _Beams.start(max_len, k, L)
    if st.first is not None:  # model.lang_tag decoder: each sentence's tag is its first input, not BOS
        b.tokens.copy_(st.first)
    state = (list(st.k), list(st.v), st.idx, [tuple(kv) for kv in st.cross], st.pad)
    del st  # its buffers go with the batch's first graph when the batch shrinks
    fin_score, fins = b.fin_score[:, :nbest].clone(), b.fins[:, :nbest].clone()  # every sentence's, once done
    which = torch.arange(src.size(0), device=src.device)  # the batch's sentences, as numbered in src
    bound_lp = length_penalty(max_len.double() + 1, alpha)
    graph = None
    for t in range(L):
        if graph is None:  # the warm-up runs step t, then the step is recorded
            graph = Recorded(lambda b=b, state=state: _search_step(dec, b, state, k, alpha), src.device)
        else:
            graph.replay()
        if t % look_every != look_every - 1 and t < L - 1:
            continue
        live = open_sentences(b.fin_score[:, nbest - 1], b.scores[:, 0], bound_lp, t >= b.max_len)
        if live.numel() > shrink * b.scores.size(0) or live.numel() == b.scores.size(0):
            continue
        fin_score[which], fins[which] = b.fin_score[:, :nbest], b.fins[:, :nbest]
        if not live.numel():
            break
        (b, state), which, bound_lp, graph = _shrunk(b, state, live, k), which[live], bound_lp[live], None
        log.debug("graphed search: %d sentences open at step %d, recorded again", live.numel(), t)
    return finished_hypotheses(fin_score, [fins])


def search_beams(model, src: Tensor, beam: int, alpha: float, max_len_a: float, max_len_b: int, nbest: int,
                 limit: int, abandoned=None) -> list[list[Hypothesis]]:
    """beam_search; for a fused decoder with `graphs` on (no alignments, not compiled) and no
    requests that may be abandoned, graphed_beam_search, shrinking as the decoder's `shrink` says."""
    options = getattr(model, "options", None)
    if options is not None and options.graphs and abandoned is None and model.align_head is None \
            and not options.compiled:
        return graphed_beam_search(model, src, beam, alpha, max_len_a, max_len_b, nbest, limit, shrink=options.shrink)
    return beam_search(model, src, beam, alpha, max_len_a, max_len_b, nbest, limit, abandoned)
