"""§6.3 options (ours; off by default): the decoder knows which source word comes next, and how
many brackets are open.

For parsers whose trees hold the words as leaves (``parse.linearize(words=True)``), every decoder
input also carries the encoder's state of the next source subword still to be written (the EOS
position once all are placed), through one learned projection. A written token is a leaf when
it is that next subword, so the pointer moves exactly as the tree's leaves are written, in
training (teacher forcing) as in search. The model then decides only the brackets around words
it already knows, as a transition-based parser does with its buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..data.tokenizer import PAD
from .trees import is_bracket


def _last(src: Tensor) -> Tensor:
    """(B,) index of each source's last real position (its EOS)."""
    return ((src != PAD).sum(1) - 1).clamp(min=0)


def _advance(pos: Tensor, tokens: Tensor, src: Tensor, last: Tensor) -> Tensor:
    """Past the next subword where `tokens` is it (a bracket never is: brackets occur in no source)."""
    rows = torch.arange(tokens.numel(), device=tokens.device)
    return torch.minimum(pos + (tokens == src[rows, pos]).long(), last)


def next_positions(src: Tensor, tgt_in: Tensor) -> Tensor:
    """(B, T): for each decoder input, the source position of the next subword to write."""
    last = _last(src)
    pos = torch.zeros(src.size(0), dtype=torch.long, device=src.device)
    out = []
    for t in range(tgt_in.size(1)):
        pos = _advance(pos, tgt_in[:, t], src, last)
        out.append(pos)
    return torch.stack(out, 1)


def gather(states: Tensor, pos: Tensor) -> Tensor:
    """states (B, S, d), pos (B, T) -> (B, T, d)."""
    return states.gather(1, pos.unsqueeze(2).expand(-1, -1, states.size(2)))


@dataclass
class PointerState:
    """Per decoder row: the projected encoder states, the source and the next position."""

    states: Tensor  # (R, S, d)
    src: Tensor  # (R, S)
    pos: Tensor  # (R,)
    last: Tensor  # (R,) each row's EOS position

    @classmethod
    def start(cls, states: Tensor, src: Tensor, group: int) -> PointerState:
        src = src.repeat_interleave(group, 0)
        return cls(states.repeat_interleave(group, 0), src,
                   torch.zeros(src.size(0), dtype=torch.long, device=src.device), _last(src))

    def step(self, tokens: Tensor) -> Tensor:
        """Move past `tokens` where they are the next subword; (R, 1, d) states of the next one."""
        self.pos = _advance(self.pos, tokens, self.src, self.last)
        return self.states[torch.arange(tokens.numel(), device=tokens.device), self.pos].unsqueeze(1)

    def reorder(self, rows: Tensor) -> None:
        self.states, self.src, self.pos, self.last = (
            t.index_select(0, rows) for t in (self.states, self.src, self.pos, self.last))


# -- bracket depth (model.depth_input) ---------------------------------------------------------------
MAX_DEPTH = 64  # deeper nesting shares the last embedding; treebank trees stay under 40


def bracket_deltas(pieces: list[str]) -> Tensor:
    """(V,) +1 for each opening-bracket piece (`▁(NP`), -1 for each closing one (`▁)NP`), else 0: the
    pieces tree search reads as brackets (treesearch.py)."""
    sym = [p[1:] if p.startswith("\u2581") and is_bracket(p[1:]) else "" for p in pieces]
    return torch.tensor([(s[:1] == "(") - (s[:1] == ")") for s in sym], dtype=torch.float32)


class BracketDepth(nn.Module):
    """§6.3 option (ours; off by default): every decoder input also carries how many brackets are open
    once it is written, as a learned embedding (scaled by √d_model like the tokens', §3.4): a
    Transformer finds counting hard, and closing the right brackets late in a long tree needs it.
    Measured on the treebank sample: lower validation NLL, but F1 3 points lower (docs/reproduction.md).
    `delta` (a buffer saved with the weights) marks the vocabulary's brackets; the trainer fills it."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(MAX_DEPTH, d_model)
        self.scale = math.sqrt(d_model)
        self.register_buffer("delta", torch.zeros(vocab_size))

    def _at(self, depth: Tensor) -> Tensor:
        return self.embed(depth.long().clamp(0, MAX_DEPTH - 1)) * self.scale

    def forward(self, tgt_in: Tensor) -> Tensor:
        """(B, T) decoder inputs -> (B, T, d): the depth after each input."""
        return self._at(self.delta[tgt_in].cumsum(1))

    def start(self, rows: int) -> DepthState:
        return DepthState(self, torch.zeros(rows, device=self.delta.device))


@dataclass
class DepthState:
    """Per decoder row: the number of open brackets so far (incremental decoding)."""

    owner: BracketDepth
    depth: Tensor  # (R,)

    def step(self, tokens: Tensor) -> Tensor:
        """Count `tokens`' brackets; (R, 1, d) embeddings of the new depths."""
        self.depth = self.depth + self.owner.delta[tokens]
        return self.owner._at(self.depth).unsqueeze(1)

    def reorder(self, rows: Tensor) -> None:
        self.depth = self.depth.index_select(0, rows)
