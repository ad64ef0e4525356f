"""Parallel text in, checked and cached subwords out, then token-count batches (§5.1).

`prepare` reads aligned files (plain or .gz), validates them (line counts, UTF-8, empty lines,
length), normalizes to NFC, learns the joint BPE vocabulary and writes every split once as
flat int32 arrays + offsets with a manifest. `make_batches` groups pairs of similar length
into batches of about `max_tokens` padded tokens.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import shutil
import unicodedata
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .tokenizer import BOS, EOS, PAD, Tokenizer

log = logging.getLogger("aiayn")
FORMAT_VERSION = 1

# Public corpora `aiayn prepare --corpus NAME` can download (and what their splits are called).
CORPORA = {
    "multi30k": {
        "url": "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{split}.{lang}.gz",
        "env": "AIAYN_MULTI30K",
        "train": "train", "valid": "val", "test": ["test_2016_flickr", "test_2017_flickr"],
    },
}


class DataError(ValueError):
    """Bad input data; the message names the file and line."""


# -- reading and validating ----------------------------------------------------------------
def find_file(prefix: str | Path, lang: str) -> Path:
    """`{prefix}.{lang}` or `{prefix}.{lang}.gz`."""
    for cand in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if cand.is_file():
            return cand
    raise DataError(f"no file {prefix}.{lang} or {prefix}.{lang}.gz")


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file (plain or .gz), NFC-normalized, without line ends."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read: {e}") from None
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for n, line in enumerate(lines, 1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{n}: invalid UTF-8 at byte {e.start}: {line[:60]!r}") from None
        out.append(unicodedata.normalize("NFC", text.rstrip("\r")))
    return out


def read_parallel(src: Path, tgt: Path, strict: bool = False) -> tuple[list[str], list[str], int]:
    """Aligned source/target lines; pairs with an empty side are dropped (counted) or, with
    `strict`, an error naming the file and line."""
    s_lines, t_lines = read_lines(src), read_lines(tgt)
    if len(s_lines) != len(t_lines):
        raise DataError(
            f"misaligned corpus: {src} has {len(s_lines)} lines but {tgt} has {len(t_lines)}"
        )
    keep_s, keep_t, dropped = [], [], 0
    for n, (s, t) in enumerate(zip(s_lines, t_lines), 1):
        if not s.strip() or not t.strip():
            if strict:
                which = src if not s.strip() else tgt
                raise DataError(f"{which}:{n}: empty line (its pair would be dropped; --strict forbids it)")
            dropped += 1
            continue
        keep_s.append(s.strip())
        keep_t.append(t.strip())
    return keep_s, keep_t, dropped


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_corpus(name: str, src: str, tgt: str, cache_dir: Path) -> Path:
    """Download a public corpus's raw files into cache_dir (once) and return the directory."""
    spec = CORPORA[name]
    out = cache_dir / name
    out.mkdir(parents=True, exist_ok=True)
    for split in [spec["train"], spec["valid"], *spec["test"]]:
        for lang in (src, tgt):
            dest = out / f"{split}.{lang}.gz"
            if dest.exists():
                continue
            url = spec["url"].format(split=split, lang=lang)
            log.info("downloading %s", url)
            tmp = dest.with_suffix(".part")
            try:
                with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
                    shutil.copyfileobj(r, f)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                if split in spec["test"]:
                    log.warning("no %s for %s (%s); skipping that test set", split, lang, e)
                    continue
                raise DataError(
                    f"cannot download {url}: {e}. Pass --data-dir with a local copy "
                    f"(or set {spec['env']})"
                ) from None
            os.replace(tmp, dest)
    return out


# -- the prepared cache --------------------------------------------------------------------
def _write_split(out: Path, split: str, side: str, ids: list[list[int]]) -> None:
    lens = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    flat = np.fromiter((t for x in ids for t in x), dtype=np.int32, count=int(offsets[-1]))
    np.save(out / f"{split}.{side}.tok.npy", flat)
    np.save(out / f"{split}.{side}.off.npy", offsets)


