"""§6.3 decoding that can only write trees: search's `IncrementalDecoder` around a parser.

At every step each decoder row may choose only what keeps its output a well-formed tree over
exactly the input's words: the next leaf (the next source word's first subword, or XX for the
paper's linearization), then that word's remaining subwords and nothing else; an opening bracket
while words remain; the closing bracket of the innermost open constituent once it holds a leaf
(the outermost one only when the words have run out); end of sentence only when every word is
placed and every bracket closed; at most MAX_OPENS brackets opened in a row. The masks are tensors
over all rows, so the one beam search serves unchanged and a constrained step costs about what a
free one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..checkpoint import read_task
from ..data.tokenizer import BOS, EOS, PAD
from ..decode.translator import Translator
from .model import attach_tagger, build_any, read_tagger
from .trees import LEAF, Tree, TreeError, delinearize, escape, is_bracket, symbols_from_pieces

MAX_DEPTH = 64  # open brackets at once; the sample's trees reach 28
MAX_OPENS = 8  # brackets opened in a row before a leaf; the sample's trees reach 6. With it an output
# has at most 2 * 8 + 1 symbols per word, so a model that loves opening still ends within the length limit.


class TreeSearch(nn.Module):
    """Wraps a parsing model so that search writes trees (see the module docstring). `words`:
    the model writes the source words as leaves (``linearize(..., words=True)``), else XX."""

    def __init__(self, model: nn.Module, tokenizer, words: bool):
        super().__init__()
        self.model, self.cfg, self.words = model, model.cfg, words
        pieces = tokenizer.id_to_piece(list(range(len(tokenizer))))
        syms = [p[1:] if p.startswith("\u2581") and is_bracket(p[1:]) else "" for p in pieces]
        labels = sorted({s[1:] for s in syms if s})
        index = {label: i for i, label in enumerate(labels)}
        close_of = torch.full((len(labels),), -1, dtype=torch.long)
        open_label = torch.full((len(pieces),), -1, dtype=torch.long)
        for i, s in enumerate(syms):
            if s.startswith(")"):
                close_of[index[s[1:]]] = i
        for i, s in enumerate(syms):
            if s.startswith("(") and close_of[index[s[1:]]] >= 0:  # never open what cannot be closed
                open_label[i] = index[s[1:]]
        if not (open_label >= 0).any():
            raise TreeError("the vocabulary holds no bracket symbols such as '(NP' and ')NP': not a parsing model")
        close_label = torch.full((len(pieces),), -1, dtype=torch.long)
        close_label[close_of[close_of >= 0]] = (close_of >= 0).nonzero().squeeze(1)
        starts = torch.tensor([p.startswith("\u2581") for p in pieces])
        starts[[PAD, BOS, EOS]] = False
        for name, t in (("open_label", open_label), ("close_label", close_label), ("close_of", close_of),
                        ("starts_word", starts)):
            self.register_buffer(name, t, persistent=False)
        leaf = tokenizer.encode([LEAF])[0]
        self.leaf = leaf[0] if len(leaf) == 1 else -1
        if not words and self.leaf < 0:
            raise TreeError(f"the vocabulary does not hold {LEAF!r} as one subword: not a parsing model")

    def _leaves(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Per source row, the leaf tokens to write in order (PAD after the last) and whether each starts a word."""
        real = (src != PAD) & (src != EOS)
        if self.words:
            return src.masked_fill(~real, PAD), self.starts_word[src] & real
        n = (self.starts_word[src] & real).sum(1, keepdim=True)
        pos = torch.arange(src.size(1), device=src.device).unsqueeze(0)
        return torch.where(pos < n, self.leaf, PAD), pos < n

    def start_decoding(self, src: Tensor, group: int = 1) -> _TreeState:
        leaves, starts = self._leaves(src)
        R = src.size(0) * group
        z = torch.zeros(R, dtype=torch.long, device=src.device)
        return _TreeState(self.model.start_decoding(src, group), leaves.repeat_interleave(group, 0),
                          starts.repeat_interleave(group, 0), (leaves != PAD).sum(1).repeat_interleave(group),
                          z, z.clone(), z.clone(), torch.zeros(R, MAX_DEPTH, dtype=torch.long, device=src.device),
                          torch.zeros(R, MAX_DEPTH, dtype=torch.bool, device=src.device))

    def _advance(self, tokens: Tensor, s: _TreeState) -> None:
        """Apply the token each row has just written to its stack and word position. A beam search
        row whose score is already -inf may be fed a forbidden token; bounds keep it harmless."""
        rows = torch.arange(tokens.numel(), device=tokens.device)
        opened, closed = self.open_label[tokens], self.close_label[tokens]
        is_open, is_close = opened >= 0, closed >= 0
        is_leaf = ~is_open & ~is_close & (tokens != BOS) & (tokens != PAD) & (tokens != EOS)
        at = s.depth.clamp(max=MAX_DEPTH - 1)
        s.stack[rows, at] = torch.where(is_open, opened, s.stack[rows, at])
        s.filled[rows, at] &= ~is_open
        s.depth = (s.depth + is_open.long() - is_close.long()).clamp(0, MAX_DEPTH - 1)
        s.filled |= is_leaf.unsqueeze(1) & (torch.arange(MAX_DEPTH, device=tokens.device) < s.depth.unsqueeze(1))
        s.pos += is_leaf.long()
        s.opens = torch.where(is_leaf, 0, s.opens + is_open.long())

    def allowed(self, s: _TreeState) -> Tensor:
        """(R, V) bool: what each row may write next."""
        R, dev = s.pos.numel(), s.pos.device
        rows = torch.arange(R, device=dev)
        at = s.pos.clamp(max=s.leaves.size(1) - 1)
        nxt, starts = s.leaves[rows, at], s.starts[rows, at]
        left = s.pos < s.n
        mid_word = left & ~starts & (s.pos > 0)
        top = (s.depth - 1).clamp(min=0)
        can_close = ~mid_word & (s.depth > 0) & s.filled[rows, top] & (~left | (s.depth > 1))
        out = torch.zeros(R, self.open_label.numel(), dtype=torch.bool, device=dev)
        can_open = left & ~mid_word & (s.depth < MAX_DEPTH - 1) & (s.opens < MAX_OPENS)
        out |= (self.open_label >= 0).unsqueeze(0) & can_open.unsqueeze(1)
        out[rows, nxt] |= left & (s.depth > 0)
        out[rows, self.close_of[s.stack[rows, top]]] |= can_close
        out[:, EOS] = ~left & (s.depth == 0)
        out[:, PAD] = False
        out[:, EOS] |= ~out.any(1)  # only a dead beam row (score -inf) gets here: no all -inf row, no NaN
        return out

    def decode_step(self, tokens: Tensor, state: _TreeState) -> Tensor:
        self._advance(tokens, state)
        logits = self.model.decode_step(tokens, state.inner)
        return logits.masked_fill(~self.allowed(state), float("-inf"))


