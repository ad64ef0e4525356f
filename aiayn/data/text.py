"""Aligned text read and checked (§5.1): one sentence per line, plain or .gz, UTF-8, NFC, the
two sides the same length; every problem a DataError naming the file and the line."""

from __future__ import annotations

import gzip
import itertools
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from ..errors import AiaynError


class DataError(AiaynError):
    """Bad input data; the message names the file and line."""


# -- reading and validating ----------------------------------------------------------------
def find_file(prefix: str | Path, lang: str) -> Path:
    """`{prefix}.{lang}` or `{prefix}.{lang}.gz`."""
    for cand in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if cand.is_file():
            return cand
    raise DataError(f"no file {prefix}.{lang} or {prefix}.{lang}.gz")


def iter_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 text file (plain or .gz), NFC-normalized, without line ends; read as a
    stream, so a file of any size holds one line in memory."""
    opener = gzip.open if path.suffix == ".gz" else open
    n = 0
    try:
        with opener(path, "rb") as f:
            for n, line in enumerate(f, 1):  # noqa: B007 (n names the line of an error)
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}:{n}: invalid UTF-8 at byte {e.start}: {line[:60]!r}") from None
                yield unicodedata.normalize("NFC", text.rstrip("\n").rstrip("\r"))
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read{f' after line {n}' if n else ''}: {e}") from None


def read_lines(path: Path) -> list[str]:
    """Every line of a file (see iter_lines), split at "\n" only (str.splitlines also splits at U+2028,
    U+0085 and form feeds, which a sentence may hold)."""
    return list(iter_lines(path))


def iter_pairs(src: Path, tgt: Path, strict: bool = False, counts: dict | None = None) -> Iterator[tuple[str, str]]:
    """Aligned, stripped source/target lines as a stream. Pairs with an empty side are dropped
    and counted in counts["dropped_empty"] (with `strict`, an error naming the file and line);
    files of different lengths are an error naming both counts."""
    counts = {} if counts is None else counts
    counts.setdefault("dropped_empty", 0)
    s_it, t_it = iter_lines(src), iter_lines(tgt)
    for n, (s, t) in enumerate(itertools.zip_longest(s_it, t_it), 1):
        if s is None or t is None:
            rest = 1 + sum(1 for _ in (t_it if s is None else s_it))
            s_n, t_n = (n - 1, n - 1 + rest) if s is None else (n - 1 + rest, n - 1)
            raise DataError(f"misaligned corpus: {src} has {s_n} lines but {tgt} has {t_n}")
        s, t = s.strip(), t.strip()
        if not s or not t:
            if strict:
                raise DataError(f"{src if not s else tgt}:{n}: empty line (its pair would be dropped; "
                                "--strict forbids it)")
            counts["dropped_empty"] += 1
            continue
        yield s, t


def read_parallel(src: Path, tgt: Path, strict: bool = False) -> tuple[list[str], list[str], int]:
    """Every pair of two aligned files (see iter_pairs) and the number dropped as empty."""
    counts: dict = {}
    pairs = list(iter_pairs(src, tgt, strict, counts))
    return [s for s, _ in pairs], [t for _, t in pairs], counts["dropped_empty"]
