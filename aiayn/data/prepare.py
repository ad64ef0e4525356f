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
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files import FileError, atomic_write, check_output_folder, digest, lock_data, new_folder, owned, read_json
from .mixing import BT_TAG, TrainingCorpus, check_weight
from .passes import clean_split, concatenate_split, encode_split, kept_lines, part_of_pairs, peak_gb
from .text import DataError, read_lines
from .tokenizer import SplitTokenizer, Tokenizer, read_tokenizer

log = logging.getLogger("aiayn")
FORMAT_VERSION = 1

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
    corpora: tuple[TrainingCorpus, ...] = (), train_weight: float = 1.0,
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
    instead of a learned one; `vocab_size` 0: sized to the training text (vocabulary_size_for). `corpora`:
    more training corpora (back-translated: data/mixing.py), weighed against the parallel one's
    `train_weight`. Returns the manifest (one of the same inputs and settings in `out`: reused).
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
    corpora = tuple(corpora)
    settings.update(_corpus_settings(corpora, train_weight))  # (absent for one corpus: earlier manifests match)
    inputs.update({f"train.{c.name}": {"src": str(c.src), "tgt": str(c.tgt), "src_sha256": digest(c.src),
                                       "tgt_sha256": digest(c.tgt)} for c in corpora})

    def build(folder: Path, new: Path) -> dict:
        stats, tok = _build(splits, folder, new, src_lang, tgt_lang, vocab_size, max_len, strict, seed,
                            symbols, dedup, max_ratio, vocabulary, (corpora, train_weight))
        if task.on_build is not None:
            task.on_build()
        if carry is not None:
            shutil.copytree(carry, new, dirs_exist_ok=True)
        return {"settings": settings, "inputs": inputs, "vocab_size": len(tok), "splits": stats,
                "tests": [n for n in splits if n not in ("train", "valid")]}

    return prepared(out, settings, inputs, build)


PARALLEL = "parallel"  # the name of the genuine training corpus among several


def _corpus_settings(corpora: tuple[TrainingCorpus, ...], train_weight: float) -> dict:
    """The manifest's record of the training corpora and their weights; {} for one corpus."""
    check_weight(train_weight, "the parallel corpus (--train-weight)")
    if not corpora:
        if train_weight != 1:
            raise DataError("--train-weight weighs the parallel corpus against others (--synthetic): there are none")
        return {}
    names = [PARALLEL] + [c.name for c in corpora]
    for c in corpora:
        check_weight(c.weight, f"{c.name} ({c.src})")
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", c.name) or names.count(c.name) > 1:
            raise DataError(f"a training corpus needs a name of its own (lower-case letters, digits, _), "
                            f"got {c.name!r}")
    if train_weight == 0 and all(c.weight == 0 for c in corpora):
        raise DataError("every training corpus has weight 0: an epoch would hold no pairs")
    return {"corpora": [{"name": PARALLEL, "weight": train_weight, "synthetic": False, "tag": None}]
            + [{"name": c.name, "weight": c.weight, "synthetic": c.synthetic,
                "tag": BT_TAG if c.synthetic and c.tag else None} for c in corpora]}


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
                     symbols: tuple[str, ...] = (), languages: tuple[str, ...] = (), markers: tuple[str, ...] = ()
                     ) -> Tokenizer:
    """§5.1's joint BPE vocabulary on `text` (`what`: its sentences, for the log); one smaller than
    asked is a warning, or with `strict` an error."""
    log.info("learning a joint BPE vocabulary of %d on %s sentences (a sample of at most 2M)", vocab_size, what)
    tok = Tokenizer.train(text, vocab_size, seed, symbols, languages, markers)
    if len(tok) < vocab_size:
        short = (f"the joint vocabulary has {len(tok)} subwords, fewer than the {vocab_size} asked for "
                 "(data.vocab_size): the training text holds no more merges")
        if strict:
            raise DataError(f"{short}; --strict forbids a smaller vocabulary")
        log.warning("%s; continuing with %d", short, len(tok))
    return tok


