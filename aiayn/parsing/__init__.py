"""§6.3: English constituency parsing with the translation model.

Read first: trees.py (treebanks, linearized trees, EVALB), then treebank_data.py (a treebank
prepared like a corpus), model.py (the parser's inputs) and treesearch.py (`Parser`).
"""

from ..doors import lazy

__all__ = ["Parser", "Tagger", "build_any", "evalb", "prepare_treebank", "read_treebank"]
__getattr__, __dir__ = lazy(__name__, {
    "Parser": "treesearch",
    "build_any": "model",
    "prepare_treebank": "treebank_data",
    "read_treebank": "trees",
    "evalb": "trees",
    "Tagger": "tagger",
})
