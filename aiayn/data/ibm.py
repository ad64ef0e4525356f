"""Reference word alignments without an external aligner: IBM Model 2 with fast_align's diagonal
prior (Dyer et al., 2013), trained by EM in both directions and symmetrized (grow-diag-final-and).
A reference to measure the Transformer's cross-attention heads against (§3.2.3's encoder-decoder
attention, `aiayn align`), not part of the paper's model.

    p(a_j = i | j, m, n) ∝ exp(-λ |i/n - j/m|) for source words i, (p0 for the empty word)

Every sentence pair's word pairs are flattened into arrays once, so an EM iteration over Multi30k's
29k pairs is a few numpy passes (no Python loop over words).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NULL_P = 0.08  # fast_align's default probability of the empty word
LAMBDA = 4.0  # fast_align's initial diagonal tension (kept fixed here)


@dataclass
class _Pairs:
    """Every (source word, target word) of every sentence pair, flat: which table cell, which
    target word it explains (a group), and its diagonal prior."""

    cell: np.ndarray  # index into the translation table; -1: the empty word
    group: np.ndarray  # one id per (sentence, target position)
    prior: np.ndarray
    src_pos: np.ndarray
    tgt_pos: np.ndarray
    sent: np.ndarray


def _flatten(src: list[list[str]], tgt: list[list[str]], vocab: dict[tuple[str, str], int]) -> _Pairs:
    cell, group, prior, sp, tp, sent = [], [], [], [], [], []
    g = 0
    for k, (s, t) in enumerate(zip(src, tgt)):
        n, m = len(s), len(t)
        for j, f in enumerate(t):
            weights = np.exp(-LAMBDA * np.abs((np.arange(n) + 0.5) / max(n, 1) - (j + 0.5) / m))
            weights = (1 - NULL_P) * weights / weights.sum() if n else weights
            for i, e in enumerate(s):
                cell.append(vocab.setdefault((e, f), len(vocab)))
                group.append(g), prior.append(weights[i]), sp.append(i), tp.append(j), sent.append(k)
            cell.append(-1), group.append(g), prior.append(NULL_P), sp.append(-1), tp.append(j), sent.append(k)
            g += 1
    return _Pairs(*(np.asarray(x) for x in (cell, group, prior, sp, tp, sent)))


def _em(p: _Pairs, source_of: np.ndarray, iterations: int) -> np.ndarray:
    """EM for t(f | e) (IBM Model 1's table under the diagonal prior); `source_of[c]`: the source
    word of cell c (the empty word: the last cell, its own word). Returns each pair's posterior."""
    n_cells = len(source_of) - 1
    cells = np.where(p.cell < 0, n_cells, p.cell)
    t = np.ones(n_cells + 1)
    post = np.zeros(len(cells))
    for _ in range(iterations):
        score = t[cells] * p.prior
        total = np.zeros(int(p.group.max()) + 1)
        np.add.at(total, p.group, score)
        post = score / total[p.group]
        counts = np.zeros(n_cells + 1)
        np.add.at(counts, cells, post)
        per_word = np.zeros(int(source_of.max()) + 1)
        np.add.at(per_word, source_of, counts)
        t = counts / np.maximum(per_word[source_of], 1e-30)
    return post


def one_way(src: list[list[str]], tgt: list[list[str]], iterations: int = 5) -> list[set[tuple[int, int]]]:
    """Each target word's most probable source word (none where the empty word wins): {(i, j)} per pair."""
    vocab: dict[tuple[str, str], int] = {}
    p = _flatten(src, tgt, vocab)
    words: dict[str, int] = {}
    source_of = np.array([words.setdefault(e, len(words)) for (e, _f) in vocab] + [-1])
    source_of[-1] = len(words)  # the empty word
    post = _em(p, source_of, iterations)
    out: list[set[tuple[int, int]]] = [set() for _ in src]
    order = np.lexsort((-post, p.group))  # within each target word, the most probable source first
    best = order[np.r_[True, p.group[order][1:] != p.group[order][:-1]]]
    for k in best[p.src_pos[best] >= 0]:
        out[p.sent[k]].add((int(p.src_pos[k]), int(p.tgt_pos[k])))
    return out


def symmetrize(forward: set[tuple[int, int]], backward: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """grow-diag-final-and (Koehn et al., 2005): the intersection, grown to neighbours in the union
    that align a so-far unaligned word, then union links whose both words are still unaligned."""
    links, union = forward & backward, forward | backward
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]
    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in neighbours:
                cand = (i + di, j + dj)
                if cand in union and cand not in links and (
                        all(a != cand[0] for a, _ in links) or all(b != cand[1] for _, b in links)):
                    links.add(cand)
                    grown = True
    for cand in sorted(union - links):
        if all(a != cand[0] for a, _ in links) and all(b != cand[1] for _, b in links):
            links.add(cand)
    return links


def align(src: list[list[str]], tgt: list[list[str]], iterations: int = 5) -> list[set[tuple[int, int]]]:
    """Word alignments {(source i, target j)} of each sentence pair: both directions, symmetrized."""
    forward = one_way(src, tgt, iterations)
    backward = [{(i, j) for j, i in links} for links in one_way(tgt, src, iterations)]
    return [symmetrize(f, b) for f, b in zip(forward, backward)]