def _build(splits: dict[str, tuple[Path, Path]], folder: Path, new: Path, src_lang: str, tgt_lang: str,
           vocab_size: int, max_len: int, strict: bool, seed: int, symbols: tuple[str, ...], dedup: bool,
           max_ratio: float, vocabulary: bytes | None = None,
           mix: tuple[tuple[TrainingCorpus, ...], float] = ((), 1.0)
           ) -> tuple[dict[str, dict], Tokenizer | SplitTokenizer]:
    """Passes 1 and 2 of `prepare`: clean text in `folder`, the cache in `new`; `mix`: more training
    corpora and the parallel one's weight."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    stats: dict[str, dict] = {}
    keeps: dict[str, np.ndarray | None] = {}
    corpora = mix[0]
    for name, (s, t) in [*splits.items(), *((f"train.{c.name}", (c.src, c.tgt)) for c in corpora)]:
        stats[name], keeps[name] = clean_split(s, t, folder, name, strict, dedup and name.split(".")[0] == "train")
    log.debug("read and checked every split; peak memory %.2f GB", peak_gb())
    kept = stats["train"]["pairs_in"] - stats["train"]["dropped_empty"] - stats["train"].get("dropped_duplicate", 0)
    if not kept:
        raise DataError(f"{splits['train'][0]}: no sentence pairs to learn from "
                        f"({stats['train']['dropped_empty']} dropped as empty)")
    tagged = any(c.synthetic and c.tag for c in corpora)
    if vocabulary is not None:
        tok = read_tokenizer(vocabulary)
        log.info("encoding in the given vocabulary of %d subwords (not learning one)", len(tok))
        if tagged and tok.control_id(BT_TAG) is None:
            raise DataError(f"the given vocabulary has no {BT_TAG} piece to tag synthetic sources with: learn one "
                            "(leave out --tokenizer-from) or pass --no-bt-tag")
    else:
        texts = [(folder / f"{key}.{side}", keeps[key]) for key in ["train", *(f"train.{c.name}" for c in corpora)]
                 for side in ("src", "tgt")]
        text = itertools.chain.from_iterable(kept_lines(p, k) for p, k in texts)
        tok = learn_vocabulary(text, vocab_size or sized_vocabulary(texts), seed, strict,
                               f"{len(texts) // 2} corpora of training" if corpora else f"{kept} + {kept}",
                               symbols=tuple(sorted(symbols)), markers=(BT_TAG,) if tagged else ())
    log.debug("vocabulary learned; peak memory %.2f GB", peak_gb())
    (new / "spm.model").write_bytes(tok.proto)
    for name in splits:
        entry = stats[name]
        if name == "train" and corpora:
            stats[name] = entry = _encode_corpora(tok, folder, new, stats, keeps, mix, max_len, max_ratio, threads)
        elif name in ("train", "valid"):
            entry.update(encode_split(tok, folder, name, keeps[name], new, max_len,
                                       max_ratio if name == "train" else 0.0, threads))
        if name != "train":  # raw text for translation and BLEU (every non-empty pair kept)
            for side, lang in (("src", src_lang), ("tgt", tgt_lang)):
                shutil.copyfile(folder / f"{name}.{side}", new / f"{name}.{lang}.txt")
            entry.setdefault("pairs", entry["pairs_in"] - entry["dropped_empty"])
        log.info("%s: %s", name, ", ".join(f"{k}={v}" for k, v in entry.items()))
        log.debug("%s written; peak memory %.2f GB", name, peak_gb())
    return stats, tok


def _encode_corpora(tok: Tokenizer | SplitTokenizer, folder: Path, new: Path, stats: dict[str, dict], keeps: dict,
                    mix: tuple[tuple[TrainingCorpus, ...], float], max_len: int, max_ratio: float, threads: int
                    ) -> dict:
    """Pass 2 of a train split of several corpora: each encoded as a part (a tagged one with `<BT>`
    before every source), joined into one split with each pair's corpus and the corpora's weights
    beside it (data/mixing.py). The parts' counts go into `stats`; returns the split's sums."""
    corpora, train_weight = mix
    for side in ("src", "tgt"):
        (folder / f"train.{side}").rename(folder / f"train.{PARALLEL}.{side}")
    stats[f"train.{PARALLEL}"], keeps[f"train.{PARALLEL}"] = dict(stats["train"]), keeps["train"]
    parts = [f"train.{PARALLEL}"] + [f"train.{c.name}" for c in corpora]
    prefixes = [()] + [(tok.control_id(BT_TAG),) if c.synthetic and c.tag else () for c in corpora]
    for part, prefix in zip(parts, prefixes):
        stats[part].update(encode_split(tok, folder, part, keeps[part], new, max_len, max_ratio, threads,
                                        prefix=prefix))
    concatenate_split(new, "train", parts)
    np.save(new / "train.corpus.npy", part_of_pairs([stats[p]["pairs"] for p in parts]))
    np.save(new / "train.corpus_weights.npy", np.array([train_weight] + [c.weight for c in corpora], np.float64))
    for part in parts:
        log.info("%s: %s", part, ", ".join(f"{k}={v}" for k, v in stats[part].items()))
    total = {k: sum(stats[p].get(k, 0) for p in parts) for k in stats[parts[0]]}
    return total | {"corpora": [p.split(".", 1)[1] for p in parts]}


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
