"""BLEU and chrF with sacreBLEU on detokenized text; the paper's tokenized BLEU beside it (§6.1).

The paper's EN-DE numbers (Table 2) are tokenized BLEU as tensor2tensor's `get_ende_bleu.sh`
computes it: Moses `tokenizer.perl -l de` on both sides, compounds split as
``rich ##AT##-##AT## text``, then `multi-bleu.perl`. That number runs about 1 BLEU above
sacreBLEU on the same output and is comparable only with other tokenized numbers.
"""

from __future__ import annotations

import re
from functools import cache

import sacrebleu

_COMPOUND = re.compile(r"(\S)-(\S)")


def score(hyps: list[str], refs: list[str]) -> str:
    """Two lines: BLEU and chrF with their sacreBLEU signatures."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return f"{b} ({bleu.get_signature()})\n{c} ({chrf.get_signature()})"


@cache
def _moses(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def paper_tokenize(line: str, lang: str = "de") -> str:
    """`tokenizer.perl -l LANG` (escaping included), then `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`."""
    tokenized = _moses(lang).tokenize(line, return_str=True, escape=True)
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def paper_bleu(hyps: list[str], refs: list[str], lang: str = "de") -> sacrebleu.metrics.bleu.BLEUScore:
    """§6.1 tokenized BLEU (t2t `get_ende_bleu.sh`): `multi-bleu.perl` on Moses-tokenized,
    compound-split text — case-sensitive corpus BLEU over whitespace tokens, no smoothing."""
    metric = sacrebleu.BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score([paper_tokenize(h, lang) for h in hyps], [[paper_tokenize(r, lang) for r in refs]])


def paper_score(hyps: list[str], refs: list[str], lang: str = "de") -> str:
    """One line, labelled so that nobody takes it for sacreBLEU."""
    b = paper_bleu(hyps, refs, lang)
    return (f"paper BLEU (tokenized: Moses -l {lang}, compounds split, multi-bleu; NOT comparable to sacreBLEU) = "
            f"{b.score:.2f} {'/'.join(f'{p:.1f}' for p in b.precisions)} (BP = {b.bp:.3f} ratio = "
            f"{b.sys_len / max(b.ref_len, 1):.3f} hyp_len = {b.sys_len} ref_len = {b.ref_len})")


Links = set[tuple[int, int]]  # word alignments: (source position, target position)


def aer(predicted: list[Links], sure: list[Links], possible: list[Links]) -> float:
    """Alignment error rate (Och & Ney, 2003) over a corpus, sure links S ⊆ possible P:
    AER = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|)."""
    a_s = a_p = n_a = n_s = 0
    for a, s, p in zip(predicted, sure, possible, strict=True):
        p = p | s
        a_s, a_p, n_a, n_s = a_s + len(a & s), a_p + len(a & p), n_a + len(a), n_s + len(s)
    return 1.0 - (a_s + a_p) / max(n_a + n_s, 1)


def read_pharaoh(line: str) -> tuple[Links, Links]:
    """`0-0 1-2 2?1`: sure links `i-j`, possible links `i?j` (source i, target j); ValueError if malformed."""
    sure, possible = set(), set()
    for item in line.split():
        sep = "-" if "-" in item else "?"
        i, _, j = item.partition(sep)
        if not (i.isdigit() and j.isdigit()):
            raise ValueError(f"not an alignment link: {item!r} (expected i-j or i?j)")
        (sure if sep == "-" else possible).add((int(i), int(j)))
    return sure, possible


def pharaoh(links: Links) -> str:
    """Links as Pharaoh's `i-j` pairs, source first, sorted."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))
