"""Documents through a sentence-level model (§6.1 translates sentences): each input line is a
paragraph, split into sentences by pysbd (a rule-based segmenter for 20+ languages; on Multi30k's
test2016 captions joined three by three it recovers every boundary where a sentence ends in a
period, docs/serving.md), translated in one batch, and joined back; blank lines stay blank.
"""

from __future__ import annotations

import functools

import pysbd

from ..config import ConfigError


@functools.cache
def _segmenter(lang: str) -> pysbd.Segmenter:
    try:
        return pysbd.Segmenter(language=lang, clean=False)
    except ValueError:
        raise ConfigError(f"--src-lang {lang!r}: pysbd has no sentence rules for it (it knows "
                          f"{', '.join(sorted(pysbd.languages.LANGUAGE_CODES))})") from None


def sentences(paragraph: str, lang: str = "en") -> list[str]:
    """A paragraph's sentences (an empty paragraph has none)."""
    if not paragraph.strip():
        return []
    return [s.strip() for s in _segmenter(lang).segment(paragraph.strip()) if s.strip()]


def translate_paragraphs(translate, paragraphs: list[str], lang: str = "en") -> list[str]:
    """One output line per paragraph: its sentences translated (`translate`: list -> list, one
    batch for the whole document) and joined by a space."""
    parts = [sentences(p, lang) for p in paragraphs]
    flat = translate([s for part in parts for s in part])
    out, i = [], 0
    for part in parts:
        out.append(" ".join(flat[i:i + len(part)]))
        i += len(part)
    return out
