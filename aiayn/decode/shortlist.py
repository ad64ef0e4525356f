"""A target-vocabulary shortlist for decoding: an addition to the paper (§6.1 searches the whole vocabulary).

For each sentence, the output layer and the softmax run only over target subwords the sentence
can plausibly need: the `frequent` most frequent target subwords of the training data, and for
each of its source subwords the `per_source` target subwords that co-occur with it most in the
training pairs, ranked by the Dice coefficient 2·c(s, t) / (c(s) + c(t)) over sentence pairs
(Marian's lexical shortlists take theirs from word alignments; CTranslate2's vocabulary map is a
table of the same kind). A batch computes the union of its sentences' columns once, and each row
is normalized over its own sentence's set only, so a sentence translates the same in any batch.
Off by default: `aiayn shortlist` builds the table, `--shortlist FILE` uses it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save
from torch import Tensor

from ..data.prepare import load_manifest
from ..data.tokenizer import EOS, read_tokenizer
from ..errors import AiaynError
from ..files import atomic_write
from .search import Hypothesis

SPECIALS = 4  # PAD, UNK, BOS, EOS: ids 0-3, always columns 0-3, so search's ids for them hold
MAX_PER_SOURCE = 1024  # the table is vocabulary x per-source ids: 37k x 1,024 int64 is 300 MB (Marian's default: 100)


class ShortlistError(AiaynError):
    """A missing, corrupt or foreign shortlist file; the message names it."""


def vocabulary_id(proto: bytes) -> str:
    """The SentencePiece model a shortlist was built for (its sha256)."""
    return hashlib.sha256(proto).hexdigest()


class Shortlist:
    """table (V, per_source): the target subwords kept for each source subword (EOS pads short
    rows); frequent (N,): kept for every sentence."""

    def __init__(self, table: Tensor, frequent: Tensor, vocab: str):
        self.table, self.frequent, self.vocab = table.long(), frequent.long(), vocab

    def columns(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> the batch's columns (C,) in increasing order (ids 0-3 first) and, for each
        source, which of them are its own (B, C)."""
        B, V = src.size(0), self.table.size(0)
        own = torch.zeros(B, V, dtype=torch.bool, device=src.device)
        own.scatter_(1, self.table.to(src.device)[src].view(B, -1), True)
        own[:, self.frequent.to(src.device)] = True
        own[:, :SPECIALS] = True
        cols = own.any(0).nonzero().squeeze(1)
        return cols, own[:, cols]

    def save(self, path: Path) -> None:
        """Atomically, as safetensors (no pickles), with the vocabulary's sha256 in the metadata."""
        tensors = {"table": self.table.to(torch.int32).numpy(), "frequent": self.frequent.to(torch.int32).numpy()}
        data = save(tensors, metadata={"aiayn_shortlist": json.dumps({"vocab_sha256": self.vocab})})
        atomic_write(Path(path), data)

    @classmethod
    def load(cls, path: Path, proto: bytes | None = None) -> Shortlist:
        """Read a shortlist; with `proto`, refuse one built for another vocabulary."""
        path = Path(path)
        if not path.is_file():
            raise ShortlistError(f"{path}: no such shortlist file (make one with `aiayn shortlist`)")
        try:
            with safe_open(str(path), "np") as f:
                meta = json.loads((f.metadata() or {}).get("aiayn_shortlist", "null"))
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise ShortlistError(f"{path}: not a shortlist file ({e})") from None
        if not isinstance(meta, dict) or not {"table", "frequent"} <= set(tensors):
            raise ShortlistError(f"{path}: not a shortlist file (no aiayn_shortlist metadata or tables)")
        if proto is not None and meta.get("vocab_sha256") != vocabulary_id(proto):
            raise ShortlistError(f"{path}: built for another vocabulary than the checkpoint's")
        table, frequent = tensors["table"], tensors["frequent"]
        ids = all(x.dtype.kind in "iu" and (x.size == 0 or 0 <= x.min() <= x.max() < len(table))
                  for x in (table, frequent))
        if table.ndim != 2 or frequent.ndim != 1 or not ids:
            raise ShortlistError(f"{path}: corrupt (the tables are not ids of its {len(table)}-entry vocabulary)")
        return cls(torch.from_numpy(table), torch.from_numpy(frequent), meta["vocab_sha256"])


