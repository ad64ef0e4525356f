"""The two passes over one split of parallel text (§5.1's data), and splits joined from parts.

Pass 1 (`clean_split`) streams a split's valid pairs into clean files; pass 2 (`encode_split`)
encodes them in chunks into flat int32 arrays with offsets, as batches.TokenData reads them;
`concatenate_split` joins parts (directions, corpora) into one split.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .text import iter_pairs
from .tokenizer import Tokenizer

_CHUNK = 20_000  # pairs encoded at a time: memory stays flat whatever the corpus size


def peak_gb() -> float:
    """This process's peak resident memory so far, in GB (0 where the platform does not say)."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    except (ImportError, OSError):
        return 0.0


def _pair_hash(s: str, t: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{s}\n{t}".encode(), digest_size=8).digest(), "little")


def clean_split(src: Path, tgt: Path, folder: Path, name: str, strict: bool, dedup: bool
                 ) -> tuple[dict, np.ndarray | None]:
    """Pass 1: stream a split's valid pairs to folder/NAME.src and NAME.tgt, one clean line each.
    Returns its counts and, with `dedup`, the mask of pairs seen for the first time (8 bytes of
    hash per pair in memory, not the text)."""
    counts: dict = {}
    hashes = array("Q")
    n = 0
    with open(folder / f"{name}.src", "w", encoding="utf-8", newline="\n") as fs, \
            open(folder / f"{name}.tgt", "w", encoding="utf-8", newline="\n") as ft:
        for s, t in tqdm(iter_pairs(src, tgt, strict, counts), desc=f"reading {name}", unit=" pairs",
                         disable=None, leave=False):
            fs.write(s + "\n")
            ft.write(t + "\n")
            n += 1
            if dedup:
                hashes.append(_pair_hash(s, t))
    counts = {"pairs_in": n + counts["dropped_empty"], "dropped_empty": counts["dropped_empty"]}
    if not dedup:
        return counts, None
    h = np.frombuffer(hashes, dtype=np.uint64)
    _, first = np.unique(h, return_index=True)
    keep = np.zeros(len(h), dtype=bool)
    keep[first] = True
    counts["dropped_duplicate"] = int(len(h) - len(first))
    return counts, keep


def _read_clean(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line[:-1]


def kept_lines(path: Path, keep: np.ndarray | None) -> Iterator[str]:
    lines = _read_clean(path)
    return lines if keep is None else (x for x, k in zip(lines, keep) if k)


def _chunks(folder: Path, name: str, keep: np.ndarray | None) -> Iterator[tuple[list[str], list[str]]]:
    src, tgt = kept_lines(folder / f"{name}.src", keep), kept_lines(folder / f"{name}.tgt", keep)
    while True:
        s = list(itertools.islice(src, _CHUNK))
        if not s:
            return
        yield s, list(itertools.islice(tgt, len(s)))


def _save_npy(path: Path, raw: Path, n: int, dtype: type = np.int32) -> None:
    """A .npy file of n values from a raw file, copied in blocks (never whole in memory)."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (n,)}
    with open(path, "wb") as f, open(raw, "rb") as r:
        np.lib.format.write_array_header_1_0(f, header)
        shutil.copyfileobj(r, f, 1 << 22)


_CHARS_PER_SUBWORD = 1024  # far above SentencePiece's longest piece (16 characters)


def encode_split(tok: Tokenizer, folder: Path, name: str, keep: np.ndarray | None, out: Path, max_len: int,
                 max_ratio: float, threads: int, prefix: tuple[int, ...] = ()) -> dict:
    """Pass 2: encode a split in chunks with `threads` threads, drop pairs too long for max_len
    (+ EOS, + BOS/EOS) and, with max_ratio, pairs whose lengths differ more than that factor;
    write the ids as flat int32 arrays with int64 offsets, as TokenData reads them. `prefix`: ids
    in front of every source (a target-language tag, data/directions.py)."""
    counts = {"dropped_too_long": 0, **({"dropped_ratio": 0} if max_ratio else {})}
    sides = ("src", "tgt")
    raws = {(side, kind): folder / f"{name}.{side}.{kind}.raw" for side in sides for kind in ("tok", "off")}
    files = {key: open(path, "wb") for key, path in raws.items()}
    ends = {side: 0 for side in sides}  # tokens written so far: offsets are written as they come
    pairs = 0
    try:
        for side in sides:
            np.zeros(1, dtype=np.int64).tofile(files[side, "off"])
        total = int(keep.sum()) if keep is not None else None
        with tqdm(total=total, desc=f"encoding {name}", unit=" pairs", disable=None, leave=False) as bar:
            for s_lines, t_lines in _chunks(folder, name, keep):
                # A line of over _CHARS_PER_SUBWORD x max_len characters has more than max_len subwords
                # (short of pages of blanks): dropped unencoded (a 100 MB line took 5 GB to encode).
                huge = np.array([max(len(a), len(b)) > _CHARS_PER_SUBWORD * max_len
                                 for a, b in zip(s_lines, t_lines)], dtype=bool)
                if huge.any():
                    s_lines = ["" if h else x for x, h in zip(s_lines, huge)]
                    t_lines = ["" if h else x for x, h in zip(t_lines, huge)]
                s_ids = tok.encode(s_lines, threads)
                if prefix:
                    s_ids = [list(prefix) + x if x else x for x in s_ids]
                t_ids = tok.encode_target(t_lines, threads)
                ls = np.fromiter(map(len, s_ids), dtype=np.int64, count=len(s_ids))
                lt = np.fromiter(map(len, t_ids), dtype=np.int64, count=len(t_ids))
                ok = (ls + 1 <= max_len) & (lt + 2 <= max_len) & ~huge
                counts["dropped_too_long"] += int((~ok).sum())
                if max_ratio:
                    wild = ok & (np.maximum(ls, lt) > max_ratio * np.maximum(np.minimum(ls, lt), 1))
                    counts["dropped_ratio"] += int(wild.sum())
                    ok &= ~wild
                for ids, n, side in ((s_ids, ls, "src"), (t_ids, lt, "tgt")):
                    flat = itertools.chain.from_iterable(x for x, k in zip(ids, ok) if k)
                    np.fromiter(flat, dtype=np.int32, count=int(n[ok].sum())).tofile(files[side, "tok"])
                    ends_here = ends[side] + np.cumsum(n[ok])
                    ends_here.tofile(files[side, "off"])
                    ends[side] = int(ends_here[-1]) if len(ends_here) else ends[side]
                pairs += int(ok.sum())
                bar.update(len(s_lines))
    finally:
        for f in files.values():
            f.close()
    for side in sides:
        _save_npy(out / f"{name}.{side}.tok.npy", raws[side, "tok"], ends[side])
        _save_npy(out / f"{name}.{side}.off.npy", raws[side, "off"], pairs + 1, np.int64)
        raws[side, "tok"].unlink()
        raws[side, "off"].unlink()
        counts[f"{side}_tokens"] = ends[side]
    counts["pairs"] = pairs
    return counts




def concatenate_split(folder: Path, name: str, parts: list[str]) -> None:
    """One split's token arrays from those of its parts (each direction's), offsets shifted, in
    blocks; the parts' files removed."""
    for side in ("src", "tgt"):
        offs = [np.load(folder / f"{p}.{side}.off.npy", mmap_mode="r") for p in parts]
        toks = [np.load(folder / f"{p}.{side}.tok.npy", mmap_mode="r") for p in parts]
        n_tok, n_pairs = sum(len(t) for t in toks), sum(len(o) - 1 for o in offs)
        tok_out = np.lib.format.open_memmap(folder / f"{name}.{side}.tok.npy", "w+", np.int32, (n_tok,))
        off_out = np.lib.format.open_memmap(folder / f"{name}.{side}.off.npy", "w+", np.int64, (n_pairs + 1,))
        off_out[0], at, pairs = 0, 0, 0
        for t, o in zip(toks, offs):
            for a in range(0, len(t), 1 << 22):
                tok_out[at + a:at + min(len(t), a + (1 << 22))] = t[a:a + (1 << 22)]
            off_out[pairs + 1:pairs + len(o)] = np.asarray(o[1:]) + at
            at, pairs = at + len(t), pairs + len(o) - 1
        tok_out.flush()
        off_out.flush()
        del tok_out, off_out, offs, toks
        for p in parts:
            for kind in ("tok", "off"):
                (folder / f"{p}.{side}.{kind}.npy").unlink()


def part_of_pairs(counts: list[int]) -> np.ndarray:
    """The part (a direction, a corpus) of every pair of a concatenated split, from each part's pair count."""
    return np.fromiter(itertools.chain.from_iterable(itertools.repeat(k, n) for k, n in enumerate(counts)),
                       dtype=np.int16, count=sum(counts))
