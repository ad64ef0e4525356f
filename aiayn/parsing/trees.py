"""§6.3: English constituency parsing as translation, words in, linearized trees out.

Trees follow the usual WSJ clean-up (no `-NONE-` elements or the constituents they empty, no
function tags or indices, no outer empty bracket). The target is the linearization of Vinyals &
Kaiser et al. (2015), which §6.3 follows: labelled brackets, every part-of-speech tag and word
replaced by one placeholder, ``(S (NP XX XX )NP (VP XX )VP XX )S``, so the output vocabulary is
small. Decoded sequences are repaired into well-formed trees holding exactly the input's words,
and scored as EVALB does with COLLINS.prm (punctuation deleted, ADVP = PRT, part-of-speech
brackets not counted, every other constituent counted, the top S included).
"""

from __future__ import annotations

import re
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AiaynError

LEAF = "XX"  # the placeholder for a part-of-speech tag and its word
PUNCT = {",", ":", "``", "''", "."}  # COLLINS.prm DELETE_LABEL (punctuation tags)
EQ_LABELS = {"PRT": "ADVP"}  # COLLINS.prm EQ_LABEL ADVP PRT


class TreeError(AiaynError):
    """A malformed tree; the message names the file and the tree number."""


@dataclass
class Tree:
    """A constituent: its label and children; a preterminal has one `str` child (the word)."""

    label: str
    children: list[Tree | str] = field(default_factory=list)

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def words(self) -> list[str]:
        return [w for _, w in self.tagged()]

    def tagged(self) -> list[tuple[str, str]]:
        if self.is_preterminal:
            return [(self.label, self.children[0])]  # type: ignore[list-item]
        return [tw for c in self.children if isinstance(c, Tree) for tw in c.tagged()]

    def __str__(self) -> str:
        if self.is_preterminal:
            return f"({self.label} {self.children[0]})"
        return f"({self.label} {' '.join(str(c) for c in self.children)})"


# -- reading -------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
MAX_DEPTH = 500  # brackets inside brackets; treebank trees stay under 50, and the tree code recurses


def read_trees(text: str, name: str = "<text>") -> list[Tree]:
    """Every bracketed tree in `text` (s-expressions; the outer bracket may have no label)."""
    trees: list[Tree] = []
    stack: list[Tree] = []
    tokens = _TOKEN.findall(text)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        where = f"{name}: tree {len(trees) + 1}"
        if tok == "(":
            label = ""
            if i + 1 < len(tokens) and tokens[i + 1] not in "()":
                label = tokens[i + 1]
                i += 1
            node = Tree(label)
            if len(stack) >= MAX_DEPTH:
                raise TreeError(f"{where}: brackets nested deeper than {MAX_DEPTH}")
            if stack:
                stack[-1].children.append(node)
            stack.append(node)
        elif tok == ")":
            if not stack:
                raise TreeError(f"{where}: ')' without an open bracket")
            node = stack.pop()
            if not node.children:
                raise TreeError(f"{where}: empty constituent ({node.label})")
            if not stack:
                trees.append(node)
        else:
            if not stack:
                raise TreeError(f"{where}: word {tok!r} outside any bracket")
            if stack[-1].children:
                raise TreeError(f"{where}: word {tok!r} beside constituents in ({stack[-1].label} ...)")
            stack[-1].children.append(tok)
        i += 1
    if stack:
        raise TreeError(f"{name}: tree {len(trees) + 1}: {len(stack)} bracket(s) never closed")
    return trees


def escape(word: str) -> str:
    """The treebank's spelling of a word: `(` as -LRB- and `)` as -RRB-, so no word reads as a bracket."""
    return word.replace("(", "-LRB-").replace(")", "-RRB-")


def _utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise TreeError(f"{where}: line {line}: invalid UTF-8 at byte {e.start}") from None


MAX_MRG_BYTES = 64 << 20  # one .mrg file (the WSJ's largest is under 1 MB); larger is refused unread
MAX_TREEBANK_BYTES = 256 << 20  # all .mrg files of a treebank (the whole WSJ: ~50 MB), whatever a zip claims


