"""Lexically constrained beam search (not in the paper, whose search is §6.1's): every output contains
each of its sentence's target phrases (subword ids), by dynamic beam allocation (Post & Vilar 2018)
in the vectorized form of Hu et al. (2019), as fairseq's `--constraints` has it.

Each hypothesis carries its progress through its phrases: which are complete, and how far the one in
progress has got (a phrase left half-way starts over; each phrase is met by an occurrence of its
own). Each step's candidates are the usual best next tokens of every beam plus, per beam, the next
token of each phrase it has still to write; the k live beams are then taken bank by bank, a bank
being the hypotheses that have written the same number of constraint tokens (the best of every bank
first, fullest banks first, then the second best of every bank ...), so hypotheses that have met
more constraints are not crowded out by ones that score better only for having met fewer. A
hypothesis may end only once every phrase is complete, a candidate is dropped when too few steps are
left to write what it still owes (so a constraint is always met, within §6.1's maximum length), and
a completed phrase is followed by the start of a word (or the end), so it is written as whole words.
A sentence's search depends on its own rows only: it translates the same alone and in any batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..data.tokenizer import BOS, EOS, PAD
from ..errors import AiaynError
from .beams import Hypothesis, finished_hypotheses, length_penalty, max_lengths, merge_finished, open_sentences
from .search import Abandoned, IncrementalDecoder, extended_histories, keeps_attended, still_wanted

MAX_PHRASES = 32  # target phrases one sentence may be held to (a bit each in the progress mask)


class ConstraintError(AiaynError):
    """Constraints no search can meet (too long for the output, too many): the message names the sentence."""


def check_constraints(constraints: list[list[list[int]]], ids: list[list[int]], max_len_a: float,
                      max_len_b: int, prefixes: list[list[int]] | None = None, shortlist: bool = False,
                      sampling: bool = False, first: int = 1) -> None:
    """One list of phrases per source (ids with EOS): at most MAX_PHRASES each, none empty, and
    together (with the sentence's prefix) no longer than the longest output §6.1 allows it; not with
    a shortlist (its columns are not the vocabulary's) nor with sampling (the search is a beam's).
    Errors name the sentence by its number, `first` being the first's."""
    if any(constraints) and (shortlist or sampling):
        raise ConstraintError("terms the output must hold need beam search over the whole vocabulary: "
                              "translate without " + ("--shortlist" if shortlist else "--sample"))
    if len(constraints) != len(ids):
        raise ConstraintError(f"{len(constraints)} constraint lists for {len(ids)} sources")
    for n, (cs, x) in enumerate(zip(constraints, ids), first):
        if len(cs) > MAX_PHRASES:
            raise ConstraintError(f"sentence {n} has {len(cs)} constraints; at most {MAX_PHRASES}")
        if any(not c or any(i in (PAD, BOS, EOS) for i in c) for c in cs):
            raise ConstraintError(f"sentence {n}: a constraint is empty or holds a special symbol")
        owed = sum(len(c) for c in unique_phrases(cs)) + (len(prefixes[n - first]) if prefixes else 0)
        most = int(max_len_a * max(len(x) - 1, 0) + max_len_b)
        if cs and owed > most:
            raise ConstraintError(f"sentence {n}: its constraints need {owed} subwords; its output may have at "
                                  f"most {most} (decode.max_len_a x source + decode.max_len_b)")


def unique_phrases(phrases: list[list[int]]) -> list[list[int]]:
    """The phrases without repeats (a term asked for twice is written once)."""
    out: list[list[int]] = []
    for p in phrases:
        if p not in out:
            out.append(p)
    return out


class _Phrases:
    """The active sentences' phrases as tensors: tokens (n, P, W) padded with -1, lengths (n, P)
    (0: no phrase), and each sentence's full mask and total length."""

    def __init__(self, constraints: list[list[list[int]]], device: torch.device):
        cs = [unique_phrases(c) for c in constraints]
        P = max(1, max(len(c) for c in cs))
        W = max(1, max((len(p) for c in cs for p in c), default=1))
        self.tok = torch.full((len(cs), P, W), -1, dtype=torch.long)
        self.len = torch.zeros(len(cs), P, dtype=torch.long)
        for b, c in enumerate(cs):
            for p, phrase in enumerate(c):
                self.tok[b, p, :len(phrase)] = torch.tensor(phrase)
                self.len[b, p] = len(phrase)
        self.tok, self.len = self.tok.to(device), self.len.to(device)
        self.full = ((self.len > 0).long() << torch.arange(P, device=device)).sum(1)  # (n,)
        self.total = self.len.sum(1)

    def select(self, keep: Tensor) -> None:
        self.tok, self.len, self.full, self.total = self.tok[keep], self.len[keep], self.full[keep], self.total[keep]


class _Progress:
    """Per decoder row: the phrase in progress (-1: none), how many of its tokens are written, the
    mask of complete phrases, and whether the last token completed one."""

    def __init__(self, rows: int, device: torch.device):
        self.cur = torch.full((rows,), -1, dtype=torch.long, device=device)
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.done = torch.zeros(rows, dtype=torch.long, device=device)
        self.just = torch.zeros(rows, dtype=torch.bool, device=device)

    def take(self, cur: Tensor, pos: Tensor, done: Tensor, just: Tensor) -> None:
        self.cur, self.pos, self.done, self.just = cur, pos, done, just


def word_starts_mask(pieces: list[str], device: torch.device) -> Tensor:
    """(V,) True for the tokens that may follow a completed phrase: a piece that starts a word (▁),
    one without letters or digits (punctuation), and EOS."""
    ok = [p.startswith("\u2581") or not any(ch.isalnum() for ch in p) for p in pieces]
    out = torch.tensor(ok, dtype=torch.bool, device=device)
    out[EOS] = True
    return out


def _candidates(lp: Tensor, prog: _Progress, ph: _Phrases, k: int) -> tuple[Tensor, Tensor]:
    """Each row's candidate tokens and their log-probabilities (R, 2k + P): its 2k best, then the
    next token of each phrase it has still to write (-inf where there is none or it repeats one)."""
    R, V = lp.shape
    c = min(2 * k, V)
    top_lp, top_tok = lp.topk(c, dim=1)
    s = torch.arange(R, device=lp.device) // k
    P = ph.len.size(1)
    p_idx = torch.arange(P, device=lp.device)
    open_ = ((prog.done[:, None] >> p_idx) & 1).eq(0) & (ph.len[s] > 0)  # (R, P)
    at = torch.where(p_idx[None] == prog.cur[:, None], prog.pos[:, None], 0).clamp(max=ph.tok.size(2) - 1)
    nxt = ph.tok[s].gather(2, at[:, :, None]).squeeze(2)  # (R, P)
    nxt = torch.where(open_, nxt, -1)
    rep = (nxt[:, :, None] == top_tok[:, None, :]).any(2)  # already among the best
    rep |= torch.tril(nxt[:, :, None] == nxt[:, None, :], -1).any(2)  # a repeat of an earlier phrase's token
    ok = (nxt >= 0) & ~rep
    extra_lp = torch.where(ok, lp.gather(1, nxt.clamp(min=0)), float("-inf"))
    return torch.cat([top_tok, torch.where(ok, nxt, EOS)], 1), torch.cat([top_lp, extra_lp], 1)


def _advance(tok: Tensor, prog: _Progress, ph: _Phrases, k: int) -> tuple[Tensor, ...]:
    """The progress after each candidate token (R, M): phrase in progress, its position, complete
    mask, whether one was just completed, and constraint tokens written (the bank)."""
    R, M = tok.shape
    s = torch.arange(R, device=tok.device) // k
    P, W = ph.len.size(1), ph.tok.size(2)
    cur, pos, done = prog.cur[:, None].expand(R, M), prog.pos[:, None].expand(R, M), prog.done[:, None].expand(R, M)
    nxt = ph.tok[s, prog.cur.clamp(min=0), prog.pos.clamp(max=W - 1)][:, None]  # (R, 1)
    cont = (cur >= 0) & (tok == nxt)
    p_idx = torch.arange(P, device=tok.device)
    open_ = ((done[:, :, None] >> p_idx) & 1).eq(0) & (ph.len[s] > 0)[:, None, :]  # (R, M, P)
    starts = (ph.tok[s, :, 0][:, None, :] == tok[:, :, None]) & open_
    first = starts.long().argmax(2)
    new_cur = torch.where(cont, cur, torch.where(starts.any(2), first, -1))
    new_pos = torch.where(cont, pos + 1, torch.where(starts.any(2), 1, 0))
    plen = ph.len[s].gather(1, new_cur.clamp(min=0))
    just = (new_cur >= 0) & (new_pos == plen)
    new_done = torch.where(just, done | torch.bitwise_left_shift(torch.ones_like(done), new_cur.clamp(min=0)), done)
    new_cur, new_pos = torch.where(just, -1, new_cur), torch.where(just, 0, new_pos)
    bits = (new_done[:, :, None] >> p_idx) & 1
    met = (bits * ph.len[s][:, None, :]).sum(2) + new_pos
    return new_cur, new_pos, new_done, just, met


def _allocate(score: Tensor, bank: Tensor, live: Tensor, k: int, banks: int) -> Tensor:
    """Dynamic beam allocation: indices (n, k) of the candidates kept, from scores, banks and which
    may live (n, C each): by rank within their bank, then fullest bank first; ties by position."""
    n, C = score.shape
    order = torch.where(live, score, float("-inf")).sort(dim=1, descending=True, stable=True).indices
    b = bank.gather(1, order)
    onehot = torch.nn.functional.one_hot(b, banks)
    rank = (onehot.cumsum(1) * onehot).sum(2) - 1
    key = rank * banks + (banks - 1 - b)
    key = torch.where(live.gather(1, order), key, banks * (C + 1))
    pick = key.sort(dim=1, stable=True).indices[:, :k]
    return order.gather(1, pick)


def constrained_beam_search(model: IncrementalDecoder, src: Tensor, constraints: list[list[list[int]]],
                            word_starts: Tensor, beam: int = 4, alpha: float = 0.6, max_len_a: float = 1.0,
                            max_len_b: int = 50, nbest: int = 1, limit: int = 1023,
                            abandoned: Abandoned | None = None) -> list[list[Hypothesis]]:
    """Beam search (§6.1's: lp(|Y|), its maximum length and stopping rule) over src (B, S) whose
    every output holds each of its sentence's `constraints` (check_constraints first); `word_starts`
    is word_starts_mask's; sentences `abandoned` names leave as search.beam_search's do. Returns the
    `nbest` best hypotheses per sentence."""
    B, k, dev = src.size(0), beam, src.device
    max_len = max_lengths(src, max_len_a, max_len_b, limit)
    L = int(max_len.max()) + 1
    cache = model.start_decoding(src, group=k)
    ph, prog = _Phrases(constraints, dev), _Progress(B * k, dev)
    banks = int(ph.total.max()) + 1
    active = torch.arange(B, device=dev)
    scores = torch.full((B, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0
    hists = [torch.full((B * k, L), PAD, dtype=torch.long, device=dev) for _ in range(1 + keeps_attended(cache))]
    tokens = torch.full((B * k,), BOS, dtype=torch.long, device=dev)
    fin_score = torch.full((B, k), float("-inf"), dtype=torch.float64, device=dev)
    fins = [torch.full((B, k, L), PAD, dtype=torch.long, device=dev) for _ in hists]
    bound_lp = length_penalty(max_len.double() + 1, alpha)
    for t in range(L):
        n = active.numel()
        cand, flat = _scored(model.decode_step(tokens, cache), scores, prog, ph, word_starts, max_len[active], t)
        M = flat[0].size(1) // k
        top_scores, top_idx = cand.topk(k, dim=1)  # those ending among the k best finish
        is_eos = (flat[0].gather(1, top_idx) == EOS) & torch.isfinite(top_scores)
        row_base = torch.arange(n, device=dev)[:, None] * k
        if is_eos.any():
            rows = (row_base + top_idx // M).view(-1)
            merge_finished(fin_score, fins, active, top_scores, [h[rows] for h in hists], is_eos,
                           length_penalty(t + 1, alpha))
        live = (flat[0] != EOS) & torch.isfinite(cand)
        kept = _allocate(cand, flat[5], live, k, banks)  # (n, k)
        new_scores = torch.where(live.gather(1, kept), cand.gather(1, kept), float("-inf"))
        new_tok, src_rows = flat[0].gather(1, kept), (row_base + kept // M).view(-1)
        keep = open_sentences(fin_score[active, nbest - 1], new_scores.max(1).values, bound_lp[active],
                              t >= max_len[active])
        keep = keep if (wanted := still_wanted(abandoned, t, active[keep])) is None else keep[wanted]
        if not keep.numel():
            break
        state = [x.gather(1, kept).view(-1) for x in flat[1:5]]
        if keep.numel() < n:
            sel = (keep[:, None] * k + torch.arange(k, device=dev)).view(-1)
            src_rows, state = src_rows.view(n, k)[keep].view(-1), [x[sel] for x in state]
            new_scores, new_tok, active = new_scores[keep], new_tok[keep], active[keep]
            ph.select(keep)
        prog.take(*state)
        hists = extended_histories(hists, src_rows, new_tok, cache, t)
        cache.reorder(src_rows, keep if keep.numel() < n else None)
        scores, tokens = new_scores, new_tok.view(-1)
    return finished_hypotheses(fin_score[:, :nbest], [f[:, :nbest] for f in fins])


def _scored(logits: Tensor, scores: Tensor, prog: _Progress, ph: _Phrases, word_starts: Tensor, max_len: Tensor,
            t: int) -> tuple[Tensor, list[Tensor]]:
    """Step t's candidates of each sentence, (n, k·M): their scores (-inf where a candidate may not be
    taken, or too few steps are left to write what it still owes), and [token, phrase in progress,
    position, complete mask, just completed, bank] of each."""
    n, k = scores.shape
    lp = _next_lprobs(logits, prog, ph, word_starts, t >= max_len, k)
    tok, tok_lp = _candidates(lp, prog, ph, k)
    cur, pos, done, just, met = _advance(tok, prog, ph, k)
    owed = ph.total.repeat_interleave(k)[:, None] - met
    left = (max_len - (t + 1)).repeat_interleave(k)[:, None]
    cand = torch.where((tok == EOS) | (owed <= left), scores.view(-1, 1) + tok_lp, float("-inf"))
    return cand.view(n, -1), [x.reshape(n, -1) for x in (tok, cur, pos, done, just, met)]


def _next_lprobs(logits: Tensor, prog: _Progress, ph: _Phrases, word_starts: Tensor, at_max: Tensor,
                 k: int) -> Tensor:
    """Log-probabilities of the next token (R, V) as the constrained search may take them: never PAD
    or BOS, EOS only once every phrase is complete (and only EOS at the maximum length), and after a
    completed phrase only the start of a word."""
    lp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    lp[:, PAD] = float("-inf")
    lp[:, BOS] = float("-inf")
    all_met = prog.done == ph.full.repeat_interleave(k)
    lp[:, EOS] = torch.where(all_met, lp[:, EOS], float("-inf"))
    if prog.just.any():  # after a completed phrase: a word's start, or the first token of one of its own phrases
        rows = prog.just.nonzero().squeeze(1)
        ok = word_starts.expand(rows.numel(), -1).clone()
        ok.scatter_(1, ph.tok[rows // k, :, 0].clamp(min=0), True)  # (-1: none, PAD, never taken anyway)
        lp[rows] = lp[rows].masked_fill(~ok, float("-inf"))
    only_eos = at_max.repeat_interleave(k)
    if only_eos.any():
        eos = lp[only_eos, EOS]
        lp[only_eos] = float("-inf")
        lp[only_eos, EOS] = eos
    return lp
