"""Beam search's bookkeeping in tensors (§6.1): hypotheses, the GNMT length penalty, the maximum
length, the best next tokens, the candidates, the live beams, the finished hypotheses and the
stopping rule. search.beam_search and the graphed search (fast/graphed.py) share these, so both
keep the same hypotheses."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..data.tokenizer import BOS, EOS, PAD


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without BOS/EOS
    score: float  # length-normalized log-probability (beam) or raw log-probability (greedy)
    attended: list[int] | None = None  # per token, the source position its prediction attended to most


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty (Wu et al., 2016), used in §6.1: lp(Y) = ((5 + |Y|) / 6)^α."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src: Tensor, a: float, b: int, limit: int) -> Tensor:
    """§6.1: maximum output length = a · input length + b (input without EOS/padding), capped."""
    n_src = ((src != PAD) & (src != EOS)).sum(1)
    return (a * n_src + b).long().clamp(1, limit)


def top_lprobs(logits: Tensor, n: int, at_max: Tensor, chunk_bytes: int = 1 << 20,
                branchless: bool | None = None) -> tuple[Tensor, Tensor]:
    """The n best next tokens of each row and their log-probabilities, (R, n) each.

    Log-probabilities are log_softmax over the whole vocabulary; PAD and BOS are never chosen,
    and rows where ``at_max`` is set may only end (EOS keeps its own log-probability). The
    vocabulary-wide work runs on blocks of rows small enough to stay in cache: on a 2-core CPU
    this is about twice as fast as one log_softmax and one top-k over the full (R, V) tensor.
    `branchless` (None: off a CPU) forces EOS without asking whether any row needs it: asking
    would wait for the GPU.
    """
    R, V = logits.shape
    n = min(n, V)
    vals = torch.empty(R, n, device=logits.device)
    idx = torch.empty(R, n, dtype=torch.long, device=logits.device)
    on_cpu = logits.device.type == "cpu"
    step = R if not on_cpu else max(1, chunk_bytes // (4 * V))
    for s in range(0, R, step):
        lp = torch.log_softmax(logits[s:s + step], dim=-1, dtype=torch.float32)
        lp[:, PAD] = float("-inf")
        lp[:, BOS] = float("-inf")
        rows = at_max[s:s + step]
        if not on_cpu if branchless is None else branchless:
            only_eos = torch.full_like(lp, float("-inf"))
            only_eos[:, EOS] = lp[:, EOS]
            lp = torch.where(rows[:, None], only_eos, lp)
        elif rows.any():
            eos = lp[rows, EOS]
            lp[rows] = float("-inf")
            lp[rows, EOS] = eos
        torch.topk(lp, n, dim=-1, out=(vals[s:s + step], idx[s:s + step]))
    return vals, idx


def candidates(scores: Tensor, row_lp: Tensor, row_tok: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each sentence's 2k best continuations (n, 2k), from the live scores (n, k) and each beam's c best
    next tokens (n·k, c): their scores, beams, tokens, and whether they end (EOS with a finite score)."""
    n, c = scores.size(0), row_lp.size(1)
    cand = (scores.unsqueeze(-1) + row_lp.view(n, k, c)).view(n, k * c)
    top_scores, top_idx = cand.topk(min(2 * k, k * c), dim=1)
    top_beam, top_tok = top_idx // c, row_tok.view(n, k * c).gather(1, top_idx)
    return top_scores, top_beam, top_tok, (top_tok == EOS) & torch.isfinite(top_scores)


def live_beams(top_scores: Tensor, top_tok: Tensor, top_beam: Tensor, is_eos: Tensor, row_base: Tensor, k: int
          ) -> tuple[Tensor, Tensor, Tensor]:
    """The live beams: each sentence's k best candidates that do not end in EOS, (n, k) scores and
    tokens, and the decoder row each continues, (n·k,)."""
    rank = torch.arange(top_scores.size(1), device=top_scores.device).expand_as(top_scores)
    live = (rank + is_eos.long() * 10_000).topk(k, dim=1, largest=False).indices  # (n, k)
    return top_scores.gather(1, live), top_tok.gather(1, live), (row_base + top_beam.gather(1, live)).view(-1)


def merge_finished(fin_score: Tensor, fins: list[Tensor], active: Tensor, scores: Tensor, rows: list[Tensor],
                    is_eos: Tensor, lp: float) -> None:
    """Hypotheses that end in EOS among a sentence's first k candidates (scores (n, k); their
    tokens so far, and what else is followed per token, (n·k, L) each in `rows`) join its k best
    finished ones (`fins`, (B, k, L) each), normalized by lp(|Y|) (§6.1), best first; a stable sort
    keeps earlier ones first among equal scores."""
    n, k = scores.shape
    new = torch.where(is_eos, scores.double() / lp, float("-inf"))
    merged, order = torch.cat([fin_score[active], new], 1).sort(dim=1, descending=True, stable=True)
    fin_score[active] = merged[:, :k]
    for fin, row in zip(fins, rows):
        both = torch.cat([fin[active], row.view(n, k, -1)], 1)
        fin[active] = both.gather(1, order[:, :k, None].expand(n, k, both.size(2)))


def open_sentences(nth: Tensor, best_live: Tensor, bound_lp: Tensor, at_max: Tensor) -> Tensor:
    """Indices of the sentences still searching. One is done when EOS was forced (every live beam
    has finished), or when it has `nbest` finished hypotheses (the nth best scores `nth`) and no
    live one can beat them: a live score can only fall, so the best it can reach is
    best_live / lp(max length) (the stopping rule of tensor2tensor, which the paper used)."""
    done = at_max | ((nth > float("-inf")) & (best_live.double() / bound_lp <= nth))
    return (~done).nonzero().squeeze(1)


def hypothesis(tokens: list[int], score: float, attended: list[int] | None) -> Hypothesis:
    return Hypothesis(tokens, score, None if attended is None else attended[:len(tokens)])


def finished_hypotheses(fin_score: Tensor, fins: list[Tensor]) -> list[list[Hypothesis]]:
    """Each sentence's finished hypotheses (scores (B, n), tokens (B, n, L) and maybe attended positions)."""
    atts = fins[1].tolist() if len(fins) > 1 else [[None] * fins[0].size(1)] * fins[0].size(0)
    return [[hypothesis([i for i in row if i != PAD], s, a) for s, row, a in zip(sc, tk, at) if s > float("-inf")]
            for sc, tk, at in zip(fin_score.tolist(), fins[0].tolist(), atts)]
