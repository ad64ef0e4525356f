"""Terms the user dictates (not in the paper): a glossary of source terms and the target terms they
must be translated by, read from a TSV file or a request, matched in each source line, and turned
into the target phrases constrained beam search (decode/constraints.py) must write.

A glossary line is `source term<TAB>target term` (multi-word on both sides; blank lines and lines
starting with `#` are skipped). A source term matches as whole words, ignoring case; where two
matches overlap the longer one wins (`New York` over `York`), then the earlier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..data.tokenizer import UNK
from ..errors import AiaynError
from ..files import read_bounded
from .constraints import MAX_PHRASES, unique_phrases

MAX_GLOSSARY_BYTES = 1 << 24
MAX_ENTRIES = 100_000
MAX_TERM_CHARS = 200


class GlossaryError(AiaynError):
    """A glossary line that is not `source<TAB>target`, or a term the vocabulary cannot write: the message names it."""


@dataclass(frozen=True)
class Entry:
    source: str
    target: str
    where: str  # "FILE line N" or "glossary entry N": what an error names


class Glossary:
    """Source term → target term entries, each matched as whole words, ignoring case."""

    def __init__(self, entries: list[Entry]):
        if len(entries) > MAX_ENTRIES:
            raise GlossaryError(f"{len(entries):,} glossary entries; at most {MAX_ENTRIES:,}")
        self.entries = entries
        self._patterns = [re.compile(rf"(?<!\w){re.escape(e.source)}(?!\w)", re.IGNORECASE) for e in entries]
        self._lowered = [e.source.lower() for e in entries]

    @classmethod
    def load(cls, path: str | Path) -> Glossary:
        """A TSV file of `source<TAB>target` lines (size bounded; a bad line: one line naming it)."""
        text = read_bounded(path, MAX_GLOSSARY_BYTES)
        entries = []
        for n, line in enumerate(text.split("\n"), 1):  # one entry a "\n" line (a term may hold U+2028)
            line = line.removesuffix("\r")
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise GlossaryError(f"{path} line {n}: {len(fields)} tab-separated fields; a glossary line is "
                                    "`source term<TAB>target term`")
            entries.append(_entry(fields[0], fields[1], f"{path} line {n}"))
        return cls(entries)

    @classmethod
    def from_pairs(cls, pairs: list, where: str = "glossary entry") -> Glossary:
        """Entries from [source, target] pairs (a request's JSON): each checked like a file's line."""
        out = []
        for n, pair in enumerate(pairs, 1):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise GlossaryError(f"{where} {n}: not a [source term, target term] pair of strings")
            out.append(_entry(pair[0], pair[1], f"{where} {n}"))
        return cls(out)

    def matches(self, line: str) -> list[Entry]:
        """The entries whose source term occurs in the line as whole words, in source order
        (overlaps: the longer match, then the earlier; a target term asked for twice, once)."""
        low = line.lower()
        found = []
        for e, pat, src in zip(self.entries, self._patterns, self._lowered):
            if src in low:
                found += [(m.start(), m.end(), e) for m in pat.finditer(line)]
        taken: list[tuple[int, int, Entry]] = []
        for start, end, e in sorted(found, key=lambda x: (x[0] - x[1], x[0])):
            if all(end <= s or start >= f for s, f, _ in taken):
                taken.append((start, end, e))
        out: list[Entry] = []
        for _, _, e in sorted(taken, key=lambda x: x[0]):
            if all(e.target != o.target for o in out):
                out.append(e)
        return out


def _entry(source: str, target: str, where: str) -> Entry:
    source, target = " ".join(source.split()), " ".join(target.split())
    if not source or not target:
        raise GlossaryError(f"{where}: an empty {'source' if not source else 'target'} term")
    if max(len(source), len(target)) > MAX_TERM_CHARS:
        raise GlossaryError(f"{where}: a term longer than {MAX_TERM_CHARS} characters")
    return Entry(source, target, where)


def target_phrases(tokenizer, lines: list[str], glossary: Glossary | None = None,
                   constraints: list[list[str]] | None = None) -> list[list[list[int]]]:
    """Per line, the target phrases (subword ids) its output must hold: the glossary's target terms
    whose source terms occur in it, then the line's own `constraints` (target texts). A term the
    vocabulary cannot write (an unknown character), or more than MAX_PHRASES for one line: GlossaryError
    naming the entry or the line."""
    if constraints is not None and len(constraints) != len(lines):
        raise GlossaryError(f"{len(constraints)} constraint lists for {len(lines)} lines")
    out = []
    for n, line in enumerate(lines):
        terms = [(e.target, e.where) for e in glossary.matches(line)] if glossary is not None else []
        for m, c in enumerate(constraints[n] if constraints is not None else [], 1):
            if not isinstance(c, str) or not " ".join(c.split()) or len(c) > MAX_TERM_CHARS:
                raise GlossaryError(f"line {n + 1}: constraint {m} is not a term of 1 to {MAX_TERM_CHARS} characters")
            terms.append((" ".join(c.split()), f"line {n + 1}'s constraint {m}"))
        if len(terms) > MAX_PHRASES:
            raise GlossaryError(f"line {n + 1}: {len(terms)} terms to place; at most {MAX_PHRASES} per sentence")
        ids = tokenizer.encode_target([t for t, _ in terms]) if terms else []
        for (term, where), x in zip(terms, ids):
            if UNK in x or not x:
                raise GlossaryError(f"{where}: the target term {term!r} has characters this model's vocabulary "
                                    "cannot write")
        out.append(unique_phrases(ids))
    return out

