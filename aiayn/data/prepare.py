"""Parallel text in, checked and cached subwords out (§5.1).

`prepare` reads aligned files (plain or .gz), validates them (line counts, UTF-8, empty lines,
length), normalizes to NFC, learns the joint BPE vocabulary and writes every split once as
flat int32 arrays + offsets with a manifest, which batches.py reads.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..files import FileError, atomic_write, check_output_folder, digest, lock_data, new_folder, owned, read_json
from .text import DataError, iter_pairs, read_lines
from .tokenizer import SplitTokenizer, Tokenizer, read_tokenizer

log = logging.getLogger("aiayn")
FORMAT_VERSION = 1

# -- the prepared cache --------------------------------------------------------------------
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


PREPARED = "prepare"  # the kind in a prepared folder's marker (files.MARKER): only such a folder is replaced


def check_prepared_output(out: str | Path) -> Path:
    """`prepare -o`, before any work: new, empty, or a prepared folder. One with a manifest.json but
    no marker (an older aiayn's) may be reused if its inputs are unchanged, never replaced."""
    out = Path(os.path.abspath(out))
    if (out / "manifest.json").is_file() and not owned(out, PREPARED):
        return out  # prepare() reuses it or new_folder refuses it, before the vocabulary is learned
    return check_output_folder(out, PREPARED)


def _old_manifest(path: Path) -> dict | None:
    try:
        return read_json(path)
    except FileError as e:  # unreadable, too big, not a JSON object
        log.warning("%s; preparing anew", e)
        return None


@dataclass
class Task:
    """What a prepared folder is for beyond translation, from the stage that knows (§6.3's parsing:
    parsing/treebank_data.py). The default is plain translation."""

    settings: dict[str, str] = field(default_factory=dict)  # into the manifest; checkpoints carry them
    symbols: tuple[str, ...] = ()  # pieces the vocabulary keeps whole (a tree's brackets)
    carry: Path | None = None  # a folder whose contents are copied into the cache (raw words, gold trees)
    on_build: Callable[[], None] | None = None  # called once before they are, only when the cache is built


def prepare(
    splits: dict[str, tuple[str | Path, str | Path]], out: str | Path, src_lang: str, tgt_lang: str,
    vocab_size: int = 0, max_len: int = 256, strict: bool = False, seed: int = 1,
    dedup: bool = True, max_ratio: float = 3.0, task: Task | None = None, vocabulary: bytes | None = None,
) -> dict:
    """Validate, learn the joint vocabulary on train, and cache every split, in bounded memory.

    splits maps "train", "valid" and test names to (source file, target file). The text is read
    as a stream into clean temporary files (pass 1: UTF-8, alignment, empty lines, NFC; repeated
    training pairs dropped with `dedup`), SentencePiece learns the vocabulary on a sample of at
    most 2M sentences, and pass 2 encodes in chunks on every core, dropping over-long pairs and,
    for training, pairs with a length ratio above `max_ratio` (0: off). Every drop is counted.
    The cache is built in a hidden sibling of `out` and swapped in whole at the end: a failure
    leaves the old cache as it was, a trainer that memory-maps it keeps reading the old files, and a folder
    in use by a trainer or holding files prepare did not write is refused. `task`: beyond translation
    (§6.3's parsing: parsing/treebank_data.py). `vocabulary`: a checkpoint's tokenizer (--tokenizer-from)
    instead of a learned one; `vocab_size` 0: sized to the training text (vocabulary_size_for). Returns the
    manifest (one of the same inputs and settings in `out`: reused).
    """
    splits = {name: (Path(s), Path(t)) for name, (s, t) in splits.items()}
    task = task or Task()
    symbols, carry = task.symbols, task.carry
    out = check_prepared_output(out)
    for need in ("train", "valid"):
        if need not in splits:
            raise DataError(f"a {need} split is required")
    settings = {"format": FORMAT_VERSION, "src": src_lang, "tgt": tgt_lang, "vocab_size": vocab_size,
                "max_len": max_len, "strict": strict, "seed": seed, "dedup": dedup, "max_ratio": max_ratio}
    settings.update({"symbols": sorted(symbols)} if symbols else {})  # (absent otherwise: earlier manifests match)
    settings.update(task.settings)  # e.g. {"task": "parse", "linearization": "words"}; checkpoints carry it
    settings.update({"vocabulary_sha256": hashlib.sha256(vocabulary).hexdigest()} if vocabulary else {})

    def recorded(p: Path) -> str:  # a carried file is recorded where it will be
        return str(out / p.relative_to(carry)) if carry and p.is_relative_to(carry) else str(p)

    inputs = {name: {"src": recorded(s), "tgt": recorded(t), "src_sha256": digest(s), "tgt_sha256": digest(t)}
              for name, (s, t) in splits.items()}

    def build(folder: Path, new: Path) -> dict:
        stats, tok = _build(splits, folder, new, src_lang, tgt_lang, vocab_size, max_len, strict, seed,
                            symbols, dedup, max_ratio, vocabulary)
        if task.on_build is not None:
            task.on_build()
        if carry is not None:
            shutil.copytree(carry, new, dirs_exist_ok=True)
        return {"settings": settings, "inputs": inputs, "vocab_size": len(tok), "splits": stats,
                "tests": [n for n in splits if n not in ("train", "valid")]}

    return prepared(out, settings, inputs, build)


def prepared(out: Path, settings: dict, inputs: dict, build: Callable[[Path, Path], dict]) -> dict:
    """The manifest of `out` when its settings and inputs are these (reused), else `build(work, new)`'s:
    the cache made in a hidden sibling and swapped in whole, under the data lock (files.new_folder)."""
    if (out / "manifest.json").exists():
        old = _old_manifest(out / "manifest.json")
        if old and old.get("settings") == settings and old.get("inputs") == inputs:
            log.info("%s: inputs unchanged, reusing the prepared data", out)
            return old
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_data(out)  # held until the new cache is in place
    try:
        with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".work", dir=out.parent) as tmp, \
                new_folder(out, PREPARED) as new:
            manifest = build(Path(tmp), new)
            atomic_write(new / "manifest.json", json.dumps(manifest, indent=2).encode())
    finally:
        if lock is not None:
            lock.release()
    return manifest


