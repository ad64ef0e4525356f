"""Sampled translations (not in the paper, which decodes by beam search, §6.1): each next token drawn
from the model's distribution, sharpened or flattened by a temperature and cut to the top k tokens
or the top p of the probability mass (Holtzman et al. 2020), as back-translation wants
(Edunov et al. 2018: sampled sources teach more than beam ones).

Each sentence draws from a generator of its own, seeded by the seed and the sentence's subwords, so
a sentence gets the same translation alone or in any batch, and again with the same seed; its score
is the model's own log-probability of what was drawn (temperature 1, no cut), comparable to greedy's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor

from ..data.tokenizer import BOS, EOS, PAD


@dataclass(frozen=True)
class Sampling:
    """How next tokens are drawn: temperature T (> 0), the k most probable only (0: all), the
    smallest set of most probable tokens whose mass reaches p (1: all), and the seed."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 1

    def check(self) -> Sampling:
        if not 0 < self.temperature <= 100 or not 0 <= self.top_k or not 0 < self.top_p <= 1:
            raise ValueError(f"sampling needs temperature in (0, 100], top_k >= 0 and top_p in (0, 1]; got "
                             f"{self.temperature}, {self.top_k}, {self.top_p}")
        return self


def sampling_probs(logp: Tensor, s: Sampling) -> Tensor:
    """The distribution tokens are drawn from, (R, V): softmax(log p / T) over the top k tokens and
    the nucleus of mass top_p (the most probable token always kept), zero elsewhere."""
    z = logp.float() / s.temperature
    if s.top_k and s.top_k < z.size(-1):
        kth = z.topk(s.top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if s.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass of the tokens more probable than each
        cut = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= s.top_p)
        probs = probs.masked_fill(cut, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def generators(src: Tensor, seed: int) -> list[torch.Generator]:
    """One generator per source row, seeded by `seed` and the row's subwords (PAD left out)."""
    out = []
    for row in src.tolist():
        key = f"{seed}:" + " ".join(str(i) for i in row if i != PAD)
        g = torch.Generator()
        g.manual_seed(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little"))
        out.append(g)
    return out


class Sampler:
    """greedy_search's `pick`: draws each row's next token (a row at its length limit ends), returns
    (log-probabilities at temperature 1, tokens), (R,) each."""

    def __init__(self, sampling: Sampling, src: Tensor):
        self.s, self.gens = sampling.check(), generators(src, sampling.seed)

    def __call__(self, logits: Tensor, at_max: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
        logp = torch.log_softmax(logits.float(), dim=-1)
        logp[:, PAD] = float("-inf")
        logp[:, BOS] = float("-inf")
        probs = sampling_probs(logp, self.s).cpu()
        tokens = torch.tensor([int(torch.multinomial(p, 1, generator=self.gens[i])) for p, i in
                               zip(probs, active.tolist())], dtype=torch.long, device=logits.device)
        tokens = torch.where(at_max, torch.full_like(tokens, EOS), tokens)
        return logp.gather(1, tokens[:, None])[:, 0], tokens
