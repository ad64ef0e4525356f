"""Part-of-speech tags beside the parser's input words (ours, off by default; §6.3 reads words alone).

A treebank of 3.4K trees leaves most words rare, and a Transformer learns word classes from few
examples poorly. An averaged perceptron (NLTK's, trained on the training trees' gold tags) tags
96 % of held-out words right, and its tag joins each source subword's embedding as a second factor
(``model.tag_input``; Sennrich & Haddow 2016's linguistic input features). The training sources
carry jackknifed tags (each tenth tagged by a tagger trained on the other nine), so the model learns
from tags as noisy as those it reads at test time. A checkpoint carries its tagger.
"""

from __future__ import annotations

import io
import json
import logging
import random
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..data.tokenizer import PAD
from ..errors import AiaynError
from ..files import atomic_write, read_bounded

# The Penn Treebank's 45 tags. Id 0 is no tag (padding, end of sentence); any other label is OTHER.
TAGSET = ("#", "$", "''", ",", "-LRB-", "-RRB-", ".", ":", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR",
          "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "PDT", "POS", "PRP", "PRP$", "RB", "RBR", "RBS", "RP",
          "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB", "``")
TAG_ID = {t: i + 1 for i, t in enumerate(TAGSET)}
OTHER = len(TAGSET) + 1
N_TAGS = len(TAGSET) + 2  # the tag embedding's rows
FOLDS = 10


logging.getLogger("nltk.tag.perceptron").setLevel(logging.WARNING)  # not a line per training pass


class TaggerError(AiaynError):
    """A tagger that cannot be built or read; the message says where."""


def _perceptron():
    try:
        from nltk.tag.perceptron import PerceptronTagger
    except ImportError:
        raise TaggerError("part-of-speech tags need NLTK: pip install 'aiayn[parse]' (or pip install nltk)") from None
    return PerceptronTagger(load=False)


class Tagger:
    """NLTK's averaged perceptron, trained here and stored as JSON (no pickle)."""

    def __init__(self, perceptron):
        self.p = perceptron

    @classmethod
    def train(cls, sents: list[list[tuple[str, str]]], iterations: int = 5, seed: int = 1) -> Tagger:
        """Learn from (word, tag) sentences; NLTK shuffles with `random`, seeded here and restored."""
        p, state = _perceptron(), random.getstate()
        random.seed(seed)
        try:
            p.train([list(s) for s in sents], nr_iter=iterations)
        finally:
            random.setstate(state)
        return cls(p)

    def tag(self, words: list[str]) -> list[str]:
        return [t for _, t in self.p.tag(words)] if words else []

    def to_json(self) -> str:
        return json.dumps({"weights": self.p.model.weights, "tagdict": self.p.tagdict,
                           "classes": sorted(self.p.classes)}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, where: str = "<tagger>") -> Tagger:
        try:
            d = json.loads(text)
            p = _perceptron()
            p.model.weights, p.tagdict, p.classes = d["weights"], d["tagdict"], set(d["classes"])
            p.model.classes = p.classes
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise TaggerError(f"{where}: not a tagger ({type(e).__name__}: {e})") from None
        return cls(p)


TAGGER_MAX_BYTES = 1 << 28  # a perceptron tagger of the whole WSJ is tens of MB


def tagger_text(data_dir: Path) -> str:
    """A prepared parse folder's tagger.json, read as untrusted (files.read_bounded): its text, for
    Tagger.from_json and for the checkpoint that carries it."""
    return read_bounded(Path(data_dir) / "tagger.json", TAGGER_MAX_BYTES)


def jackknife(sents: list[list[tuple[str, str]]], folds: int = FOLDS) -> list[list[str]]:
    """Each sentence's tags from a tagger trained on the other folds (sentence i is in fold i % folds)."""
    out: list[list[str]] = [[] for _ in sents]
    for k in range(folds):
        held = [i for i in range(len(sents)) if i % folds == k]
        if not held:
            continue
        tagger = Tagger.train([s for i, s in enumerate(sents) if i % folds != k], seed=k + 1)
        for i in held:
            out[i] = tagger.tag([w for w, _ in sents[i]])
    return out


def subword_tags(pieces: list[str], tags: list[str]) -> list[int]:
    """The tag id of the word each subword belongs to (a piece starting with ▁ starts a word); OTHER
    past the tags (a source cut inside a word)."""
    out, k = [], -1
    for p in pieces:
        k += p.startswith("\u2581")
        out.append(TAG_ID.get(tags[max(k, 0)], OTHER) if max(k, 0) < len(tags) else OTHER)
    return out


def words_of(pieces: list[str]) -> list[str]:
    """The words a source's subwords spell (pieces joined, split at ▁)."""
    return "".join(pieces).replace("\u2581", " ").split()


class SourceTagger:
    """The model's view: source ids (B, S) -> tag ids (B, S), each row's words tagged afresh."""

    def __init__(self, tagger: Tagger, pieces: list[str]):
        self.tagger, self.pieces = tagger, pieces

    def row(self, ids: list[int]) -> list[int]:
        pieces = [self.pieces[i] for i in ids]
        return subword_tags(pieces, self.tagger.tag(words_of(pieces)))

    def __call__(self, src: Tensor) -> Tensor:
        out = torch.zeros(src.shape, dtype=torch.long)
        for b, row in enumerate(src.tolist()):
            ids = [i for i in row if i != PAD][:-1]  # without the end of sentence
            out[b, :len(ids)] = torch.tensor(self.row(ids), dtype=torch.long)
        return out.to(src.device)


def write_tag_arrays(data_dir: Path, tagger: Tagger, known: dict[str, list[str]], pieces: list[str]) -> None:
    """`{split}.src.tag.npy` beside each prepared split's `src.tok.npy`: tag ids per subword, from
    `known` (words -> tags: the jackknifed training tags) where it holds the sentence, else `tagger`."""

    for split in ("train", "valid"):
        tok = np.load(data_dir / f"{split}.src.tok.npy", mmap_mode="r")
        off = np.load(data_dir / f"{split}.src.off.npy")
        tags = np.zeros(len(tok), dtype=np.uint8)
        for i in range(len(off) - 1):
            p = [pieces[j] for j in tok[off[i]:off[i + 1]]]
            words = words_of(p)
            tags[off[i]:off[i + 1]] = subword_tags(p, known.get(" ".join(words)) or tagger.tag(words))
        buf = io.BytesIO()
        np.save(buf, tags)
        atomic_write(data_dir / f"{split}.src.tag.npy", buf.getvalue())
