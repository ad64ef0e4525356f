"""Markup through translation: tags parsed over words, placed by alignments, always well-formed (checked
by brute force on many random tag placements and random alignments), identity alignments give the input back."""

import random
import re

import pytest

from aiayn.decode.markup import MarkupError, parse, place, render, strip

CHECK = re.compile(r"<(/?)([A-Za-z][\w:.-]*)[^<>]*?(/?)>|\*\*|`")


def well_formed(text: str) -> list[str]:
    """A checker written apart from markup.py: a stack over every tag; returns the placeholders seen."""
    stack, placeholders = [], []
    for m in CHECK.finditer(text):
        tok = m.group(0)
        if tok in ("**", "`"):
            if stack and stack[-1] == tok:
                stack.pop()
            else:
                stack.append(tok)
        elif m.group(3):
            placeholders.append(tok)
        elif m.group(1):
            assert stack and stack[-1] == m.group(2), (text, tok)
            stack.pop()
        else:
            stack.append(m.group(2))
    assert not stack, text
    return placeholders


def random_markup(rng: random.Random, words: list[str]) -> tuple[str, list[str]]:
    """Words with random nested tags, Markdown and placeholders."""
    out, stack, holders = [], [], []
    for k, w in enumerate(words):
        for _ in range(rng.randint(0, 2)):
            r = rng.random()
            if r < 0.15:
                holders.append(f'<x id="{k}{len(holders)}"/>')
                out.append(holders[-1])
            elif r < 0.6 and len(stack) < 3:
                tag = rng.choice(["b", "i", "a", "**", "`"])
                if tag in stack and tag in ("**", "`"):
                    continue
                stack.append(tag)
                out.append(tag if tag in ("**", "`") else ("<a href='u'>" if tag == "a" else f"<{tag}>"))
        out.append(w)
        while stack and rng.random() < 0.4:
            tag = stack.pop()
            out.append(tag if tag in ("**", "`") else f"</{tag}>")
    while stack:
        tag = stack.pop()
        out.append(tag if tag in ("**", "`") else f"</{tag}>")
    return " ".join(out), holders


def test_identity_alignments_give_the_markup_back_and_random_ones_stay_well_formed():
    rng = random.Random(0)
    for trial in range(1000):
        n = rng.randint(1, 9)
        words = [f"w{i}" for i in range(n)]
        line, holders = random_markup(rng, words)
        plain, root = parse(line)
        assert plain.split() == words
        if trial % 2 == 0:  # identity: each word to itself
            place(root, {(i, i) for i in range(n)}, n)
            assert strip(render(root, words)) == " ".join(words)
            assert sorted(well_formed(render(root, words))) == sorted(holders)
            continue
        m = rng.randint(1, 11)
        target = [f"t{j}" for j in range(m)]
        links = {(rng.randrange(n), rng.randrange(m)) for _ in range(rng.randint(0, 2 * n))}
        place(root, links, m)
        out = render(root, target)
        assert sorted(well_formed(out)) == sorted(holders), (line, links, out)  # each placeholder once
        assert strip(out) == " ".join(target)


def test_a_tag_wraps_the_target_words_aligned_to_its_source_words():
    plain, root = parse("the <b>big dog</b> runs <x id=1/>home")
    assert plain == "the big dog runs home"
    place(root, {(0, 0), (1, 2), (2, 1), (3, 3), (4, 4)}, 5)  # der Hund große läuft heim
    assert render(root, ["der", "Hund", "große", "läuft", "heim"]) == "der <b>Hund große</b> läuft <x id=1/> heim"


@pytest.mark.parametrize("bad,message", [("a <b>dog", "never closed"), ("a </b>dog", "does not match"),
                                         ("<b>a <i>dog</b></i>", "does not match")])
def test_malformed_markup_is_refused(bad, message):
    with pytest.raises(MarkupError, match=message):
        parse(bad)


def test_translate_markup_keeps_the_plain_translation_and_every_tag(toy_prepared, tmp_path, capsys):
    from conftest import tiny_config

    import aiayn
    from aiayn.checkpoint import list_checkpoints
    from aiayn.cli import main
    from aiayn.decode.translator import Translator

    aiayn.train(tiny_config(max_steps=30), str(toy_prepared), str(tmp_path / "run"))
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    rng = random.Random(1)
    src = (toy_prepared / "test.en.txt").read_text().splitlines()[:20]
    marked = [random_markup(rng, s.split()) for s in src]
    (tmp_path / "in").write_text("".join(m + "\n" for m, _ in marked))
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in"), "-o", str(tmp_path / "o"),
                 "--markup", "--precision", "fp32"]) == 0
    out = (tmp_path / "o").read_text().splitlines()
    plain = Translator.load(ckpt, precision="fp32").translate(src)
    for line, (_, holders), want in zip(out, marked, plain):
        assert sorted(well_formed(line)) == sorted(holders) and strip(line) == " ".join(want.split())
    (tmp_path / "bad").write_text("a <b>dog\n")
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "bad"), "--markup"]) == 2
    assert "line 1: <b> is never closed" in capsys.readouterr().err


@pytest.mark.parametrize("line, said", [
    ("<b>" * 1000 + "dog" + "</b>" * 1000, "nested deeper than 64"),
    ("**`" * 500 + "dog" + "`**" * 500, "nested deeper than 64"),
    ("<b>" * 30_000 + "dog" + "</b>" * 30_000, "nested deeper than 64"),
    ("a <a" + " " * 12_000 + "x", "a tag longer than 1000 characters at character 3"),
])
def test_markup_past_its_bounds_is_one_error_not_a_recursion(line, said):
    from aiayn.decode.markup import MarkupLimit, parse

    with pytest.raises(MarkupLimit, match=said):
        parse(line)


def test_parsing_costs_time_linear_in_the_length_of_adversarial_markup():
    """The patterns that cost their length squared (an unclosed tag's spaces, many tags, many words):
    100 KB once within 5x the time of 1 KB a hundred times (linear: about 1x; quadratic: 100x)."""
    import time

    from aiayn.decode.markup import parse

    def cost(n: int, times: int) -> float:
        lines = [("<a" + " " * 900) * (n // 902), " <b>w</b>" * (n // 9), "<x id=1/> w " * (n // 12)]
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(times):
                for line in lines:
                    parse(line)
            best = min(best, time.perf_counter() - start)
        return best

    small, large = cost(1_000, 100), cost(100_000, 1)
    assert large < 5 * small, (small, large)


def test_an_element_marked_translate_no_is_copied_verbatim_once_and_never_seen_by_the_model(toy_prepared):
    from conftest import random_translator

    from aiayn.decode.markup import put_back, translate_markup

    kept = '<span translate="no">Save <b>As</b> &amp; https://x.y/?a=1</span>'
    text, root = parse(f"click {kept} to keep <b>the</b> file")
    assert text == "click to keep the file"  # the model reads the rest only
    for links in ("0-0 1-1 2-2 3-3 4-4", "", "4-0 0-4"):
        out = put_back(root, "a b c d e", links)
        assert out.count(kept) == 1 and well_formed(out) == []
    assert parse("<code translate='NO'>x = 1</code> runs")[0] == "runs"
    assert parse('a <i translate="yes">b</i>')[0] == "a b"  # only "no" keeps a span
    with pytest.raises(MarkupError, match="never closed"):
        parse('a <span translate="no">b')
    t = random_translator(toy_prepared / "spm.model")
    line = 'the dog <span translate="no">Rex_42 <i>ø</i></span> runs'
    assert translate_markup(t, [line])[0].count('<span translate="no">Rex_42 <i>ø</i></span>') == 1