VOCAB_PER_WORDS, VOCAB_RANGE = 100, (1000, 37000)


def vocabulary_size_for(words: int) -> int:
    """§5.1's joint vocabulary sized to the data: one subword per VOCAB_PER_WORDS running words of the
    training text (both sides), in thousands, within VOCAB_RANGE (Multi30k's 0.73M words: 7,000; a
    WMT-sized corpus: the paper's 37,000)."""
    low, high = VOCAB_RANGE
    return min(high, max(low, round(words / VOCAB_PER_WORDS / 1000) * 1000))


def sized_vocabulary(texts: list[tuple[Path, np.ndarray | None]]) -> int:
    """The vocabulary size for the kept lines of these clean training texts, logged with its rule."""
    words = sum(len(line.split()) for path, keep in texts for line in kept_lines(path, keep))
    size = vocabulary_size_for(words)
    log.info("vocabulary size %d, sized to the data: %s running words in training / %d, in thousands, within "
             "%s-%s (data.vocab_size chooses one; the paper's 37,000 is for WMT-sized data: --preset base)",
             size, f"{words:,}", VOCAB_PER_WORDS, *(f"{x:,}" for x in VOCAB_RANGE))
    return size


def learn_vocabulary(text: Iterator[str], vocab_size: int, seed: int, strict: bool, what: str,
                     symbols: tuple[str, ...] = (), languages: tuple[str, ...] = ()) -> Tokenizer:
    """§5.1's joint BPE vocabulary on `text` (`what`: its sentences, for the log); one smaller than
    asked is a warning, or with `strict` an error."""
    log.info("learning a joint BPE vocabulary of %d on %s sentences (a sample of at most 2M)", vocab_size, what)
    tok = Tokenizer.train(text, vocab_size, seed, symbols, languages)
    if len(tok) < vocab_size:
        short = (f"the joint vocabulary has {len(tok)} subwords, fewer than the {vocab_size} asked for "
                 "(data.vocab_size): the training text holds no more merges")
        if strict:
            raise DataError(f"{short}; --strict forbids a smaller vocabulary")
        log.warning("%s; continuing with %d", short, len(tok))
    return tok


