"""Constrained beam search (decode/constraints.py) and glossaries (decode/glossary.py) against
independent truth: exhaustive enumeration of a toy model's outputs that hold the phrases, every
output holding its terms as whole words, batch = alone, and sentences without terms unchanged."""

import pytest
import torch
from conftest import random_translator
from test_search import exhaustive, random_model

from aiayn.data.tokenizer import EOS
from aiayn.decode.constraints import ConstraintError, constrained_beam_search
from aiayn.decode.glossary import Glossary, GlossaryError, target_phrases

SOURCES = ["the dog runs near the park", "a big red house", "the woman sits", "blue cat near a street",
           "the man runs", "a small dog"]
TERMS = [["hund läuft"], [], ["katze", "park nahe"], ["blauer"], [], ["großer straße", "mann"]]


def holds(seq: list[int], phrase: list[int]) -> bool:
    return any(seq[i:i + len(phrase)] == phrase for i in range(len(seq) - len(phrase) + 1))


@pytest.mark.parametrize("phrases", [[[4, 5]], [[6], [1]], [[5, 5, 4]], [[4], [6, 5]]])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_wide_beam_finds_the_best_outputs_that_hold_the_phrases_by_enumeration(phrases, alpha):
    """With a beam wider than all live hypotheses, the n best constrained outputs are the n best
    of every output of up to 3 tokens that holds every phrase, scored by uncached forwards."""
    model = random_model(vocab=7, seed=1)
    src = torch.tensor([[4, 5, 6, EOS]])
    truth = [t for t in exhaustive(model, src, 3, alpha) if all(holds(t[1], p) for p in phrases)]
    every = torch.ones(7, dtype=torch.bool)
    hyps = constrained_beam_search(model, src, [phrases], every, beam=128, alpha=alpha, max_len_a=0, max_len_b=3,
                                   nbest=3)[0]
    assert [h.tokens for h in hyps] == [t for _, t in truth[:3]]
    for h, (score, _) in zip(hyps, truth):
        assert h.score == pytest.approx(score, abs=1e-4)
    for beam in (1, 2, 4):  # a narrow beam may miss the best, never a phrase
        got = constrained_beam_search(model, src, [phrases], every, beam=beam, alpha=alpha, max_len_a=0,
                                      max_len_b=3)[0][0].tokens
        assert all(holds(got, p) for p in phrases)


@pytest.fixture(scope="module")
def translator(toy_prepared):
    return random_translator(toy_prepared / "spm.model", max_len_b=16)


@pytest.mark.parametrize("beam", [1, 4])
def test_every_output_holds_its_terms_as_whole_words_batched_as_alone(translator, beam):
    tok = translator.tokenizer
    ids = translator.encode_sources(SOURCES)
    phrases = target_phrases(tok, SOURCES, constraints=TERMS)
    hyps = translator.translate_ids(ids, beam=beam, constraints=phrases)
    texts = tok.decode([h[0].tokens for h in hyps])
    for text, terms in zip(texts, TERMS):
        words = f" {text} "
        assert all(f" {t} " in words for t in terms), (text, terms)
    alone = [translator.translate_ids([x], beam=beam, constraints=[p])[0][0].tokens for x, p in zip(ids, phrases)]
    assert [h[0].tokens for h in hyps] == alone
    plain = translator.translate_ids(ids, beam=beam)
    for h, p, terms in zip(hyps, plain, TERMS):
        if not terms:  # a sentence without terms searches as without constraints (in other batches: scores to rounding)
            assert h[0].tokens == p[0].tokens and h[0].score == pytest.approx(p[0].score, abs=1e-5)
    assert translator.translate(SOURCES, beam=beam, constraints=TERMS) == texts


def test_a_glossary_matches_whole_words_ignoring_case_the_longer_overlap_first(tmp_path):
    path = tmp_path / "g.tsv"
    path.write_text("# terms\nred house\troter haus\nhouse\thaus\nDog\thund\n\ncat\tkatze\n")
    g = Glossary.load(path)
    assert [e.target for e in g.matches("a big RED house near the dog")] == ["roter haus", "hund"]
    assert [e.target for e in g.matches("the house of dogs and a cat")] == ["haus", "katze"]  # dogs: no match
    assert g.matches("catalogue") == []