def _add(files: dict[str, str], where: dict[str, str], name: str, data: bytes, place: str) -> None:
    """One .mrg file's text under its base name, which must be new (the split follows the names)."""
    if name in files:
        raise TreeError(f"{place}: a second {name} (the first is {where[name]}); trees are split by file name, "
                        "so each must be unique")
    files[name], where[name] = _utf8(data, place), place


def _read_capped(opener, size: int, place: str) -> bytes:
    """At most MAX_MRG_BYTES, whatever a zip's header claims (a zip bomb claims little)."""
    if size > MAX_MRG_BYTES:
        raise TreeError(f"{place}: {size:,} bytes; a .mrg file may hold {MAX_MRG_BYTES:,}")
    try:
        with opener() as f:
            data = f.read(MAX_MRG_BYTES + 1)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:
        raise TreeError(f"{place}: not readable ({e})") from None
    if len(data) > MAX_MRG_BYTES:
        raise TreeError(f"{place}: more than {MAX_MRG_BYTES:,} bytes; a .mrg file may hold no more")
    return data


def read_treebank(path: Path) -> dict[str, list[Tree]]:
    """Trees by file name (`wsj_0001.mrg` ...) from a folder of .mrg files or NLTK's treebank.zip."""
    path = Path(path)
    files: dict[str, str] = {}
    where: dict[str, str] = {}
    total = [0]

    def add(name: str, data: bytes, place: str) -> None:  # every file counted against MAX_TREEBANK_BYTES
        total[0] += len(data)
        if total[0] > MAX_TREEBANK_BYTES:
            raise TreeError(f"{path}: its .mrg files hold more than {MAX_TREEBANK_BYTES:,} bytes in all (at {place}); "
                            "a treebank may hold no more")
        _add(files, where, name, data, place)

    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for info in sorted(z.infolist(), key=lambda i: i.filename):
                if info.filename.endswith(".mrg"):
                    place = f"{path}:{info.filename}"
                    add(Path(info.filename).name, _read_capped(lambda info=info: z.open(info), info.file_size, place),
                        place)
    elif path.is_dir():
        for f in sorted(path.rglob("*.mrg")):
            add(f.name, _read_capped(lambda f=f: open(f, "rb"), f.stat().st_size, str(f)), str(f))
    else:
        raise TreeError(f"{path}: not a folder of .mrg files or a treebank .zip")
    if not files:
        raise TreeError(f"{path}: no .mrg files found")
    return {n: read_trees(t, n) for n, t in files.items()}


# -- clean-up --------------------------------------------------------------------------------------
def strip_label(label: str) -> str:
    """`NP-SBJ-1` -> `NP`, `NP=2` -> `NP`; tags that start with '-' (`-NONE-`, `-LRB-`) are kept."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=|]", label)[0] or label


def clean(tree: Tree) -> Tree | None:
    """The WSJ conventions: no -NONE- leaves, no constituent they leave empty, no function tags,
    and no outer empty-labelled bracket. None if nothing is left."""

    def walk(t: Tree) -> Tree | None:
        if t.is_preterminal:
            return None if t.label == "-NONE-" else Tree(strip_label(t.label), list(t.children))
        kids = [k for k in (walk(c) for c in t.children if isinstance(c, Tree)) if k is not None]
        return Tree(strip_label(t.label), kids) if kids else None

    out = walk(tree)
    while out is not None and out.label == "" and len(out.children) == 1 and isinstance(out.children[0], Tree):
        out = out.children[0]
    return out


# -- linearization ---------------------------------------------------------------------------------
LINEARIZATIONS = ("words", "xx")  # ours (the default: copy-friendly) and the paper's (§6.3, Vinyals et al.)


def linearize(tree: Tree, words: bool = False) -> str:
    """Vinyals & Kaiser et al. (2015): `(S (NP XX XX )NP ... )S`, words and tags as XX; with `words`,
    each XX is the word itself (`(S (NP The dog )NP ... )S`): every leaf can copy its source word,
    and the decoder's input says which word it has reached."""
    if tree.is_preterminal:
        return tree.children[0] if words else LEAF  # type: ignore[return-value]
    inner = " ".join(linearize(c, words) for c in tree.children if isinstance(c, Tree))
    return f"({tree.label} {inner} ){tree.label}"


