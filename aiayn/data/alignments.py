"""Reference word alignments of a prepared split, as subword links and as per-batch targets, for
guided alignment training (Garg et al., 2019; not in the paper: `train.guided_alignment`, off).

The reference is data/ibm.py's aligner (IBM Model 2 with a diagonal prior, both directions,
grow-diag-final-and) run on the split's words; a source and a target subword are linked when their
words are (the words SentencePiece marks with ▁). Deterministic, so a resumed run rebuilds the same.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from .ibm import align as ibm_align
from .tokenizer import word_starts

log = logging.getLogger("aiayn")

Links = tuple[np.ndarray, np.ndarray]  # (N, 2) int32 (source subword, target subword) pairs; offsets (n + 1,)


def subword_links(words: set[tuple[int, int]], src_pieces: list[str], tgt_pieces: list[str]) -> np.ndarray:
    """Word links (i, j) -> every (source subword, target subword) pair of linked words, (k, 2)."""
    s_word, t_word = word_starts(src_pieces), word_starts(tgt_pieces)
    pairs = [(s, t) for s, ws in enumerate(s_word) for t, wt in enumerate(t_word) if (ws, wt) in words]
    return np.array(pairs, dtype=np.int32).reshape(-1, 2)


def reference_links(data, tokenizer) -> Links:
    """The split's reference alignments (data: batches.TokenData), one block of subword links per pair.
    A source's leading tag (`<BT>`, tokenizer.markers) is no word: nothing links to it."""
    start = time.perf_counter()
    src_ids = [data.src(i).tolist() for i in range(len(data))]
    tgt_ids = [data.tgt(i).tolist() for i in range(len(data))]
    markers = getattr(tokenizer, "markers", frozenset())
    lead = [1 if s and s[0] in markers else 0 for s in src_ids]
    src_ids = [s[k:] for s, k in zip(src_ids, lead)]
    words = ibm_align([s.split() for s in tokenizer.decode(src_ids)], [t.split() for t in tokenizer.decode(tgt_ids)])
    per = [subword_links(w, tokenizer.id_to_piece(s), tokenizer.id_to_piece(t)) + np.array([k, 0], np.int32)
           for w, s, t, k in zip(words, src_ids, tgt_ids, lead)]
    offsets = np.cumsum([0] + [len(p) for p in per])
    log.info("reference alignments of %d training pairs (IBM Model 2, grow-diag-final-and): %d subword links in %.0fs",
             len(per), offsets[-1], time.perf_counter() - start)
    return (np.concatenate(per) if per else np.zeros((0, 2), np.int32)), offsets


def alignment_targets(links: Links, indices: np.ndarray, S: int, T: int) -> torch.Tensor:
    """(B, T, S): row t of pair b spreads 1 evenly over the source subwords target subword t is linked
    to (the distribution guided alignment pulls the attention toward); unlinked rows are zeros."""
    flat, offsets = links
    out = np.zeros((len(indices), T, S), dtype=np.float32)
    for b, i in enumerate(indices):
        pairs = flat[offsets[i]:offsets[i + 1]]
        out[b, pairs[:, 1], pairs[:, 0]] = 1.0
    rows = out.sum(-1, keepdims=True)
    np.divide(out, rows, out=out, where=rows > 0)
    return torch.from_numpy(out)
