"""§6.1's search: raw text in, translations out.

Read first: translator.py (`Translator`), then search.py (greedy and beam search over any
`IncrementalDecoder`), beams.py (their bookkeeping), sampling.py (drawn translations), constraints.py
and glossary.py (terms the output must hold) and fast/ (the fused decoder step).
"""

from ..doors import lazy

__all__ = [
    "AttentionData", "Ensemble", "Glossary", "Hypothesis", "Sampling", "Shortlist", "Translation", "Translator",
    "attention_data", "beam_search", "constrained_beam_search", "greedy_search", "length_penalty", "translate_markup",
    "translate_paragraphs", "tune"
]
__getattr__, __dir__ = lazy(__name__, {
    "Translator": "translator",
    "Translation": "translator",
    "beam_search": "search",
    "greedy_search": "search",
    "Hypothesis": "beams",
    "Sampling": "sampling",
    "length_penalty": "beams",
    "AttentionData": "maps",
    "attention_data": "maps",
    "Ensemble": "ensemble",
    "Glossary": "glossary",
    "constrained_beam_search": "constraints",
    "Shortlist": "shortlist",
    "tune": "tune",
    "translate_markup": "markup",
    "translate_paragraphs": "document",
})