def delinearize(symbols: str, words: list[str], tags: list[str] | None = None) -> Tree:
    """A well-formed tree from a decoded sequence, whatever it holds, with exactly `words` at the
    leaves (tagged XX unless `tags` are given). Repairs, in order: a closing bracket with nothing
    open is dropped (its label is ignored); unknown symbols are dropped; leaves beyond the words
    are dropped and missing ones are added to the innermost open constituent at the end; open
    brackets are closed; constituents without leaves are removed; several top-level items go
    under one S."""
    tags = tags or [LEAF] * len(words)
    root = Tree("")
    stack = [root]
    n = 0
    for sym in symbols.split():
        if sym.startswith("(") and len(sym) > 1:
            node = Tree(sym[1:])
            stack[-1].children.append(node)
            stack.append(node)
        elif sym.startswith(")"):
            if len(stack) > 1:
                stack.pop()
        elif sym == LEAF and n < len(words):
            stack[-1].children.append(Tree(tags[n], [words[n]]))
            n += 1
    while n < len(words):
        stack[-1].children.append(Tree(tags[n], [words[n]]))
        n += 1

    def prune(t: Tree) -> Tree | None:
        if t.is_preterminal:
            return t
        kids = [k for k in (prune(c) for c in t.children if isinstance(c, Tree)) if k is not None]
        return Tree(t.label, kids) if kids else None

    top = [k for k in (prune(c) for c in root.children if isinstance(c, Tree)) if k is not None]
    if len(top) == 1 and not top[0].is_preterminal:
        return top[0]
    return Tree("S", top)


def right_branching(words: list[str], tags: list[str] | None = None, label: str = "S") -> Tree:
    """The trivial baseline: every suffix of the sentence is a constituent (labelled `label`)."""
    tags = tags or [LEAF] * len(words)
    node = Tree(tags[-1], [words[-1]])
    for i in range(len(words) - 2, -1, -1):
        node = Tree(label, [Tree(tags[i], [words[i]]), node])
    return node if not node.is_preterminal else Tree(label, [node])


# -- EVALB -------------------------------------------------------------------------------------------
def brackets(tree: Tree, keep: list[bool], labeled: bool = True) -> Counter:
    """The (label, start, end) constituents of a tree over the words kept (punctuation removed):
    part-of-speech brackets are not constituents, empty spans are not counted, ADVP = PRT."""
    out: Counter = Counter()
    pos = [0]  # index over all words
    kept_before = [0] + [sum(keep[:i + 1]) for i in range(len(keep))]  # kept words before word i

    def walk(t: Tree) -> tuple[int, int]:
        if t.is_preterminal:
            pos[0] += 1
            return pos[0] - 1, pos[0]
        start = pos[0]
        for c in t.children:
            if isinstance(c, Tree):
                walk(c)
        a, b = kept_before[start], kept_before[pos[0]]
        if b > a:
            out[(EQ_LABELS.get(t.label, t.label) if labeled else "", a, b)] += 1
        return start, pos[0]

    walk(tree)
    return out


@dataclass
class Score:
    matched: int = 0
    gold: int = 0
    test: int = 0
    sentences: int = 0
    exact: int = 0

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test if self.test else 0.0

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def __str__(self) -> str:
        return (f"F1 {self.f1:.2f}  precision {self.precision:.2f}  recall {self.recall:.2f}  "
                f"exact {100.0 * self.exact / max(self.sentences, 1):.1f}%  ({self.sentences} sentences, "
                f"{self.gold} gold / {self.test} test brackets; EVALB COLLINS.prm conventions)")


