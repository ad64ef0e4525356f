"""A model's target languages (not in the paper, which trains one pair): the tag a multilingual
source carries (Johnson et al. 2017's `<2xx>`, Marian's `>>xxx<<`) and `aiayn tune`'s setting per
target language as a checkpoint records it."""

from __future__ import annotations

from ..config import ConfigError
from ..data.tokenizer import Tokenizer
from ..presets import DECODE_LIMITS


def recorded_languages(extra: dict) -> tuple[tuple[str, str] | None, list[str], dict[str, tuple[int, float]]]:
    """What a checkpoint's extra records of its languages (checked: bounded, typed): the (source,
    target) pair, a multilingual model's directions (data/directions.py) and tune's setting per target."""
    pair, ways = extra.get("languages"), extra.get("directions")
    ok = isinstance(pair, dict) and all(isinstance(pair.get(k), str) and len(pair[k]) <= 16 for k in ("src", "tgt"))
    directions = ways[:1000] if isinstance(ways, list) and all(
        isinstance(x, str) and len(x) <= 40 for x in ways[:1000]) else []
    return ((pair["src"], pair["tgt"]) if ok else None), directions, tuned_by_language(extra)


def tuned_by_language(extra: dict) -> dict[str, tuple[int, float]]:
    """`aiayn tune`'s choice per target language from a checkpoint's extra (checked: bounded, typed)."""
    tuned = extra.get("tuned")
    table = tuned.get("by_language") if isinstance(tuned, dict) else None
    out: dict[str, tuple[int, float]] = {}
    for lang, entry in (table.items() if isinstance(table, dict) else []):
        chosen = entry.get("chosen") if isinstance(entry, dict) else None
        if (isinstance(lang, str) and len(lang) <= 16 and isinstance(chosen, dict)
                and isinstance(chosen.get("beam"), int) and 1 <= chosen["beam"] <= DECODE_LIMITS["beam"]
                and isinstance(chosen.get("alpha"), (int, float)) and 0 <= chosen["alpha"] <= DECODE_LIMITS["alpha"]):
            out[lang] = (chosen["beam"], float(chosen["alpha"]))
    return out


def tag_lines(tokenizer, lines: list[str], tgt_lang: str | None, known: list[str]) -> list[str]:
    """The lines as the model reads them for target language `tgt_lang` (`fra` or `>>fra<<`; `known`:
    the languages the model translates into): a multilingual model's tag in front of each non-empty
    line (`>>fra<<` for Marian's, `<2fr>` for aiayn's); a model of one target takes its own and no
    tag. A language the model does not know: one line naming those it does; none named for an aiayn
    model of several targets, on a line without its tag: one line asking for it."""
    codes = getattr(tokenizer, "language_codes", [])
    if tgt_lang is None and isinstance(tokenizer, Tokenizer) and codes:  # trained with a tag on every source
        if len(codes) == 1:
            tgt_lang = codes[0]
        elif any(x.strip() and not x.strip().startswith(tuple(map(tokenizer.tag, codes))) for x in lines):
            raise ConfigError(f"this model translates into {', '.join(codes)}: name the target language "
                              "(--tgt-lang, the request's \"tgt\", tgt_lang=)")
    if tgt_lang is None:
        return lines
    code = tgt_lang[2:-2] if tgt_lang.startswith(">>") and tgt_lang.endswith("<<") else tgt_lang
    if code not in known:
        raise ConfigError(f"target language {tgt_lang!r}: this model translates into "
                          + (", ".join(known[:40]) + (f" and {len(known) - 40} more" if len(known) > 40 else "")
                             if known else "one language its checkpoint does not name (leave out --tgt-lang)"))
    if not codes:
        return lines
    return [f"{tokenizer.tag(code)} {line.strip()}" if line.strip() else line for line in lines]
