"""What one epoch draws from a training split of several parts (not in the paper, which trains on
one corpus): directions at a temperature (directions.py), or corpora by weight — genuine pairs and
back-translated ones whose sources carry a `<BT>` tag (Caswell et al. 2019, "Tagged Back-Translation").

A part of weight w and n pairs gives round(w × n) pairs an epoch: w = 2 upsamples it (every pair
twice), w = 0.5 draws half of it, a fresh half each epoch. Draws depend only on (seed, epoch), so a
resumed run draws what an uninterrupted one does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .text import DataError

BT_TAG = "<BT>"  # Caswell et al. (2019): marks a synthetic source; a control piece that text never produces
MAX_WEIGHT = 1000.0  # an epoch of a thousand copies of a corpus is already a mistake


@dataclass(frozen=True)
class TrainingCorpus:
    """One more training corpus of a prepared pair: its files, its weight, and whether its sources are
    synthetic (back-translated: tagged `<BT>` unless `tag` is off)."""

    name: str  # "synthetic1", ...: its part of the train split (train.NAME in the manifest)
    src: Path
    tgt: Path
    weight: float = 1.0
    synthetic: bool = True
    tag: bool = True


def check_weight(weight: float, what: str) -> float:
    """A corpus weight: finite, in [0, MAX_WEIGHT]; else one line naming it."""
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and 0 <= weight <= MAX_WEIGHT):
        raise DataError(f"{what}: a corpus weight is a number in [0, {MAX_WEIGHT:g}] (2: each pair twice an "
                        f"epoch, 0.5: half of them), got {weight!r}")
    return float(weight)


def draw_parts(labels: np.ndarray, want: dict[int, int], rng: np.random.Generator) -> np.ndarray:
    """want[k] pair indices of each part k (`labels`: each pair's part): without replacement as far as
    the part's pairs go, whole fresh permutations repeated beyond."""
    out = []
    for k in sorted(want):
        mine = np.flatnonzero(labels == k)
        q = want[k]
        if q <= 0 or not len(mine):
            continue
        reps = [rng.permutation(mine) for _ in range(math.ceil(q / len(mine)))]
        out.append(np.concatenate(reps)[:q])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def corpus_pool(corpus: np.ndarray, weights: np.ndarray, seed: int, epoch: int) -> np.ndarray | None:
    """The training pairs of one epoch of a split of weighted corpora (see the module's docstring);
    None when every weight is 1 (every pair once, as one corpus)."""
    if len(corpus) == 0 or np.all(weights == 1.0):
        return None
    ids, counts = np.unique(corpus, return_counts=True)
    want = {int(k): int(round(float(weights[k]) * int(n))) for k, n in zip(ids, counts)}
    return draw_parts(corpus, want, np.random.default_rng([seed, epoch, 8]))  # its own stream


def load_corpora(data_dir: Path, split: str, pairs: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A prepared split's corpus of every pair and the corpora's weights (prepare --synthetic), checked
    against its pair count and each other; None for a split of one corpus."""
    path, wpath = Path(data_dir) / f"{split}.corpus.npy", Path(data_dir) / f"{split}.corpus_weights.npy"
    if not path.is_file():
        return None
    fix = "re-run `aiayn prepare`"
    try:
        corpus = np.load(path, allow_pickle=False)
        weights = np.load(wpath, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{path.parent}: unreadable corpus files ({str(e)[:120]}); {fix}") from None
    if corpus.shape != (pairs,) or corpus.dtype.kind not in "iu":
        raise DataError(f"{path}: {corpus.shape} {corpus.dtype} corpus labels for {pairs} pairs; {fix}")
    if weights.ndim != 1 or not len(weights) or weights.dtype.kind != "f":
        raise DataError(f"{wpath}: not a list of corpus weights; {fix}")
    for i, w in enumerate(weights.tolist()):
        check_weight(w, f"{wpath} (corpus {i})")
    if pairs and (corpus.min() < 0 or corpus.max() >= len(weights)):
        raise DataError(f"{path}: a pair's corpus is not one of the {len(weights)} weighted; {fix}")
    if pairs and not (weights[np.unique(corpus)] > 0).any():
        raise DataError(f"{wpath}: every corpus has weight 0: an epoch would hold no pairs; {fix}")
    return corpus, weights