def evalb(gold: list[Tree], test: list[Tree], labeled: bool = True) -> Score:
    """Corpus-level labeled bracketing precision, recall and F1 with COLLINS.prm's conventions;
    punctuation is found by the gold tags and removed from both trees."""
    if len(gold) != len(test):
        raise TreeError(f"{len(gold)} gold trees but {len(test)} test trees")
    s = Score()
    for i, (g, t) in enumerate(zip(gold, test), 1):
        gw, tw = g.words(), t.words()
        if gw != tw:
            raise TreeError(f"tree {i}: the test tree's words differ from the gold tree's "
                            f"({len(tw)} vs {len(gw)} words)")
        keep = [tag not in PUNCT for tag, _ in g.tagged()]
        gb, tb = brackets(g, keep, labeled), brackets(t, keep, labeled)
        m = sum((gb & tb).values())
        s.matched, s.gold, s.test, s.sentences = s.matched + m, s.gold + sum(gb.values()), s.test + sum(tb.values()), \
            s.sentences + 1
        s.exact += int(gb == tb)
    return s


# -- the data ---------------------------------------------------------------------------------------
SPLITS = {"train": (1, 159), "valid": (160, 179), "test": (180, 199)}  # by file: the data README's split


def constituents(tree: Tree, min_words: int) -> list[Tree]:
    """Every constituent below the root that spans at least `min_words` words, outermost first."""
    out: list[Tree] = []
    for c in tree.children:
        if isinstance(c, Tree) and not c.is_preterminal:
            out += ([c] if len(c.words()) >= min_words else []) + constituents(c, min_words)
    return out


def write_splits(treebank: Path, out: Path, linearization: str = "words",
                 subtrees: int = 0) -> dict[str, tuple[Path, Path]]:
    """Clean every tree and write, per split, the words (source), the linearized trees (target;
    `linearization` words or xx, see `linearize`) and the cleaned gold trees (`{split}.gold.mrg`).
    With `subtrees` > 0 (ours, off by default), the training split also holds every distinct
    constituent of at least that many words as a pair of its own (data augmentation for a small
    treebank); the gold trees stay the sentences'."""
    if linearization not in LINEARIZATIONS:
        raise TreeError(f"linearization must be one of {', '.join(LINEARIZATIONS)}, got {linearization!r}")
    by_file = read_treebank(treebank)
    raw = Path(out) / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    files: dict[str, tuple[Path, Path]] = {}
    for split, (lo, hi) in SPLITS.items():
        words, targets, gold, parts = [], [], [], []
        for name, trees in by_file.items():
            m = re.search(r"(\d+)", name)
            if not m or not lo <= int(m.group(1)) <= hi:
                continue
            for t in trees:
                c = clean(t)
                if c is None:
                    continue
                words.append(" ".join(c.words()))
                targets.append(linearize(c, linearization == "words"))
                gold.append(str(c))
                parts += constituents(c, subtrees) if subtrees and split == "train" else []
        pairs = set(zip(words, targets))
        for part in parts:
            pair = (" ".join(part.words()), linearize(part, linearization == "words"))
            if pair not in pairs:
                pairs.add(pair)
                words.append(pair[0])
                targets.append(pair[1])
        if not words:
            raise TreeError(f"{treebank}: no trees for the {split} split (files {lo:04d}-{hi:04d})")
        files[split] = (raw / f"{split}.words", raw / f"{split}.parse")
        files[split][0].write_text("".join(x + "\n" for x in words))
        files[split][1].write_text("".join(x + "\n" for x in targets))
        (Path(out) / f"{split}.gold.mrg").write_text("".join(x + "\n" for x in gold))
    return files


def is_bracket(symbol: str) -> bool:
    """`(NP` or `)NP`: a labelled bracket of the linearization (a bare `(` or `)` is not)."""
    return len(symbol) > 1 and symbol[0] in "()"


def symbols_from_pieces(pieces: list[str]) -> str:
    """A decoded subword sequence as delinearize reads it: brackets kept, and each subword that
    starts a word (SentencePiece's ▁) one XX leaf, whichever linearization the model writes."""
    out = []
    for p in pieces:
        if p.startswith("\u2581"):
            out.append(p[1:] if is_bracket(p[1:]) else LEAF)
    return " ".join(out)