@pytest.mark.parametrize("text, message", [
    ("red house\n", "g.tsv line 1: 1 tab-separated fields"),
    ("a\tb\n\nc\td\te\n", "g.tsv line 3: 3 tab-separated fields"),
    ("a\t \n", "g.tsv line 1: an empty target term"),
    (f"{'x' * 300}\ty\n", "line 1: a term longer than 200"),
])
def test_bad_glossary_lines_are_refused_in_one_line_naming_the_line(tmp_path, text, message):
    path = tmp_path / "g.tsv"
    path.write_text(text)
    with pytest.raises(GlossaryError, match=message):
        Glossary.load(path)


def test_impossible_constraints_are_refused_naming_the_sentence_or_the_entry(translator, tmp_path):
    tok = translator.tokenizer
    ids = translator.encode_sources(["a cat"])
    with pytest.raises(ConstraintError, match="sentence 1: its constraints need"):
        translator.translate_ids(ids, constraints=[[[5] * 40]])
    (tmp_path / "g.tsv").write_text("cat\tкошка\n")
    with pytest.raises(GlossaryError, match="g.tsv line 1: the target term 'кошка' has characters"):
        translator.translate(["a cat"], glossary=Glossary.load(tmp_path / "g.tsv"))
    with pytest.raises(GlossaryError, match="line 1: 40 terms"):
        target_phrases(tok, ["a cat"], constraints=[[f"hund {i}" for i in range(40)]])
    with pytest.raises(GlossaryError, match="glossary entry 2: not a"):
        Glossary.from_pairs([["cat", "katze"], ["dog"]])


def test_a_prefix_and_terms_together(translator):
    ids = translator.encode_sources(["the dog runs near the park"])
    tok = translator.tokenizer
    prefix = tok.encode_target(["der"])
    phrases = target_phrases(tok, ["x"], constraints=[["park"]])
    got = translator.translate_ids(ids, prefixes=prefix, constraints=phrases)[0][0].tokens
    assert got[:len(prefix[0])] == prefix[0] and holds(got, phrases[0][0])


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_terms_are_held_on_the_other_precisions_paths(translator, precision):
    from aiayn.decode.translator import Translator

    other = Translator(translator.model, translator.tokenizer, translator.decode_cfg, precision=precision)
    out = other.translate(SOURCES, constraints=TERMS)
    for text, terms in zip(out, TERMS):
        assert all(f" {t} " in f" {text} " for t in terms)


def test_translate_glossary_holds_its_terms_from_the_command_line_and_names_a_bad_line(translator, tmp_path, capsys):
    from conftest import save_translator

    from aiayn.cli import main
    from aiayn.decode.glossary import Glossary

    ckpt = save_translator(translator, tmp_path / "m.safetensors")
    (tmp_path / "in").write_text("".join(s + "\n" for s in SOURCES))
    (tmp_path / "g.tsv").write_text("dog runs\thund läuft\ncat\tkatze\nsmall dog\tkleiner hund\n")
    args = ["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in"), "--precision", "fp32",
            "--max-len-b", "16", "--glossary", str(tmp_path / "g.tsv")]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == translator.translate(SOURCES, glossary=Glossary.load(tmp_path / "g.tsv"))
    assert "hund läuft" in out[0] and "kleiner hund" in out[5]  # the lines holding source terms
    assert main(args + ["-o", str(tmp_path / "out")]) == 0  # the resumable path: the same lines
    assert (tmp_path / "out").read_text().splitlines() == out
    capsys.readouterr()
    (tmp_path / "g.tsv").write_text("dog\thund\ncat katze\n")
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "g.tsv line 2: 1 tab-separated fields" in err[0]


