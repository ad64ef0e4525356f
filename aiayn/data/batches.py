"""Prepared subwords in, token-count batches out (§5.1): "sentence pairs were batched together by
approximate sequence length"; each batch holds about `max_tokens` padded tokens per side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .alignments import Links, alignment_targets
from .mixing import load_corpora
from .text import DataError
from .tokenizer import BOS, EOS, PAD


class TokenData:
    """One prepared split's token ids (memory-mapped), without BOS/EOS; with `tags`, also the
    part-of-speech tag of every source subword (model.tag_input, tagger.py)."""

    def __init__(self, data_dir: Path, split: str, tags: bool = False):
        def arr(side: str, kind: str) -> np.ndarray:
            path = Path(data_dir) / f"{split}.{side}.{kind}.npy"
            if not path.exists():
                if kind == "tag":
                    raise DataError(f"{path} is missing: model.tag_input needs data prepared with tags "
                                    "(`aiayn prepare --task parse --tags`)")
                raise DataError(f"{path} is missing; re-run `aiayn prepare`")
            return np.load(path, mmap_mode="r")

        self.src_tok, self.src_off = arr("src", "tok"), np.asarray(arr("src", "off"))
        self.tgt_tok, self.tgt_off = arr("tgt", "tok"), np.asarray(arr("tgt", "off"))
        self.src_tag = arr("src", "tag") if tags else None
        self.src_lens = np.diff(self.src_off) + 1  # + EOS
        self.tgt_lens = np.diff(self.tgt_off) + 1  # decoder input: BOS + y, output: y + EOS
        self.links: Links | None = None  # reference alignments (alignments.reference_links), guided training
        mixed = Path(data_dir) / f"{split}.direction.npy"  # many directions (data/directions.py): each pair's
        self.directions = np.load(mixed, allow_pickle=False) if mixed.is_file() else None
        if self.directions is not None and self.directions.shape != (len(self.src_lens),):
            raise DataError(f"{mixed}: {self.directions.shape} directions for {len(self.src_lens)} pairs; "
                            "re-run `aiayn prepare`")
        # several weighted corpora (prepare --synthetic, data/mixing.py): each pair's corpus, each corpus's weight
        self.corpora = load_corpora(Path(data_dir), split, len(self.src_lens))
        if self.corpora is not None and self.directions is not None:
            raise DataError(f"{data_dir}: both directions and weighted corpora in one split; re-run `aiayn prepare`")

    def __len__(self) -> int:
        return len(self.src_lens)

    def src(self, i: int) -> np.ndarray:
        return self.src_tok[self.src_off[i]:self.src_off[i + 1]]

    def tags(self, i: int) -> np.ndarray:
        return self.src_tag[self.src_off[i]:self.src_off[i + 1]]  # type: ignore[index]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_tok[self.tgt_off[i]:self.tgt_off[i + 1]]


def make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int, epoch: int,
                 pool: np.ndarray | None = None) -> list[np.ndarray]:
    """§5.1 "batched together by approximate sequence length": shuffle (seed, epoch), sort by
    length, cut into batches of at most `max_tokens` padded tokens per side, shuffle the batches.
    Every pair (of `pool`, the indices to batch, where given) lands in exactly one batch; the result
    depends only on (seed, epoch, pool)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src_lens)) if pool is None else pool[rng.permutation(len(pool))]
    order = order[np.lexsort((src_lens[order], tgt_lens[order]))]  # stable: random tie order
    batches, start, longest = [], 0, 0
    for j, i in enumerate(order):
        longest_j = max(longest, src_lens[i], tgt_lens[i])
        if j > start and longest_j * (j - start + 1) > max_tokens:
            batches.append(order[start:j])
            start, longest_j = j, max(src_lens[i], tgt_lens[i])
        longest = longest_j
    if start < len(order):
        batches.append(order[start:])
    perm = rng.permutation(len(batches))
    return [batches[k] for k in perm]


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) source ids + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) BOS + target ids
    tgt_out: torch.Tensor  # (B, T) target ids + EOS
    n_tokens: int  # non-padding target tokens
    src_tags: torch.Tensor | None = None  # (B, S) part-of-speech tag ids of the source subwords (tagger.py)
    align: torch.Tensor | None = None  # (B, T, S) reference alignment targets (alignments.alignment_targets)

    def to(self, device: torch.device | str) -> Batch:
        tags = None if self.src_tags is None else self.src_tags.to(device, non_blocking=True)
        align = None if self.align is None else self.align.to(device, non_blocking=True)
        return Batch(self.src.to(device, non_blocking=True), self.tgt_in.to(device, non_blocking=True),
                     self.tgt_out.to(device, non_blocking=True), self.n_tokens, tags, align)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """The model's arguments: source, decoder input and, when the data has them, the source tags."""
        return (self.src, self.tgt_in) if self.src_tags is None else (self.src, self.tgt_in, self.src_tags)


def bucket_length(n: int) -> int:
    """The padded length of a bucketed batch (torch.compile's few shapes, `train.compile`): n rounded
    up to a ladder of four lengths per octave (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...; multiples of
    8 from 32), so a padded batch is at most 25 % longer, and lengths up to 256 make 21 shapes."""
    n = int(n)
    if n <= 8:
        return 8
    step = (1 << (n - 1).bit_length()) // 8  # an eighth of the power of two at or above n
    return -(-n // step) * step


def collate(data: TokenData, indices: np.ndarray, bucketed: bool = False) -> Batch:
    """The batch of these pairs, right-padded to its longest sentence per side; `bucketed`: both sides
    to one length of `bucket_length`'s ladder, so a compiled model sees a handful of (S, T) shapes
    (padding changes no result: padded keys are masked and padded targets carry no loss)."""
    B = len(indices)
    S, T = int(data.src_lens[indices].max()), int(data.tgt_lens[indices].max())
    if bucketed:
        S = T = bucket_length(max(S, T))
    src = np.full((B, S), PAD, dtype=np.int64)
    tgt_in = np.full((B, T), PAD, dtype=np.int64)
    tgt_out = np.full((B, T), PAD, dtype=np.int64)
    for b, i in enumerate(indices):
        s, t = data.src(i), data.tgt(i)
        src[b, :len(s)], src[b, len(s)] = s, EOS
        tgt_in[b, 0], tgt_in[b, 1:len(t) + 1] = BOS, t
        tgt_out[b, :len(t)], tgt_out[b, len(t)] = t, EOS
    n = int(data.tgt_lens[indices].sum())
    tags = None
    if data.src_tag is not None:
        tags = np.zeros((B, S), dtype=np.int64)
        for b, i in enumerate(indices):
            t = data.tags(i)
            tags[b, :len(t)] = t
        tags = torch.from_numpy(tags)
    align = None if data.links is None else alignment_targets(data.links, indices, S, T)
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), n, tags, align)
