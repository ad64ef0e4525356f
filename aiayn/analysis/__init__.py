"""Figures 3-5 measured: attention maps drawn, what each head does, which head aligns words.

Read first: plot.py (the maps and the curves), then heads.py (each head's effect, measured) and
alignment_head.py (the head `aiayn align` picks by AER).
"""

from ..doors import lazy

__all__ = ["ATTENTION_MAPS", "choose_head", "measure", "plot_attention", "plot_curves"]
__getattr__, __dir__ = lazy(__name__, {
    "plot_attention": "plot",
    "plot_curves": "plot",
    "ATTENTION_MAPS": "plot",
    "measure": "heads_report",
    "choose_head": "alignment_head",
})
