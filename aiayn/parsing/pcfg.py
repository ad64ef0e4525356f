"""§6.3's yardstick: a treebank PCFG (Charniak 1996) read off the training trees, parsed with CKY.

The grammar is over part-of-speech tags (the parser is given the gold tags, as treebank-grammar
baselines are): every rule of the training trees with its relative frequency, n-ary rules
binarized from the left with one intermediate symbol per parent (``NP|``, no further context),
unary chains of up to ``UNARY`` rules closed in every cell. The best tree is the Viterbi one; a
sentence the grammar cannot cover is parsed right-branching and counted.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from .trees import Tree, right_branching

UNARY = 3  # unary rules in a row within one cell (the sample's chains reach 3 above a tag)


def _binarize(t: Tree, rules: Counter) -> str:
    """Count the rules of `t` (tags as terminals) and return its label."""
    if t.is_preterminal:
        return t.label
    kids = [_binarize(c, rules) for c in t.children if isinstance(c, Tree)]
    lhs, bar = t.label, t.label + "|"
    while len(kids) > 2:  # A -> X1 A| ; A| -> X2 A| ... ; A| -> Xn-1 Xn
        rules[(lhs, kids[0], bar)] += 1
        kids, lhs = kids[1:], bar
    rules[(lhs, *kids)] += 1
    return t.label


@dataclass
class PCFG:
    symbols: list[str]
    binary: torch.Tensor  # (R2, 3) long: A, B, C
    binary_lp: torch.Tensor  # (R2,)
    unary: torch.Tensor  # (R1, 2) long: A, B
    unary_lp: torch.Tensor  # (R1,)
    root_lp: torch.Tensor  # (S,) log P(root label)

    @classmethod
    def read_off(cls, trees: list[Tree]) -> PCFG:
        """Relative-frequency estimates of every (binarized) rule of `trees`."""
        rules: Counter = Counter()
        roots = Counter(_binarize(t, rules) for t in trees)
        lhs: Counter = Counter()
        for r, n in rules.items():
            lhs[r[0]] += n
        symbols = sorted({s for r in rules for s in r})
        idx = {s: i for i, s in enumerate(symbols)}
        two = [(r, n) for r, n in rules.items() if len(r) == 3]
        one = [(r, n) for r, n in rules.items() if len(r) == 2]
        root_lp = torch.full((len(symbols),), -math.inf)
        for s, n in roots.items():
            root_lp[idx[s]] = math.log(n / len(trees))
        return cls(symbols, torch.tensor([[idx[s] for s in r] for r, _ in two]),
                   torch.tensor([math.log(n / lhs[r[0]]) for r, n in two]),
                   torch.tensor([[idx[s] for s in r] for r, _ in one]).view(-1, 2),
                   torch.tensor([math.log(n / lhs[r[0]]) for r, n in one]), root_lp)

    def logprob(self, tree: Tree) -> float:
        """log P(tree) under the grammar: its binarized rules and its root (a second code path to CKY's score)."""
        rules: Counter = Counter()
        root = _binarize(tree, rules)
        idx = {s: i for i, s in enumerate(self.symbols)}
        lp = {tuple(r): float(x) for r, x in zip(self.binary.tolist(), self.binary_lp)}
        lp.update({tuple(r): float(x) for r, x in zip(self.unary.tolist(), self.unary_lp)})
        try:
            return float(self.root_lp[idx[root]]) + sum(n * lp[tuple(idx[s] for s in r)] for r, n in rules.items())
        except KeyError:
            return -math.inf

    def _unary_closure(self, cell: torch.Tensor) -> list[torch.Tensor]:
        """Apply unary rules UNARY times; returns each round's pointer (-1: kept, else the child)."""
        ptrs = []
        A, B = self.unary[:, 0], self.unary[:, 1]
        for _ in range(UNARY):
            cand = cell[B] + self.unary_lp
            best = torch.full_like(cell, -math.inf).scatter_reduce(0, A, cand, "amax")
            better = best > cell
            ptr = torch.full(cell.shape, -1, dtype=torch.long)
            if better.any():
                winner = torch.full(cell.shape, -1, dtype=torch.long)
                hit = cand == best[A]
                winner[A[hit]] = B[hit]
                ptr = torch.where(better, winner, ptr)
                cell = torch.where(better, best, cell)
            ptrs.append(ptr)
        return [cell, *ptrs]

    def parse(self, tagged: list[tuple[str, str]]) -> Tree | None:
        """The Viterbi tree over `tagged` (tag, word) pairs, or None if the grammar has none."""
        n, S = len(tagged), len(self.symbols)
        idx = {s: i for i, s in enumerate(self.symbols)}
        chart: dict[tuple[int, int], list[torch.Tensor]] = {}
        split: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        for i, (tag, _) in enumerate(tagged):
            cell = torch.full((S,), -math.inf)
            if tag in idx:
                cell[idx[tag]] = 0.0
            chart[i, i + 1] = self._unary_closure(cell)
        A, B, C = self.binary[:, 0], self.binary[:, 1], self.binary[:, 2]
        for length in range(2, n + 1):
            for i in range(n - length + 1):
                j = i + length
                left = torch.stack([chart[i, k][0][B] for k in range(i + 1, j)])  # (K, R2)
                right = torch.stack([chart[k, j][0][C] for k in range(i + 1, j)])
                cand, k_best = (left + right + self.binary_lp).max(0)
                cell = torch.full((S,), -math.inf).scatter_reduce(0, A, cand, "amax")
                rule = torch.full((S,), -1, dtype=torch.long)
                hit = (cand == cell[A]) & torch.isfinite(cand)
                rule[A[hit]] = hit.nonzero().squeeze(1)
                split[i, j] = (rule, k_best + i + 1, cand)
                chart[i, j] = self._unary_closure(cell)
        top = chart[0, n][0] + self.root_lp
        if not torch.isfinite(top.max()):
            return None
        return self._build(int(top.argmax()), 0, n, tagged, chart, split)

    def _build(self, sym: int, i: int, j: int, tagged, chart, split) -> Tree:
        chain = [sym]
        for ptr in reversed(chart[i, j][1:]):  # undo the unary rounds, last first
            if ptr[chain[-1]] >= 0:
                chain.append(int(ptr[chain[-1]]))
        bottom = chain[-1]
        if j == i + 1:
            node = Tree(tagged[i][0], [tagged[i][1]])
        else:
            rule, ks, _ = split[i, j]
            r = int(rule[bottom])
            k = int(ks[r])
            kids = [self._build(int(self.binary[r, 1]), i, k, tagged, chart, split),
                    self._build(int(self.binary[r, 2]), k, j, tagged, chart, split)]
            node = Tree(self.symbols[bottom], _splice(kids))
        for s in reversed(chain[:-1]):
            node = Tree(self.symbols[s], [node])
        return node


def _splice(kids: list[Tree]) -> list[Tree | str]:
    """Intermediate symbols (``NP|``) dissolve into their parent."""
    out: list[Tree | str] = []
    for k in kids:
        out.extend(k.children if k.label.endswith("|") else [k])
    return out


def pcfg_parses(train: list[Tree], gold: list[Tree]) -> tuple[list[Tree], int]:
    """Every gold sentence parsed by the training trees' PCFG from its gold tags; and how many
    the grammar could not cover (parsed right-branching instead)."""
    grammar = PCFG.read_off(train)
    out, failed = [], 0
    for g in gold:
        t = grammar.parse(g.tagged())
        if t is None:
            failed += 1
            t = right_branching(g.words(), [tag for tag, _ in g.tagged()])
        out.append(t)
    return out, failed

