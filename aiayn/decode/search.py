"""Greedy and beam search with an incremental decoding state (§6.1).

The model only needs the `IncrementalDecoder` contract: ``start_decoding(src, group) -> cache``
(with ``cache.reorder(rows, sources)``) and ``decode_step(tokens, cache) -> logits (rows, V)``.
The Transformer (models/transformer.py), the recurrent baseline (models/rnn.py) and a scripted decoder in the tests
have it.
A decoding state that keeps `attended` (R,) after each step (fused.FusedState, when alignments are
asked for) has it followed like the tokens: each hypothesis then carries, per output token, the
source position attended to most when that token was predicted (word alignments, decode/align.py).
Scores are sums of log-probabilities; beam search ranks finished hypotheses by
score / lp(|Y|), |Y| counting the end-of-sentence token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from ..data.tokenizer import BOS, EOS, PAD
from .beams import (
    Hypothesis,
    candidates,
    finished_hypotheses,
    hypothesis,
    length_penalty,
    live_beams,
    max_lengths,
    merge_finished,
    open_sentences,
    top_lprobs,
)


class DecodingState(Protocol):
    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Keep decoder rows `rows`; `sources` selects the sources when that set changes; row r
        of the result belongs to source r // group."""


class IncrementalDecoder(Protocol):
    """What search needs of a model: encode once, then one target token per step with a cache."""

    def start_decoding(self, src: Tensor, group: int = 1) -> DecodingState:
        """Encode src (B, S) for B·group decoder rows; rows b·group .. b·group + group - 1 are source b's."""

    def decode_step(self, tokens: Tensor, cache: DecodingState) -> Tensor:
        """Next-token logits (R, V) after feeding tokens (R,)."""


Abandoned = Callable[[Tensor], Tensor]  # sentence ids (B,) -> which of them nobody waits for now
Pick = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]  # (logits, at max length, sentence ids) -> (lp, token)
ABANDON_EVERY = 8  # steps between two looks at `abandoned`
LOOK_EVERY = 4  # steps between two looks at which sentences are done, off a CPU (ABANDON_EVERY's divisor)


def still_wanted(abandoned: Abandoned | None, t: int, active: Tensor) -> Tensor | None:
    """Every ABANDON_EVERY steps, which active sentences someone still waits for (None: all)."""
    if abandoned is None or t % ABANDON_EVERY != ABANDON_EVERY - 1:
        return None
    return ~abandoned(active)


@torch.no_grad()
def greedy_search(model: IncrementalDecoder, src: Tensor, max_len_a: float = 1.0, max_len_b: int = 50,
                  limit: int = 1023, abandoned: Abandoned | None = None, pick: Pick | None = None
                  ) -> list[Hypothesis]:
    """Pick the most probable next token until EOS or the maximum length (or `pick`'s: a draw,
    decode/sampling.py); finished sentences leave the batch, and so do `abandoned` ones (a server's
    requests that gave up)."""
    B, dev = src.size(0), src.device
    max_len = max_lengths(src, max_len_a, max_len_b, limit)
    cache = model.start_decoding(src)
    tokens = torch.full((B,), BOS, dtype=torch.long, device=dev)
    out = torch.full((B, int(max_len.max()) + 1), PAD, dtype=torch.long, device=dev)
    att = torch.zeros_like(out)
    scores = torch.zeros(B, device=dev)
    active = torch.arange(B, device=dev)  # sentence id of each row
    for t in range(int(max_len.max()) + 1):
        if pick is None:
            best, tokens = top_lprobs(model.decode_step(tokens, cache), 1, t >= max_len[active])
            best, tokens = best[:, 0], tokens[:, 0]
        else:
            best, tokens = pick(model.decode_step(tokens, cache), t >= max_len[active], active)
        scores[active] += best
        out[active, t] = tokens
        if keeps_attended(cache):
            att[active, t] = cache.attended
        live = tokens != EOS
        wanted = still_wanted(abandoned, t, active)
        if wanted is not None:
            live &= wanted
        if not live.any():
            break
        if not live.all():
            keep = live.nonzero().squeeze(1)
            cache.reorder(keep, keep)
            active, tokens = active[keep], tokens[keep]
    return [hypothesis([i for i in row if i not in (PAD, EOS)], s, a if keeps_attended(cache) else None)
            for row, s, a in zip(out.tolist(), scores.tolist(), att.tolist())]


def keeps_attended(cache) -> bool:
    """Whether the decoding state keeps where each row attended (fused.FusedState, alignments asked for)."""
    return getattr(cache, "not_word", None) is not None


