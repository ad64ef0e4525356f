"""The reference aligner (IBM Model 2 with a diagonal prior, symmetrized) and AER, against known truth."""

import random

import pytest

from aiayn.data.ibm import align, symmetrize
from aiayn.score import aer, pharaoh, read_pharaoh


def _corpus(n: int = 400, seed: int = 0):
    """A toy language pair with a known alignment: a word-for-word lexicon, and adjacent adjectives and
    nouns swapped on the target side (so the truth is not the diagonal)."""
    rng = random.Random(seed)
    adjs, nouns, verbs = ["big", "red", "old", "small"], ["dog", "cat", "man", "house", "car"], ["sees", "likes"]
    lex = {w: w.upper() + "x" for w in adjs + nouns + verbs}
    src, tgt, gold = [], [], []
    for _ in range(n):
        s = [rng.choice(adjs), rng.choice(nouns), rng.choice(verbs), rng.choice(adjs), rng.choice(nouns)]
        order = [1, 0, 2, 4, 3]  # target position j holds source word order[j]
        src.append(s)
        tgt.append([lex[s[i]] for i in order])
        gold.append({(i, j) for j, i in enumerate(order)})
    return src, tgt, gold


def test_the_reference_aligner_recovers_a_known_alignment():
    src, tgt, gold = _corpus()
    found = align(src, tgt)
    assert aer(found, gold, gold) < 0.05


def test_aer_is_och_and_neys_formula():
    a, s, p = [{(0, 0), (1, 1), (2, 2)}], [{(0, 0), (1, 2)}], [{(1, 1)}]
    # |A∩S| = 1, |A∩P| (P ⊇ S) = 2, |A| = 3, |S| = 2: 1 - 3/5
    assert aer(a, s, p) == pytest.approx(0.4)
    assert aer(s, s, s) == 0.0 and aer([set()], s, p) == 1.0


def test_pharaoh_round_trip_and_bad_links():
    sure, possible = read_pharaoh("0-0 2-1 1?2")
    assert sure == {(0, 0), (2, 1)} and possible == {(1, 2)}
    assert read_pharaoh(pharaoh(sure))[0] == sure
    with pytest.raises(ValueError, match="not an alignment link"):
        read_pharaoh("0-0 x-1")


def test_grow_diag_final_and_keeps_the_intersection_and_fills_unaligned_words():
    forward, backward = {(0, 0), (1, 1), (2, 1)}, {(0, 0), (1, 1), (2, 2)}
    links = symmetrize(forward, backward)
    assert {(0, 0), (1, 1)} <= links and (2, 2) in links  # 2 unaligned on both sides after growing: added
