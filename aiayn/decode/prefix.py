"""A target prefix the output must start with (not in the paper): interactive completion, or
re-translating with a stable start. The search is forced through each sentence's prefix, then goes
on as §6.1's search does; the score counts the continuation only (the forced tokens are certain).
"""

from __future__ import annotations

import torch
from torch import Tensor


class PrefixDecoder:
    """`IncrementalDecoder` (search.py) forcing each sentence's first tokens: while a row is inside
    its sentence's prefix, every next token but the prefix's is -inf (the prefix's gets log-probability
    0 after the search's softmax); past it the model's own logits."""

    def __init__(self, model, prefixes: list[list[int]]):
        self.model = model
        width = max((len(p) for p in prefixes), default=0)
        self.table = torch.full((len(prefixes), max(width, 1)), -1, dtype=torch.long)
        for i, p in enumerate(prefixes):
            self.table[i, :len(p)] = torch.tensor(p, dtype=torch.long)
        self.width = width

    def start_decoding(self, src: Tensor, group: int = 1) -> _State:
        return _State(self.model.start_decoding(src, group), self.table.to(src.device), group)

    def decode_step(self, tokens: Tensor, state: _State) -> Tensor:
        logits = self.model.decode_step(tokens, state.inner)
        t, state.t = state.t, state.t + 1
        if t >= self.width:
            return logits
        forced = state.rows[:, t]  # (R,): the token row r must take now, -1 where its prefix is over
        inside = forced >= 0
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep[inside, forced[inside]] = True
        return logits.masked_fill(inside[:, None] & ~keep, float("-inf"))

    def __getattr__(self, name: str):  # the wrapped decoder's other parts (an alignment head, options)
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)


class _State:
    """The wrapped decoder's state, the step, and each decoder row's prefix."""

    def __init__(self, inner, table: Tensor, group: int):
        self.inner, self.table, self.group, self.t = inner, table, group, 0
        self.rows = table.repeat_interleave(group, 0)

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        self.inner.reorder(rows, sources)
        if sources is not None:  # beams reorder within their sentence; a new set of sentences takes their prefixes
            self.table = self.table.index_select(0, sources)
            self.rows = self.table.repeat_interleave(self.group, 0)

    def __getattr__(self, name: str):  # attended, not_word ... of the inner state
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def check_prefixes(prefixes: list[list[int]], ids: list[list[int]], max_len_a: float, max_len_b: int,
                   shortlist: bool) -> None:
    """One prefix per source (ids with EOS), each shorter than the longest output §6.1 allows it
    (max_len_a x source + max_len_b); not with a shortlist (its columns are not the vocabulary's)."""
    if shortlist and any(prefixes):
        raise ValueError("a target prefix is not for a shortlist's columns: translate without --shortlist")
    if len(prefixes) != len(ids):
        raise ValueError(f"{len(prefixes)} prefixes for {len(ids)} sources")
    for n, (p, x) in enumerate(zip(prefixes, ids), 1):
        if p and len(p) >= int(max_len_a * max(len(x) - 1, 0) + max_len_b):
            raise ValueError(f"prefix {n} has {len(p)} subwords; its output may have fewer "
                             f"(decode.max_len_a x source + decode.max_len_b)")
