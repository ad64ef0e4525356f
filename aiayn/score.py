"""BLEU and chrF with sacreBLEU on detokenized text (the paper reported tokenized BLEU, §6.1)."""

from __future__ import annotations

import sacrebleu


def score(hyps: list[str], refs: list[str]) -> str:
    """Two lines: BLEU and chrF with their sacreBLEU signatures."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return f"{b} ({bleu.get_signature()})\n{c} ({chrf.get_signature()})"