@torch.no_grad()
def beam_search(model: IncrementalDecoder, src: Tensor, beam: int = 4, alpha: float = 0.6, max_len_a: float = 1.0,
                max_len_b: int = 50, nbest: int = 1, limit: int = 1023, abandoned: Abandoned | None = None,
                look_every: int | None = None) -> list[list[Hypothesis]]:
    """Batched beam search (§6.1) over src (B, S); returns the `nbest` best hypotheses per row.

    Each step expands every live beam, keeps the 2·beam best candidates, sets aside those that end
    in EOS among the top `beam`, and continues with the best `beam` that do not (bookkeeping in
    tensors: no per-sentence Python work per step). A sentence stops as `open_sentences` says and leaves the
    batch; so does one that `abandoned` names (every ABANDON_EVERY steps), with what it finished.
    Which stop is read every `look_every` steps (None: 1 on a CPU, LOOK_EVERY off it: a read waits
    for the GPU); in between, a done sentence searches on without changing its n best (`open_sentences`)."""
    B, k, dev = src.size(0), beam, src.device
    look_every = look_every or (1 if dev.type == "cpu" else LOOK_EVERY)
    max_len = max_lengths(src, max_len_a, max_len_b, limit)  # (B,)
    L = int(max_len.max()) + 1
    cache = model.start_decoding(src, group=k)  # rows g·k .. g·k + k - 1: the beams of sentence g
    active = torch.arange(B, device=dev)  # sentence id of each active group of k rows
    scores = torch.full((B, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # one live beam at the start
    # Live beams' tokens so far, and, when alignments are asked for, the positions they attended to.
    hists = [torch.full((B * k, L), PAD, dtype=torch.long, device=dev) for _ in range(1 + keeps_attended(cache))]
    tokens = torch.full((B * k,), BOS, dtype=torch.long, device=dev)
    # The k best finished hypotheses of every sentence, best first, in tensors (float64 scores).
    fin_score = torch.full((B, k), float("-inf"), dtype=torch.float64, device=dev)
    fins = [torch.full((B, k, L), PAD, dtype=torch.long, device=dev) for _ in hists]
    # Largest length penalty a hypothesis can still get: |Y| = max length + EOS.
    bound_lp = length_penalty(max_len.double() + 1, alpha)
    t = 0
    while True:
        n = active.numel()
        # The 2k best continuations of a sentence are among the 2k best of each of its beams.
        at_max = (t >= max_len[active]).repeat_interleave(k)
        row_lp, row_tok = top_lprobs(model.decode_step(tokens, cache), 2 * k, at_max)  # (n*k, c)
        top_scores, top_beam, top_tok, is_eos = candidates(scores, row_lp, row_tok, k)
        row_base = torch.arange(n, device=dev).unsqueeze(1) * k
        if look_every > 1 or is_eos[:, :k].any():  # without looking, set aside (maybe nothing) every step
            rows = (row_base + top_beam[:, :k]).view(-1)
            merge_finished(fin_score, fins, active, top_scores[:, :k], [h[rows] for h in hists], is_eos[:, :k],
                            length_penalty(t + 1, alpha))
        new_scores, new_tok, src_rows = live_beams(top_scores, top_tok, top_beam, is_eos, row_base, k)
        keep = None  # None: no look this step, every sentence stays
        if t % look_every == look_every - 1 or t >= L - 1:  # the last step always looks: all are done
            keep = open_sentences(fin_score[active, nbest - 1], new_scores[:, 0], bound_lp[active],
                                  t >= max_len[active])
            keep = keep if (wanted := still_wanted(abandoned, t, active[keep])) is None else keep[wanted]
            if not keep.numel():
                break
        dropped = keep is not None and keep.numel() < n
        if dropped:
            src_rows = src_rows.view(n, k)[keep].view(-1)
            new_scores, new_tok, active = new_scores[keep], new_tok[keep], active[keep]
        hists = extended_histories(hists, src_rows, new_tok, cache, t)
        t += 1
        # Beams move only within their sentence, so the encoder side is selected only on a drop.
        cache.reorder(src_rows, keep if dropped else None)
        scores, tokens = new_scores, new_tok.view(-1)
    return finished_hypotheses(fin_score[:, :nbest], [f[:, :nbest] for f in fins])


def extended_histories(hists: list[Tensor], src_rows: Tensor, new_tok: Tensor, cache, t: int) -> list[Tensor]:
    """The live beams' histories, each continuing row `src_rows`, with step t's token (and where
    that row attended, when alignments are asked for)."""
    hists = [h.index_select(0, src_rows) for h in hists]
    hists[0][:, t] = new_tok.view(-1)
    if len(hists) > 1:
        hists[1][:, t] = cache.attended[src_rows]
    return hists


