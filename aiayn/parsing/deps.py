"""Constituency trees to unlabeled dependency arcs, by head rules (for the heads' syntactic role).

Each phrase's head child is found with Collins's (1999, Appendix A) head table: for each label in
the rule's priority list, the children are scanned in the rule's direction and the first child with
that label is the head; with no match, the first child in that direction. Noun phrases use Collins's
special rule. A word's dependency head is the lexical head of the smallest constituent whose head
it does not carry. Trees are those `parse.clean` leaves (no empty elements, no function tags).
"""

from __future__ import annotations

from .trees import Tree

# label -> (direction, priority); "left": scan children left to right, "right": right to left
HEAD_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ADJP": ("left", ("NNS", "QP", "NN", "$", "ADVP", "JJ", "VBN", "VBG", "ADJP", "JJR", "NP", "JJS", "DT", "FW",
                      "RBR", "RBS", "SBAR", "RB")),
    "ADVP": ("right", ("RB", "RBR", "RBS", "FW", "ADVP", "TO", "CD", "JJR", "JJ", "IN", "NP", "JJS", "NN")),
    "CONJP": ("right", ("CC", "RB", "IN")),
    "FRAG": ("right", ()),
    "INTJ": ("left", ()),
    "LST": ("right", ("LS", ":")),
    "NAC": ("left", ("NN", "NNS", "NNP", "NNPS", "NP", "NAC", "EX", "$", "CD", "QP", "PRP", "VBG", "JJ", "JJS", "JJR",
                     "ADJP", "FW")),
    "PP": ("right", ("IN", "TO", "VBG", "VBN", "RP", "FW")),
    "PRN": ("left", ()),
    "PRT": ("right", ("RP",)),
    "QP": ("left", ("$", "IN", "NNS", "NN", "JJ", "RB", "DT", "CD", "NCD", "QP", "JJR", "JJS")),
    "RRC": ("right", ("VP", "NP", "ADVP", "ADJP", "PP")),
    "S": ("left", ("TO", "IN", "VP", "S", "SBAR", "ADJP", "UCP", "NP")),
    "SBAR": ("left", ("WHNP", "WHPP", "WHADVP", "WHADJP", "IN", "DT", "S", "SQ", "SINV", "SBAR", "FRAG")),
    "SBARQ": ("left", ("SQ", "S", "SINV", "SBARQ", "FRAG")),
    "SINV": ("left", ("VBZ", "VBD", "VBP", "VB", "MD", "VP", "S", "SINV", "ADJP", "NP")),
    "SQ": ("left", ("VBZ", "VBD", "VBP", "VB", "MD", "VP", "SQ")),
    "UCP": ("right", ()),
    "VP": ("left", ("TO", "VBD", "VBN", "MD", "VBZ", "VB", "VBG", "VBP", "VP", "ADJP", "NN", "NNS", "NP")),
    "WHADJP": ("left", ("CC", "WRB", "JJ", "ADJP")),
    "WHADVP": ("right", ("CC", "WRB")),
    "WHNP": ("left", ("WDT", "WP", "WP$", "WHADJP", "WHPP", "WHNP")),
    "WHPP": ("right", ("IN", "TO", "FW")),
}
PUNCT_TAGS = {",", ":", ".", "``", "''", "-LRB-", "-RRB-", "#", "$"}


def _np_head(labels: list[str]) -> int:
    """Collins's noun-phrase rule."""
    n = len(labels)
    if labels[-1] == "POS":
        return n - 1
    passes = [(range(n - 1, -1, -1), {"NN", "NNP", "NNPS", "NNS", "NX", "POS", "JJR"}), (range(n), {"NP"}),
              (range(n - 1, -1, -1), {"$", "ADJP", "PRN"}), (range(n - 1, -1, -1), {"CD"}),
              (range(n - 1, -1, -1), {"JJ", "JJS", "RB", "QP"})]
    for order, wanted in passes:
        for i in order:
            if labels[i] in wanted:
                return i
    return n - 1


def head_child(label: str, labels: list[str]) -> int:
    """Index of the head among children with these labels."""
    if label in ("NP", "NX", "NML", "X"):
        return _np_head(labels)
    direction, priority = HEAD_RULES.get(label, ("left", ()))
    order = list(range(len(labels))) if direction == "left" else list(range(len(labels) - 1, -1, -1))
    for wanted in priority:
        for i in order:
            if labels[i] == wanted:
                return i
    return order[0]


def dependencies(tree: Tree) -> list[int]:
    """For each word of the tree, the index of its head word; -1 for the root."""
    heads: list[int] = []

    def walk(t: Tree) -> int:  # returns the index of t's lexical head
        if t.is_preterminal:
            heads.append(-1)
            return len(heads) - 1
        kids = [c for c in t.children if isinstance(c, Tree)]
        lex = [walk(c) for c in kids]
        h = lex[head_child(t.label, [c.label for c in kids])]
        for w in lex:
            if w != h:
                heads[w] = h
        return h

    walk(tree)
    return heads