def test_the_server_takes_a_glossary_and_constraints_per_request(translator):
    from fastapi.testclient import TestClient

    from aiayn.serve.app import Limits, create_app

    with TestClient(create_app(translator, Limits())) as client:
        sents = ["the dog runs", "a big cat", "the woman"]
        glossary = [["dog", "hund"], ["cat", "katze"]]
        r = client.post("/translate", json={"sentences": sents, "glossary": glossary,
                                            "constraints": [[], ["roter"], []]})
        assert r.status_code == 200
        assert r.json()["translations"] == translator.translate(
            sents, glossary=Glossary.from_pairs(glossary), constraints=[[], ["roter"], []])
        got = r.json()["translations"]
        assert "hund" in got[0].split() and {"katze", "roter"} <= set(got[1].split())
        for body, code, says in [
            ({"sentences": sents, "constraints": [["x"]]}, 400, "1 constraint lists for 3 sentences"),
            ({"sentences": sents, "glossary": [["dog"]]}, 400, "glossary entry 1: not a"),
            ({"sentences": ["a cat"], "constraints": [["hund " * 30]]}, 413, "sentence 0: its constraints need"),
            ({"sentences": ["a cat"], "constraints": [["кошка"]]}, 400, "has characters"),
        ]:
            r = client.post("/translate", json=body)
            assert r.status_code == code and says in r.json()["detail"], (body, r.json())


def test_abandoned_constrained_sentences_leave_within_a_few_steps():
    from aiayn.decode.search import ABANDON_EVERY

    class Counting:
        def __init__(self, model):
            self.model, self.steps = model, 0

        def start_decoding(self, src, group=1):
            return self.model.start_decoding(src, group)

        def decode_step(self, tokens, cache):
            self.steps += 1
            return self.model.decode_step(tokens, cache)

    model = Counting(random_model(vocab=7, seed=1))
    src = torch.tensor([[4, 5, 6, EOS]])
    every = torch.ones(7, dtype=torch.bool)
    gone = constrained_beam_search(model, src, [[[4, 5]]], every, beam=2, max_len_a=0, max_len_b=40,
                                   abandoned=lambda ids: torch.ones_like(ids, dtype=torch.bool))
    assert model.steps == ABANDON_EVERY and gone == [[]]


def test_sentences_with_terms_search_with_the_constraint_beam_default_twice_the_beam(translator):
    import dataclasses

    from aiayn.decode.translator import Translator

    ids = translator.encode_sources(SOURCES[:1])
    phrases = target_phrases(translator.tokenizer, SOURCES[:1], constraints=TERMS[:1])
    src = torch.tensor(ids)
    for setting, beam in ((0, 8), (5, 5), (3, 3)):
        t = Translator(translator.model, translator.tokenizer,
                       dataclasses.replace(translator.decode_cfg, constraint_beam=setting), precision="fp32")
        got = t.translate_ids(ids, beam=4, constraints=phrases)[0][0]
        want = constrained_beam_search(t.search_model, src, phrases, t.word_starts, beam=beam, max_len_b=16)[0][0]
        assert got.tokens == want.tokens and got.score == pytest.approx(want.score, abs=1e-6)


def test_a_glossary_line_ends_at_a_newline_only(tmp_path):
    (tmp_path / "g.tsv").write_bytes("a\u2028b\tc\r\ndog\thund\n".encode())
    g = Glossary.load(tmp_path / "g.tsv")
    assert [(e.source, e.target) for e in g.entries] == [("a b", "c"), ("dog", "hund")]  # whitespace as one space


def test_what_may_follow_a_completed_phrase_is_each_sentences_own():
    """After a phrase only a word's start may follow, or the first token of one of the sentence's own
    phrases (token 5 starts no word here): a sentence batched with one whose phrase starts with 5
    searches as alone, and still writes its own phrases."""
    model = random_model(vocab=7, seed=6)  # one where b would take 5 after its phrase if a's first tokens counted
    starts = torch.tensor([True, True, True, True, True, False, True])  # 5: inside a word
    a, b = torch.tensor([[4, 5, 6, EOS]]), torch.tensor([[6, 4, EOS, 0]])
    pa, pb = [[4], [5, 6]], [[6]]
    both = constrained_beam_search(model, torch.cat([a, b]), [pa, pb], starts, beam=3, max_len_a=0, max_len_b=5)
    alone = [constrained_beam_search(model, x, [p], starts, beam=3, max_len_a=0, max_len_b=5)[0]
             for x, p in ((a, pa), (b[:, :3], pb))]
    assert [h[0].tokens for h in both] == [h[0].tokens for h in alone]
    assert holds(both[0][0].tokens, [4]) and holds(both[0][0].tokens, [5, 6]) and holds(both[1][0].tokens, [6])
    seq = both[1][0].tokens  # b's own phrase, 6, is never followed by 5 (a's first token, not b's)
    first = seq.index(6)
    assert first + 1 == len(seq) or seq[first + 1] != 5
