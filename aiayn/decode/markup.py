"""Inline markup carried through translation by word alignments (decode/align.py; the paper's
model translates plain sentences, §6.1): tags (`<b>…</b>`, `<a href=…>…</a>`), placeholders
(`<x id=1/>`) and Markdown's `**…**` and `` `…` `` are taken out, the text is translated, and each
tag is put back around the target words aligned to the source words it wrapped (the hull of their
positions). An element marked as HTML marks what is not to be translated, `translate="no"` (names,
code, URLs, numbers: `<span translate="no">…</span>`), is taken out whole and put back as a
placeholder, copied verbatim. Output is well-formed by construction: tags are placed as a tree whose children keep
their source order and stay inside their parent (a span that would cross another is clipped, an
empty one wraps nothing), and every placeholder appears exactly once.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from ..errors import AiaynError
from ..score import Links, read_pharaoh

# A tag's attributes run to the first ">" (no "<" inside): one scan from each "<", so the cost is linear
# in the sentence (an ambiguous \s* before the ">" made a long unclosed tag cost its length squared).
_TOKEN = re.compile(r"<(/?)([A-Za-z][\w:.-]*)((?:\s[^<>]*?)?)(/?)>|\*\*|`")
MAX_DEPTH = 64  # tags nested inside each other, at most
MAX_TAG = 1000  # characters of one tag, at most
_LONG_TAG = re.compile(rf"<[/A-Za-z][^<>]{{{MAX_TAG}}}")
_NO_TRANSLATE = re.compile(r"""\stranslate\s*=\s*(["']?)no\1(?![\w-])""", re.IGNORECASE)  # HTML's translate="no"


class MarkupError(AiaynError):
    """A sentence whose tags are not well-formed (the message names the tag)."""


class MarkupLimit(MarkupError):
    """Well-formed markup past a stated bound: nesting deeper than MAX_DEPTH, a tag longer than MAX_TAG."""


@dataclass
class Node:
    """A tag and the words it wraps: source word span [start, end) first, target span after `place`."""

    open: str
    close: str  # "" for a placeholder (it wraps nothing and is written once)
    start: int = 0
    end: int = 0
    children: list[Node] = field(default_factory=list)


def parse(line: str) -> tuple[str, Node]:
    """A sentence with markup -> its plain text (tags removed) and the tree of its tags over the
    plain text's whitespace words."""
    root, stack, plain, pending = Node("", ""), [], [], []
    pos = 0
    if long := _LONG_TAG.search(line):
        raise MarkupLimit(f"a tag longer than {MAX_TAG} characters at character {long.start() + 1}")
    offset = 0  # characters of plain text so far
    while m := _TOKEN.search(line, pos):
        plain.append(line[pos:m.start()])
        offset += m.start() - pos
        pos = m.end()
        text = m.group(0)
        name = m.group(2) or text
        parent = stack[-1][0] if stack else root
        if not m.group(1) and not m.group(4) and _NO_TRANSLATE.search(m.group(3) or ""):
            pos = _element_end(line, m, name)  # kept whole, as a placeholder: copied, never translated
            parent.children.append(Node(line[m.start():pos], ""))
            pending.append((parent.children[-1], offset, "at"))
        elif m.group(4):  # <x/>: a placeholder before the next word
            parent.children.append(Node(text, ""))
            pending.append((parent.children[-1], offset, "at"))
        elif m.group(1) or (text in ("**", "`") and stack and stack[-1][1] == name):
            if not stack or stack[-1][1] != name:
                raise MarkupError(f"closing {text} does not match {stack[-1][0].open if stack else 'any open tag'}")
            node, _ = stack.pop()
            node.close = text
            pending.append((node, offset, "end"))
        else:
            node = Node(text, "")
            parent.children.append(node)
            stack.append((node, name))
            if len(stack) > MAX_DEPTH:
                raise MarkupLimit(f"tags nested deeper than {MAX_DEPTH} (at {text} number {len(stack)})")
            pending.append((node, offset, "start"))
    if stack:
        raise MarkupError(f"{stack[-1][0].open} is never closed")
    plain.append(line[pos:])
    text = "".join(plain)
    _spans(text, pending)
    return " ".join(text.split()), root


def _element_end(line: str, start: re.Match, name: str) -> int:
    """Where the element `start` opens (tag `name`) ends: after its matching closing tag."""
    depth, pos = 1, start.end()
    while m := _TOKEN.search(line, pos):
        pos = m.end()
        if m.group(2) == name and not m.group(4):
            depth += -1 if m.group(1) else 1
            if depth == 0:
                return pos
    raise MarkupError(f"{start.group(0)} is never closed")


def _spans(text: str, pending: list) -> None:
    """Character offsets of tags in the plain text -> word spans [start, end)."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    starts, ends = [s for s, _ in spans], [e for _, e in spans]  # both ascending: counted by bisection
    for node, offset, kind in pending:
        if kind == "end":  # after the last word that starts before the tag
            node.end = max(node.start, bisect.bisect_left(starts, offset))
        else:  # before the first word that ends after the tag
            node.start = node.end = bisect.bisect_right(ends, offset)


def place(root: Node, links: Links, n_target: int) -> None:
    """Target spans: each tag's hull of the target words aligned to its source words, inside its
    parent, after its previous sibling (so the tree stays a tree); placeholders before the target
    word aligned to the source word they preceded."""
    _place(root.children, links, 0, n_target)


def _place(children: list[Node], links: Links, lo: int, hi: int) -> None:
    at = lo
    for node in children:
        src = range(node.start, node.end) if node.close else range(node.start, node.start + 1)
        tgt = sorted(j for i, j in links if i in src and lo <= j < hi)
        if node.close and tgt:
            start, end = max(tgt[0], at), max(tgt[-1] + 1, at)
        else:  # a placeholder, or a tag whose words were not aligned: where the source put it
            start = end = max(min(tgt[0] if tgt else _after(links, node.start, lo, hi), hi), at)
        _place(node.children, links, start, end)
        node.start, node.end, at = start, end, end


def _after(links: Links, i: int, lo: int, hi: int) -> int:
    """A target position for source position i: before the first word aligned to a later source word."""
    later = [j for s, j in links if s >= i and lo <= j < hi]
    return min(later) if later else hi


def render(root: Node, words: list[str]) -> str:
    """Target words with the tags at their placed spans, spaced as words are."""
    items: list[tuple[str, str]] = []
    _render(root.children, words, 0, len(words), items)
    out, prev = [], ""
    for kind, text in items:
        if prev in ("w", "close", "x") and kind in ("w", "open", "x"):
            out.append(" ")
        out.append(text)
        prev = kind
    return "".join(out)


def _render(children: list[Node], words: list[str], lo: int, hi: int, items: list) -> None:
    pos = lo
    for node in children:
        items += [("w", w) for w in words[pos:node.start]]
        if not node.close:
            items.append(("x", node.open))
        else:
            items.append(("open", node.open))
            _render(node.children, words, node.start, node.end, items)
            items.append(("close", node.close))
        pos = node.end
    items += [("w", w) for w in words[pos:hi]]


def strip(line: str) -> str:
    """The words of a line without its markup (what a checker compares)."""
    return " ".join(_TOKEN.sub(" ", line).split())


def translate_markup(translator, lines: list[str]) -> list[str]:
    """Each line translated without its markup, then its tags put back by the word alignments of
    the head `aiayn align` chose (Translator.align)."""
    parsed = []
    for n, line in enumerate(lines, 1):
        try:
            parsed.append(parse(line))
        except MarkupError as e:
            raise MarkupError(f"line {n}: {e}") from None
    ids = translator.encode_sources([plain for plain, _ in parsed])
    hyps = translator.translate_ids(ids, alignments=True, constraints=translator.terms([p for p, _ in parsed]))
    texts = translator.tokenizer.decode([h[0].tokens if h else [] for h in hyps])
    return [put_back(root, text, links) for (_, root), text, links in zip(parsed, texts, translator.align(ids, hyps))]


def put_back(root: Node, translation: str, links: Links | str) -> str:
    """A translation with the source's tags (`parse`'s tree) placed by word links (a set, or Pharaoh text)."""
    links = read_pharaoh(links)[0] if isinstance(links, str) else links
    words = translation.split()
    place(root, links, len(words))
    return render(root, words)
