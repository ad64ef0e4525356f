"""A confidence for every translation (not in the paper): signals read off the search and the
alignment head, and one flag for a likely failure whose rule is stated in FLAG_RULES.

- mean_logprob: log p(y | x) / (|y| + 1), the model's confidence per subword (EOS counted);
- normalized: the search's own score (beam search: over §6.1's lp(|Y|); greedy and sampling: the total);
- length_ratio: target subwords / source subwords;
- repeated: the most times one n-gram (n <= 4 subwords) follows itself back to back (a loop: 3 or more);
- coverage: the share of source words the alignment head links some target word to (decode/align.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..score import Links
from .beams import Hypothesis, length_penalty

# The flag's rule, one reason per line: a translation is flagged with every reason that holds. Set by
# hand (not tuned here); bench/quality measures each signal's AUROC on broken outputs.
FLAG_RULES = {
    "unsure": ("mean_logprob", "<", -2.0),
    "short": ("length_ratio", "<", 0.5),
    "long": ("length_ratio", ">", 2.0),
    "loop": ("repeated", ">=", 3),
    "uncovered": ("coverage", "<", 0.5),
}
FIELDS = ("mean_logprob", "normalized", "length_ratio", "repeated", "coverage", "flag")


@dataclass
class Quality:
    mean_logprob: float
    normalized: float
    length_ratio: float
    repeated: int
    coverage: float
    flag: str  # "" or the reasons that hold, comma-separated ("loop,long")

    def row(self) -> str:
        """One TSV line in FIELDS' order."""
        return "\t".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in asdict(self).values())


def repeats(tokens: list[int], most_n: int = 4) -> int:
    """The most times an n-gram (n <= most_n) occurs back to back in `tokens` (1: no repeat)."""
    best = 1 if tokens else 0
    for n in range(1, most_n + 1):
        for start in range(len(tokens) - 2 * n + 1):
            gram, k = tokens[start:start + n], 1
            while tokens[start + k * n:start + (k + 1) * n] == gram:
                k += 1
            best = max(best, k)
    return best


def flag(q: dict) -> str:
    """The reasons of FLAG_RULES that hold for signals `q` (NaN holds none)."""
    tests = {"<": lambda a, b: a < b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}
    return ",".join(name for name, (field, op, bound) in FLAG_RULES.items() if tests[op](q[field], bound))


def quality(src: list[int], hyp: Hypothesis | None, words: int, links: Links | None, beam: int, alpha: float
            ) -> Quality:
    """The signals of one translation: `src` the source ids with EOS, `hyp` its best hypothesis (None:
    an empty line), `words` the source's words, `links` its word links (None: not read)."""
    if hyp is None:
        return Quality(0.0, 0.0, 0.0, 0, math.nan, "")
    n = len(hyp.tokens) + 1
    total = hyp.score * float(length_penalty(n, alpha)) if beam > 1 else hyp.score
    q = {"mean_logprob": total / n, "normalized": hyp.score, "length_ratio": len(hyp.tokens) / max(len(src) - 1, 1),
         "repeated": repeats(hyp.tokens), "coverage": len({i for i, _ in links}) / max(words, 1) if links is not None
         else math.nan}
    return Quality(**q, flag=flag(q))