def _pairs(data_dir: Path, split: str = "train", max_pairs: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The split's source and target subword sequences (data/prepare.py's flat arrays + offsets); with
    max_pairs, every k-th pair so that at most max_pairs are read (spread over the whole corpus)."""
    def side(name: str) -> list[np.ndarray]:
        tok, off = np.load(data_dir / f"{split}.{name}.tok.npy"), np.load(data_dir / f"{split}.{name}.off.npy")
        stride = -(-len(off) // max_pairs) if max_pairs else 1
        ends = np.append(off[1:], len(tok))
        return [tok[a:b] for a, b in zip(off[::stride], ends[::stride])]
    return side("src"), side("tgt")


def cooccurrence(src: list[np.ndarray], tgt: list[np.ndarray], V: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sentence-pair co-occurrence: pairs (M, 2) of (source id, target id), the number of pairs
    holding both (M,), and the number holding each source id and each target id (V,) each."""
    keys, counts, empty = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    for i in range(0, len(src), 20_000):  # blocks merged as they come: memory follows distinct pairs
        block = [(np.unique(s).astype(np.int64)[:, None] * V + np.unique(t)[None, :]).ravel()
                 for s, t in zip(src[i:i + 20_000], tgt[i:i + 20_000])]
        k, c = np.unique(np.concatenate(block + [empty]), return_counts=True)
        keys, inv = np.unique(np.concatenate([keys, k]), return_inverse=True)
        counts = np.bincount(inv, weights=np.concatenate([counts, c]), minlength=len(keys)).astype(np.int64)

    def df(side: list[np.ndarray]) -> np.ndarray:
        return np.bincount(np.concatenate([np.unique(x) for x in side] + [empty]), minlength=V)
    return np.stack([keys // V, keys % V], 1), counts, df(src), df(tgt)


def build(data_dir: Path, per_source: int = 100, frequent: int = 200, max_pairs: int = 1_000_000) -> Shortlist:
    """The shortlist of prepared data's training pairs (`aiayn prepare`'s folder), in its vocabulary;
    from at most `max_pairs` of them, evenly spread (0: all)."""

    data_dir = Path(data_dir)
    load_manifest(data_dir)
    if not 1 <= per_source <= MAX_PER_SOURCE or frequent < 0 or max_pairs < 0:
        raise ValueError(f"per_source must be in [1, {MAX_PER_SOURCE}], frequent and max_pairs >= 0, got "
                         f"{per_source}, {frequent}, {max_pairs}")
    proto = (data_dir / "spm.model").read_bytes()
    V = len(read_tokenizer(proto))
    per_source = min(per_source, V)  # a list longer than the vocabulary has nothing more to keep
    src, tgt = _pairs(data_dir, max_pairs=max_pairs)
    pairs, both, src_df, tgt_df = cooccurrence(src, tgt, V)
    s, t = pairs[:, 0], pairs[:, 1]
    dice = 2 * both / (src_df[s] + tgt_df[t])
    order = np.lexsort((t, -dice, s))  # by source id, best first, ties by target id
    s, t = s[order], t[order]
    rank = np.arange(len(s)) - np.searchsorted(s, s)  # place within its source's list
    keep = rank < per_source
    table = np.full((V, per_source), EOS, dtype=np.int64)
    table[s[keep], rank[keep]] = t[keep]
    freq = np.bincount(np.concatenate(tgt + [np.zeros(0, np.int64)]), minlength=V)
    top = np.argsort(-freq, kind="stable")[:frequent]
    return Shortlist(torch.from_numpy(table), torch.from_numpy(top.astype(np.int64)), vocabulary_id(proto))


class ShortlistDecoder:
    """`IncrementalDecoder` (search.py) over one batch's columns: a fusedstep.FusedDecoder's
    hidden state times the output layer's rows `cols`; every other column of a row's own sentence
    is -inf. Search sees column numbers (ids 0-3 keep theirs); `full_ids` maps results back."""

    def __init__(self, fused, cols: Tensor, own: Tensor):
        self.fused, self.cols, self.blocked = fused, cols, ~own
        self.out = fused.output_rows(cols)

    def start_decoding(self, src: Tensor, group: int = 1) -> _State:
        return _State(self.fused.start_decoding(src, group), self.blocked, group)

    def decode_step(self, tokens: Tensor, state: _State) -> Tensor:
        x = self.fused.decode_hidden(self.cols[tokens], state.inner)
        return self.fused.project(x, self.out).masked_fill_(state.rows, float("-inf"))

    def full_ids(self, hyps: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
        cols = self.cols.tolist()
        return [[Hypothesis([cols[i] for i in h.tokens], h.score) for h in hs] for hs in hyps]


class _State:
    """The fused decoder's state and the blocked columns of each decoder row."""

    def __init__(self, inner, blocked: Tensor, group: int):
        self.inner, self.blocked, self.group = inner, blocked, group
        self.rows = blocked.repeat_interleave(group, 0)

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        self.inner.reorder(rows, sources)
        if sources is not None:
            self.blocked = self.blocked.index_select(0, sources)
            self.rows = self.blocked.repeat_interleave(self.group, 0)
