"""Head-rule dependency conversion on hand-made trees, checked against arcs worked out by hand."""

from aiayn.parsing.deps import dependencies, head_child
from aiayn.parsing.trees import clean, read_trees


def deps(text: str) -> list[int]:
    return dependencies(clean(read_trees(text)[0]))


def test_a_transitive_sentence():
    # John saw a cat with a hat: saw is the root; John, cat and with hang on saw (VP's head is VBD)
    tree = "( (S (NP-SBJ (NNP John)) (VP (VBD saw) (NP (DT a) (NN cat)) (PP (IN with) (NP (DT a) (NN hat))))))"
    assert deps(tree) == [1, -1, 3, 1, 1, 6, 4]


def test_noun_phrase_rules_and_empty_elements():
    # the last noun heads an NP; a possessive NP is headed by its POS; -NONE- leaves are dropped
    tree = "( (S (NP (NP (NNP Mary) (POS 's)) (JJ big) (NN dog)) (VP (VBZ barks) (S (NP (-NONE- *)))) (. .)))"
    # words: Mary 's big dog barks .
    assert deps(tree) == [1, 3, 3, 4, -1, 4]


def test_head_child_follows_direction_and_priority():
    assert head_child("VP", ["ADVP", "VBD", "NP", "VBN"]) == 1  # VBD before VBN in VP's list
    assert head_child("ADVP", ["RB", "RB"]) == 1  # ADVP scans right to left
    assert head_child("PP", ["IN", "NP"]) == 0
    assert head_child("UNKNOWN", ["A", "B"]) == 0  # no rule: the first child from the left