@dataclass
class _TreeState:
    inner: object
    leaves: Tensor  # (R, W) leaf tokens to write, in order
    starts: Tensor  # (R, W) whether each starts a word
    n: Tensor  # (R,) leaf tokens in all
    pos: Tensor  # (R,) leaf tokens written
    depth: Tensor  # (R,) open brackets
    opens: Tensor  # (R,) brackets opened since the last leaf
    stack: Tensor  # (R, MAX_DEPTH) label of each open bracket
    filled: Tensor  # (R, MAX_DEPTH) whether each open bracket holds a leaf yet

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        self.inner.reorder(rows, sources)  # type: ignore[attr-defined]
        for name in ("leaves", "starts", "n", "pos", "depth", "opens", "stack", "filled"):
            setattr(self, name, getattr(self, name).index_select(0, rows))


class Parser:
    """§6.3 from Python: ``Parser.load("parse.safetensors").parse(["The dog runs ."])`` gives one
    well-formed tree per line (None for an empty one), over exactly the line's words (with `(` and `)`
    spelled -LRB- and -RRB-, as in the treebank)."""

    def __init__(self, translator, words: bool, free: bool = False, tagger=None):
        self.translator, self.tagger = translator, tagger  # tags the trees' leaves (else XX)
        if not free:
            translator.model = TreeSearch(translator.model, translator.tokenizer, words).eval()

    @classmethod
    def load(cls, path: str | Path | list[str | Path], device: str | None = None, free: bool = False,
             **decode) -> Parser:
        """A parsing checkpoint (its metadata names the task), or several trained on the same data as
        an ensemble (ensemble.py); a translation model is refused."""

        paths = [path] if isinstance(path, (str, Path)) else list(path)
        tasks = [read_task(Path(p)) for p in paths]
        for p, task in zip(paths, tasks):
            if task.get("task") != "parse":
                raise TreeError(f"{p}: not a parsing model (its metadata names the task {task['task']!r}); "
                                "train one on data from `aiayn prepare --task parse`")
            if task.get("linearization") != tasks[0].get("linearization"):
                raise TreeError(f"{p}: its trees are linearized as {task.get('linearization')!r}, {paths[0]}'s as "
                                f"{tasks[0].get('linearization')!r}: an ensemble's parsers must share one")
        t = Translator.load(paths, device=device, build=build_any, **decode)
        members = getattr(t.model, "members", [t.model])
        taggers = [read_tagger(p) if m.cfg.tag_input else None for p, m in zip(paths, members)]
        for m, tagger in zip(members, taggers):
            if tagger is not None:  # a model.tag_input parser tags its words with the tagger it carries
                attach_tagger(m, tagger, t.tokenizer)
        t.model = t.model  # what search runs (a converted copy, say) is made again, with the taggers
        tagger = next((x for x in taggers if x is not None), None)
        return cls(t, tasks[0].get("linearization") == "words", free, tagger)

    def parse(self, lines: list[str], beam: int | None = None, alpha: float | None = None,
              progress: bool = False) -> list[Tree | None]:
        t = self.translator
        lines = [" ".join(escape(w) for w in line.split()) for line in lines]  # words as the treebank spells them
        hyps = t.translate_ids(t.encode_sources(lines), beam, alpha, 1, progress)
        return [delinearize(symbols_from_pieces(t.tokenizer.id_to_piece(h[0].tokens) if h else []), line.split(),
                            self.tagger.tag(line.split()) if self.tagger else None)
                if line.split() else None for h, line in zip(hyps, lines)]