def _build(splits: dict[str, tuple[Path, Path]], folder: Path, new: Path, src_lang: str, tgt_lang: str,
           vocab_size: int, max_len: int, strict: bool, seed: int, symbols: tuple[str, ...], dedup: bool,
           max_ratio: float, vocabulary: bytes | None = None) -> tuple[dict[str, dict], Tokenizer | SplitTokenizer]:
    """Passes 1 and 2 of `prepare`: clean text in `folder`, the cache in `new`."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    stats: dict[str, dict] = {}
    keeps: dict[str, np.ndarray | None] = {}
    for name, (s, t) in splits.items():
        stats[name], keeps[name] = clean_split(s, t, folder, name, strict, dedup and name == "train")
    log.debug("read and checked every split; peak memory %.2f GB", peak_gb())
    kept = stats["train"]["pairs_in"] - stats["train"]["dropped_empty"] - stats["train"].get("dropped_duplicate", 0)
    if not kept:
        raise DataError(f"{splits['train'][0]}: no sentence pairs to learn from "
                        f"({stats['train']['dropped_empty']} dropped as empty)")
    if vocabulary is not None:
        tok = read_tokenizer(vocabulary)
        log.info("encoding in the given vocabulary of %d subwords (not learning one)", len(tok))
    else:
        texts = [(folder / f"train.{side}", keeps["train"]) for side in ("src", "tgt")]
        text = itertools.chain.from_iterable(kept_lines(p, k) for p, k in texts)
        tok = learn_vocabulary(text, vocab_size or sized_vocabulary(texts), seed, strict, f"{kept} + {kept}",
                               symbols=tuple(sorted(symbols)))
    log.debug("vocabulary learned; peak memory %.2f GB", peak_gb())
    (new / "spm.model").write_bytes(tok.proto)
    for name in splits:
        entry = stats[name]
        if name in ("train", "valid"):
            entry.update(encode_split(tok, folder, name, keeps[name], new, max_len,
                                       max_ratio if name == "train" else 0.0, threads))
        if name != "train":  # raw text for translation and BLEU (every non-empty pair kept)
            for side, lang in (("src", src_lang), ("tgt", tgt_lang)):
                shutil.copyfile(folder / f"{name}.{side}", new / f"{name}.{lang}.txt")
            entry.setdefault("pairs", entry["pairs_in"] - entry["dropped_empty"])
        log.info("%s: %s", name, ", ".join(f"{k}={v}" for k, v in entry.items()))
        log.debug("%s written; peak memory %.2f GB", name, peak_gb())
    return stats, tok


def check_vocabulary(proto: bytes, data_dir: Path) -> None:
    """§5.1: a checkpoint reads prepared data only in its own shared vocabulary (the same SentencePiece model)."""
    path = Path(data_dir) / "spm.model"
    if not path.exists() or path.read_bytes() != proto:
        raise DataError(f"{data_dir}: its vocabulary is not the checkpoint's; pass the run's prepared data")


def vocabulary_size(data_dir: Path) -> int:
    """The size of a prepared folder's shared vocabulary (§5.1), the model's vocab_size on it."""
    return int(load_manifest(data_dir)["vocab_size"])


def read_text(data_dir: Path, split: str, side: str, manifest: dict | None = None) -> list[str]:
    """One side ("src" or "tgt") of a prepared split's raw text (test and validation splits keep
    it), one sentence per line, checked against the manifest's count of its pairs."""
    manifest = manifest or load_manifest(data_dir)
    entry = manifest["splits"].get(split)
    # a direction's split names its own languages (data/directions.py), a pair's folder its settings
    lang = (entry if isinstance(entry, dict) else {}).get(f"{side}_lang") or manifest["settings"].get(side)
    if not isinstance(lang, str):
        directions = manifest["settings"].get("directions") or ["SRC-TGT"]
        raise DataError(f"{data_dir}: its {split} split holds several directions and no text of its own; "
                        f"name one direction's, e.g. {split}.{directions[0]}")
    path = Path(data_dir) / f"{split}.{lang}.txt"
    if not path.is_file():
        raise DataError(f"{data_dir}: no {path.name}; re-run `aiayn prepare`")
    lines = read_lines(path)  # split at "\n" only: str.splitlines also splits at U+2028, which a sentence may hold
    want = entry.get("pairs_in", 0) - entry.get("dropped_empty", 0) if isinstance(entry, dict) else None
    if isinstance(want, int) and "pairs_in" in entry and len(lines) != want:
        raise DataError(f"{path}: {len(lines)} lines, but the manifest counts {want} sentence pairs; "
                        "re-run `aiayn prepare`")
    return lines


def load_manifest(data_dir: Path) -> dict:
    path = Path(data_dir) / "manifest.json"
    if not path.exists():
        raise DataError(f"{data_dir}: no manifest.json; run `aiayn prepare` first")
    manifest = read_json(path, fix="re-run `aiayn prepare`")  # bounded, a JSON object: else one line
    if not {"vocab_size", "splits", "settings"} <= set(manifest) or not all(
            isinstance(manifest[k], dict) for k in ("splits", "settings")):
        raise DataError(f"{path}: corrupt (not a manifest with vocab_size, splits and settings); "
                        "re-run `aiayn prepare`")
    return manifest
