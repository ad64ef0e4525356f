"""The treebank-PCFG baseline (§6.3's yardstick): CKY's Viterbi tree against brute-force enumeration
of every derivation, and against trees the grammar was read from."""

import itertools
import math
import random

import pytest

from aiayn.parsing.pcfg import PCFG, UNARY, pcfg_parses
from aiayn.parsing.trees import read_trees

TRAIN = """
(S (NP (DT the) (NN dog)) (VP (VBD saw) (NP (NP (DT a) (NN cat)) (PP (IN with) (NP (DT a) (NN hat))))) (. .))
(S (NP (DT the) (NN dog)) (VP (VBD saw) (NP (DT a) (NN cat)) (PP (IN with) (NP (DT a) (NN hat)))) (. .))
(S (NP (DT the) (NN dog)) (VP (VBD saw) (NP (DT a) (NN cat)) (PP (IN with) (NP (NN joy)))) (. .))
(S (NP (PRP it)) (VP (VBD ran)) (. .))
(S (NP (NP (DT the) (JJ big) (NN dog)) (SBAR (S (VP (VBD ran))))) (VP (VBD left)) (. .))
(S (VP (VB go)) (. .))
"""


def _derivations(g: PCFG, tags: list[str]) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """Brute force: every (symbol, log-probability) derivable over every span, by enumeration."""
    idx = {s: i for i, s in enumerate(g.symbols)}
    binary = list(zip(g.binary.tolist(), g.binary_lp.tolist()))
    unary = list(zip(g.unary.tolist(), g.unary_lp.tolist()))
    out: dict = {}

    def close(items):
        every, frontier = list(items), list(items)
        for _ in range(UNARY):
            frontier = [(a, lp + x) for s, lp in frontier for (a, b), x in unary if b == s]
            every += frontier
        return every

    n = len(tags)
    for i in range(n):
        out[i, i + 1] = close([(idx[tags[i]], 0.0)] if tags[i] in idx else [])
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length
            items = [(a, lb + lc + x) for k in range(i + 1, j) for (sb, lb) in out[i, k] for (sc, lc) in out[k, j]
                     for (a, b, c), x in binary if b == sb and c == sc]
            out[i, j] = close(items)
    return out


def test_viterbi_tree_is_the_best_derivation_brute_force():
    trees = read_trees(TRAIN)
    g = PCFG.read_off(trees)
    rng = random.Random(0)
    tag_pool = ["DT", "NN", "VBD", "IN", "NN", "JJ", "."]
    cases = [[t for t, _ in tr.tagged()] for tr in trees] + [rng.choices(tag_pool, k=rng.randint(2, 6))
                                                             for _ in range(30)]
    covered = 0
    for tags in cases:
        best = max((lp + float(g.root_lp[s]) for s, lp in _derivations(g, tags)[0, len(tags)]), default=-math.inf)
        tree = g.parse([(t, f"w{i}") for i, t in enumerate(tags)])
        if best == -math.inf:
            assert tree is None
            continue
        covered += 1
        assert tree.words() == [f"w{i}" for i in range(len(tags))]
        assert g.logprob(tree) == pytest.approx(best, abs=1e-4)
    assert covered >= 8


def test_grammar_probabilities_are_relative_frequencies():
    g = PCFG.read_off(read_trees(TRAIN))
    vp = [lp for (a, _, _), lp in zip(g.binary.tolist(), g.binary_lp.tolist()) if g.symbols[a] == "VP"]
    vp += [lp for (a, _), lp in zip(g.unary.tolist(), g.unary_lp.tolist()) if g.symbols[a] == "VP"]
    assert sum(math.exp(x) for x in vp) == pytest.approx(1.0)
    # PP attachment: one tree of three attaches to the NP, two to the VP: the VP reading wins
    (t,) = pcfg_parses(read_trees(TRAIN), read_trees(TRAIN)[:1])[0]
    assert "(VP (VBD saw) (NP (DT a) (NN cat)) (PP" in str(t)


def test_uncovered_sentences_fall_back_and_are_counted():
    gold = read_trees("(S (UH wow) (UH wow))")
    trees, failed = pcfg_parses(read_trees(TRAIN), gold)
    assert failed == 1 and trees[0].words() == ["wow", "wow"]
    assert list(itertools.chain(*[t.words() for t in trees])) == ["wow", "wow"]