def prepare(
    splits: dict[str, tuple[str | Path, str | Path]], out: str | Path, src_lang: str, tgt_lang: str,
    vocab_size: int = 37000, max_len: int = 256, strict: bool = False, seed: int = 1,
    symbols: tuple[str, ...] = (),
) -> dict:
    """Validate, learn the joint vocabulary on train, and cache every split.

    splits maps "train", "valid" and test names to (source file, target file). Returns the
    manifest; if one with the same inputs and settings exists in `out`, it is reused.
    """
    splits = {name: (Path(s), Path(t)) for name, (s, t) in splits.items()}
    out = Path(out)
    for need in ("train", "valid"):
        if need not in splits:
            raise DataError(f"a {need} split is required")
    settings = {"format": FORMAT_VERSION, "src": src_lang, "tgt": tgt_lang, "vocab_size": vocab_size,
                "max_len": max_len, "strict": strict, "seed": seed}
    if symbols:  # (absent otherwise, so earlier manifests still match)
        settings["symbols"] = sorted(symbols)
    inputs = {name: {"src": str(s), "tgt": str(t), "src_sha256": sha256(s), "tgt_sha256": sha256(t)}
              for name, (s, t) in splits.items()}
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        if old.get("settings") == settings and old.get("inputs") == inputs:
            log.info("%s: inputs unchanged, reusing the prepared data", out)
            return old
    texts = {name: read_parallel(s, t, strict) for name, (s, t) in splits.items()}
    train_s, train_t, dropped = texts["train"]
    if not train_s:
        raise DataError(f"{splits['train'][0]}: no sentence pairs to learn from ({dropped} dropped as empty)")
    log.info("learning a joint BPE vocabulary of %d on %d + %d sentences", vocab_size, len(train_s), len(train_t))
    tok = Tokenizer.train(train_s + train_t, vocab_size, seed, tuple(sorted(symbols)))
    if len(tok) < vocab_size:
        short = (f"the joint vocabulary has {len(tok)} subwords, fewer than the {vocab_size} asked for "
                 "(data.vocab_size): the training text holds no more merges")
        if strict:
            raise DataError(f"{short}; --strict forbids a smaller vocabulary")
        log.warning("%s; continuing with %d", short, len(tok))
    out.mkdir(parents=True, exist_ok=True)  # only now: bad input leaves nothing behind
    (out / "spm.model").write_bytes(tok.proto)
    stats: dict[str, dict] = {}
    for name, (s_lines, t_lines, dropped_empty) in texts.items():
        s_ids, t_ids = tok.encode(s_lines), tok.encode(t_lines)
        entry = {"pairs_in": len(s_lines) + dropped_empty, "dropped_empty": dropped_empty}
        if name in ("train", "valid"):
            # +2 for EOS on the source and BOS/EOS on the target.
            keep = [i for i in range(len(s_ids)) if len(s_ids[i]) + 1 <= max_len and len(t_ids[i]) + 2 <= max_len]
            entry["dropped_too_long"] = len(s_ids) - len(keep)
            s_ids, t_ids = [s_ids[i] for i in keep], [t_ids[i] for i in keep]
            _write_split(out, name, "src", s_ids)
            _write_split(out, name, "tgt", t_ids)
            entry.update(pairs=len(keep), src_tokens=sum(map(len, s_ids)), tgt_tokens=sum(map(len, t_ids)))
        if name != "train":  # raw text for translation and BLEU (every line kept)
            (out / f"{name}.{src_lang}.txt").write_text("".join(x + "\n" for x in s_lines))
            (out / f"{name}.{tgt_lang}.txt").write_text("".join(x + "\n" for x in t_lines))
            entry.setdefault("pairs", len(s_lines))
        stats[name] = entry
        log.info("%s: %s", name, ", ".join(f"{k}={v}" for k, v in entry.items()))
    manifest = {"settings": settings, "inputs": inputs, "vocab_size": len(tok), "splits": stats,
                "tests": [n for n in splits if n not in ("train", "valid")]}
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, manifest_path)  # written last: a manifest means a complete cache
    return manifest


def load_manifest(data_dir: Path) -> dict:
    path = Path(data_dir) / "manifest.json"
    if not path.exists():
        raise DataError(f"{data_dir}: no manifest.json; run `aiayn prepare` first")
    return json.loads(path.read_text())


class TokenData:
    """One prepared split's token ids (memory-mapped), without BOS/EOS."""

    def __init__(self, data_dir: Path, split: str):
        def arr(side: str, kind: str) -> np.ndarray:
            path = Path(data_dir) / f"{split}.{side}.{kind}.npy"
            if not path.exists():
                raise DataError(f"{path} is missing; re-run `aiayn prepare`")
            return np.load(path, mmap_mode="r")

        self.src_tok, self.src_off = arr("src", "tok"), np.asarray(arr("src", "off"))
        self.tgt_tok, self.tgt_off = arr("tgt", "tok"), np.asarray(arr("tgt", "off"))
        self.src_lens = np.diff(self.src_off) + 1  # + EOS
        self.tgt_lens = np.diff(self.tgt_off) + 1  # decoder input: BOS + y, output: y + EOS

    def __len__(self) -> int:
        return len(self.src_lens)

    def src(self, i: int) -> np.ndarray:
        return self.src_tok[self.src_off[i]:self.src_off[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_tok[self.tgt_off[i]:self.tgt_off[i + 1]]


# -- batches -------------------------------------------------------------------------------
def make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int, epoch: int
                 ) -> list[np.ndarray]:
    """§5.1 "batched together by approximate sequence length": shuffle (seed, epoch), sort by
    length, cut into batches of at most `max_tokens` padded tokens per side, shuffle the batches.
    Every pair lands in exactly one batch; the result depends only on (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src_lens))
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

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.src.to(device, non_blocking=True), self.tgt_in.to(device, non_blocking=True),
                      self.tgt_out.to(device, non_blocking=True), self.n_tokens)


def collate(data: TokenData, indices: np.ndarray) -> Batch:
    B = len(indices)
    S, T = int(data.src_lens[indices].max()), int(data.tgt_lens[indices].max())
    src = np.full((B, S), PAD, dtype=np.int64)
    tgt_in = np.full((B, T), PAD, dtype=np.int64)
    tgt_out = np.full((B, T), PAD, dtype=np.int64)
    for b, i in enumerate(indices):
        s, t = data.src(i), data.tgt(i)
        src[b, :len(s)], src[b, len(s)] = s, EOS
        tgt_in[b, 0], tgt_in[b, 1:len(t) + 1] = BOS, t
        tgt_out[b, :len(t)], tgt_out[b, len(t)] = t, EOS
    n = int(data.tgt_lens[indices].sum())
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), n)
