"""Many directions, one prepared folder (Johnson et al. 2017; the paper trains one pair at a time):
each direction's text checked as `prepare` checks a pair, one joint vocabulary (§5.1) learned on a
temperature-sampled mix of the languages, and a target-language tag `<2xx>` in front of every source.

The folder holds every direction's training pairs in one `train` split (their tags first) with
`train.direction.npy` saying whose each pair is, likewise `valid` (the validation loss), and each
direction's validation and test text as splits of their own, `valid.en-de` or `test2016.en-fr`.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..files import digest
from .mixing import draw_parts
from .passes import clean_split, concatenate_split, encode_split, kept_lines, part_of_pairs
from .prepare import check_prepared_output, learn_vocabulary, prepared, sized_vocabulary
from .text import DataError
from .tokenizer import Tokenizer

log = logging.getLogger("aiayn")

_DIRECTION = re.compile(r"([A-Za-z0-9_]{1,16})-([A-Za-z0-9_]{1,16})")


def parse_directions(text: str) -> list[tuple[str, str]]:
    """`en-de,en-fr` -> [("en", "de"), ("en", "fr")]; one line naming what is wrong otherwise."""
    out: list[tuple[str, str]] = []
    for item in (x.strip() for x in text.split(",")):
        m = _DIRECTION.fullmatch(item)
        if not m or m.group(1) == m.group(2):
            raise DataError(f"--pairs {text!r}: {item!r} is not SRC-TGT (two different language codes, e.g. en-de)")
        if (m.group(1), m.group(2)) in out:
            raise DataError(f"--pairs {text!r}: {item} is named twice")
        out.append((m.group(1), m.group(2)))
    return out


def direction_name(src: str, tgt: str) -> str:
    return f"{src}-{tgt}"


def temperature_shares(counts: dict[str, int], temperature: float) -> dict[str, float]:
    """Sampling shares p_k ∝ (n_k / N)^(1/T) (Arivazhagan et al. 2019): T = 1 proportional to the
    data, larger T nearer uniform, so a small language or direction is not drowned."""
    if temperature <= 0:
        raise DataError(f"a sampling temperature must be > 0, got {temperature}")
    total = sum(counts.values())
    weights = {k: (n / total) ** (1 / temperature) if n else 0.0 for k, n in counts.items()}
    norm = sum(weights.values())
    return {k: w / norm for k, w in weights.items()}


def quotas(counts: dict[str, int], temperature: float, total: int) -> dict[str, int]:
    """How many of `total` draws each part gets at this temperature (at least one where it has data)."""
    return {k: max(1 if counts[k] else 0, round(total * p)) for k, p in temperature_shares(counts, temperature).items()}


def spread(lines: Callable[[], Iterator[str]], n: int, quota: int) -> Iterator[str]:
    """`quota` of the n lines that `lines()` streams, spread evenly (fewer) or every line repeated
    in turn (more: a small language's text counted as often as its share asks). Streams; no line is
    held beyond the one read."""
    if n <= 0 or quota <= 0:
        return
    rounds, rest = divmod(quota, n)
    for _ in range(rounds):
        yield from lines()
    if rest:  # line j is taken where floor(j * rest / n) steps up
        for j, line in enumerate(lines()):
            if (j + 1) * rest // n != j * rest // n:
                yield line


def epoch_pool(directions: np.ndarray, temperature: float, seed: int, epoch: int) -> np.ndarray | None:
    """The training pairs of one epoch when directions are mixed at `temperature` (data.mix_temperature):
    each direction's quota of the corpus's size, drawn without replacement as far as its pairs go and
    repeated beyond, the same for the same (seed, epoch) and so the same after a resume. T = 1: None,
    every pair once (the proportional mix of one concatenated corpus)."""
    if temperature == 1 or len(directions) == 0:
        return None
    ids, counts = np.unique(directions, return_counts=True)
    want = quotas({int(k): int(n) for k, n in zip(ids, counts)}, temperature, len(directions))
    return draw_parts(directions, want, np.random.default_rng([seed, epoch, 7]))  # its own stream: not make_batches'


# -- preparing many directions -------------------------------------------------------------
Splits = dict[str, tuple[Path, Path]]  # split name -> (source file, target file), as prepare takes them
VOCAB_SAMPLE = 2_000_000  # lines SentencePiece learns on at most (Tokenizer.train's input_sentence_size)


def prepare_many(directions: dict[tuple[str, str], Splits], out: str | Path, vocab_size: int = 0, max_len: int = 256,
                 strict: bool = False, seed: int = 1, dedup: bool = True, max_ratio: float = 3.0,
                 vocab_temperature: float = 5.0) -> dict:
    """`prepare` for several directions at once (see the module's docstring): every direction's
    splits checked and counted as `prepare` checks a pair, the vocabulary learned on each language's
    training text sampled at `vocab_temperature`, one tag per target language. The same protection
    of `out` as `prepare` (a folder it did not write is refused, the old cache stays until the new
    one is whole); the manifest records the directions. Returns it."""
    out = check_prepared_output(out)
    names = [direction_name(s, t) for s, t in directions]
    for (s, t), splits in directions.items():
        for need in ("train", "valid"):
            if need not in splits:
                raise DataError(f"{direction_name(s, t)}: a {need} split is required")
    settings = {"format": 1, "directions": names, "tag": "source", "vocab_size": vocab_size, "max_len": max_len,
                "strict": strict, "seed": seed, "dedup": dedup, "max_ratio": max_ratio,
                "vocab_temperature": vocab_temperature}
    inputs = {f"{name}.{direction_name(*d)}": {"src": str(s), "tgt": str(t), "src_sha256": digest(s),
                                                "tgt_sha256": digest(t)}
              for d, splits in directions.items() for name, (s, t) in splits.items()}

    def build(folder: Path, new: Path) -> dict:
        stats, size = _build_many(directions, folder, new, settings, inputs)
        tests = [k for k in stats if k.split(".", 1)[0] not in ("train", "valid")]
        return {"settings": settings, "inputs": inputs, "vocab_size": size, "splits": stats, "tests": tests}

    return prepared(out, settings, inputs, build)


def _build_many(directions: dict[tuple[str, str], Splits], folder: Path, new: Path, settings: dict, inputs: dict
                ) -> tuple[dict[str, dict], int]:
    """Pass 1 for every direction's splits, the vocabulary, pass 2 into one train and one valid split."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    stats: dict[str, dict] = {}
    keeps: dict[str, np.ndarray | None] = {}
    for (s_lang, t_lang), splits in directions.items():
        d = direction_name(s_lang, t_lang)
        for name, (s, t) in splits.items():
            key = f"{name}.{d}"
            stats[key], keeps[key] = clean_split(s, t, folder, key, settings["strict"], settings["dedup"]
                                                 and name == "train")
            stats[key].update(src_lang=s_lang, tgt_lang=t_lang)
        c = stats[f"train.{d}"]
        if not c["pairs_in"] - c["dropped_empty"]:
            raise DataError(f"{d}: {splits['train'][0]}: no sentence pairs to learn from")
    tok = _vocabulary(directions, folder, keeps, settings, inputs)
    (new / "spm.model").write_bytes(tok.proto)
    names = [direction_name(s, t) for s, t in directions]
    for split in ("train", "valid"):
        parts = [f"{split}.{d}" for d in names]
        for (_, t_lang), part in zip(directions, parts):
            stats[part].update(encode_split(tok, folder, part, keeps[part], new, settings["max_len"],
                                            settings["max_ratio"] if split == "train" else 0.0, threads,
                                            prefix=(tok.tag_id(t_lang),)))
        concatenate_split(new, split, parts)
        np.save(new / f"{split}.direction.npy", part_of_pairs([stats[p]["pairs"] for p in parts]))
        stats[split] = {k: sum(stats[p].get(k, 0) for p in parts) for k in stats[parts[0]] if k.endswith(
            ("pairs", "pairs_in", "tokens")) or k.startswith("dropped")} | {"directions": names}
    for key, entry in stats.items():
        if key.split(".", 1)[0] != "train" and "src_lang" in entry:  # raw text for translation and BLEU
            for side in ("src", "tgt"):
                shutil.copyfile(folder / f"{key}.{side}", new / f"{key}.{entry[f'{side}_lang']}.txt")
            entry.setdefault("pairs", entry["pairs_in"] - entry["dropped_empty"])
        log.info("%s: %s", key, ", ".join(f"{k}={v}" for k, v in entry.items()))
    return stats, len(tok)


def _vocabulary(directions: dict[tuple[str, str], Splits], folder: Path, keeps: dict, settings: dict, inputs: dict
                ) -> Tokenizer:
    """§5.1's joint vocabulary on every language's training text (each distinct file once), each
    language's share of the sample at the temperature, one `<2xx>` tag per target language."""
    texts: dict[str, dict[str, tuple[Path, np.ndarray | None, int]]] = {}  # language -> file digest -> text
    for s_lang, t_lang in directions:
        key = f"train.{direction_name(s_lang, t_lang)}"
        keep = keeps[key]
        for side, lang in (("src", s_lang), ("tgt", t_lang)):
            path = folder / f"{key}.{side}"
            n = int(keep.sum()) if keep is not None else sum(1 for _ in kept_lines(path, None))
            texts.setdefault(lang, {}).setdefault(inputs[key][f"{side}_sha256"], (path, keep, n))
    counts = {lang: sum(n for _, _, n in files.values()) for lang, files in texts.items()}
    want = quotas(counts, settings["vocab_temperature"], min(sum(counts.values()), VOCAB_SAMPLE))
    parts = [spread(lambda p=path, k=keep: kept_lines(p, k), n, round(want[lang] * n / counts[lang]))
             for lang, files in texts.items() for path, keep, n in files.values()]
    size = settings["vocab_size"] or sized_vocabulary([(p, k) for f in texts.values() for p, k, _ in f.values()])
    shares = ", ".join(f"{lang} {want[lang]:,}" for lang in texts)
    return learn_vocabulary(itertools.chain.from_iterable(parts), size, settings["seed"], settings["strict"],
                            f"{sum(want.values()):,} ({shares}; temperature {settings['vocab_temperature']})",
                            languages=tuple(sorted({t for _, t in directions})))
