"""§6.3 parsing: tree clean-up against hand-made trees, the linearization round trip on every tree
of the sample, output repair, the EVALB-style scorer against hand-computed scores, and the
commands end to end on a tiny treebank."""

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_treebank
from safetensors.torch import save_file

from aiayn.checkpoint import CheckpointError, read_weights
from aiayn.cli import main
from aiayn.data.tokenizer import BOS, EOS
from aiayn.decode.translator import Translator
from aiayn.parsing.model import build_any
from aiayn.parsing.pcfg import pcfg_parses
from aiayn.parsing.trees import (
    LEAF,
    TreeError,
    brackets,
    clean,
    delinearize,
    evalb,
    is_bracket,
    linearize,
    read_treebank,
    read_trees,
    right_branching,
    symbols_from_pieces,
)
from aiayn.parsing.treesearch import Parser, TreeSearch

SAMPLE = Path(__file__).resolve().parents[3] / "shared/data/ptb-sample/treebank.zip"


def one(text):
    (t,) = read_trees(text)
    return t


def test_clean_follows_the_wsj_conventions():
    raw = one("""( (S (NP-SBJ-1 (-NONE- *T*-1)) (NP-SBJ=2 (DT The) (NN dog))
              (VP (VBD said) (SBAR (-NONE- 0) (S (NP-SBJ (-NONE- *-1)) (VP (TO to) (VP (VB go))))))
              (PRN (-LRB- -LRB-) (NP (NN sic)) (-RRB- -RRB-)) (. .)) )""")
    assert str(clean(raw)) == ("(S (NP (DT The) (NN dog)) (VP (VBD said) (SBAR (S (VP (TO to) (VP (VB go)))))) "
                               "(PRN (-LRB- -LRB-) (NP (NN sic)) (-RRB- -RRB-)) (. .))")
    assert clean(one("( (X (-NONE- *)) )")) is None


@pytest.mark.parametrize("text,message", [
    ("(S (NP (DT a)) ", "tree 1: 1 bracket(s) never closed"),
    ("(S (NN a)) )", "tree 2: ')' without an open bracket"),
    ("(S (NP) (NN a))", "tree 1: empty constituent (NP)"),
    ("(S (NN a) word)", "tree 1: word 'word' beside constituents"),
])
def test_malformed_trees_name_file_and_tree(text, message):
    with pytest.raises(TreeError, match=r"wsj_0007.mrg: " + message.replace("(", r"\(").replace(")", r"\)")):
        read_trees(text, "wsj_0007.mrg")


def test_linearization_is_vinyals_and_kaiser():
    t = one("(S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .))")
    assert linearize(t) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S"


@pytest.mark.skipif(not SAMPLE.exists(), reason="the PTB sample is not beside the repository")
def test_round_trip_on_every_tree_of_the_sample():
    n = 0
    for trees in read_treebank(SAMPLE).values():
        for t in trees:
            c = clean(t)
            if c is None:
                continue
            tags = [tag for tag, _ in c.tagged()]
            assert str(delinearize(linearize(c), c.words(), tags)) == str(c)
            with_words = linearize(c, words=True).split()  # the words in order, where the XX were
            assert [x for x in with_words if not is_bracket(x)] == c.words()
            pieces = ["\u2581" + x for x in with_words]  # one subword per word: symbols_from_pieces's view
            assert str(delinearize(symbols_from_pieces(pieces), c.words(), tags)) == str(c)
            n += 1
    assert n == 3914


def test_repair_always_gives_a_tree_with_exactly_the_words():
    rng = random.Random(0)
    symbols = ["(S", "(NP", "(VP", ")NP", ")S", ")VP", LEAF, LEAF, LEAF, "junk", "(", ")"]
    for _ in range(500):
        words = [f"w{i}" for i in range(rng.randint(1, 8))]
        hyp = " ".join(rng.choice(symbols) for _ in range(rng.randint(0, 20)))
        tree = delinearize(hyp, words)
        again = one(str(tree))  # well-formed: it reads back as one tree
        assert again.words() == words and str(again) == str(tree)
        assert all(tag == LEAF for tag, _ in tree.tagged())


def test_repair_cases():
    w = ["a", "b", "c"]
    assert str(delinearize("(S (NP XX XX )NP XX )S", w)) == "(S (NP (XX a) (XX b)) (XX c))"
    assert str(delinearize(")VP (S (NP XX XX XX XX XX", w)) == "(S (NP (XX a) (XX b) (XX c)))"  # close, drop
    assert str(delinearize("(NP XX )NP (VP XX )VP", w)) == "(S (NP (XX a)) (VP (XX b)) (XX c))"  # one root
    assert str(delinearize("", w)) == "(S (XX a) (XX b) (XX c))"
    assert str(delinearize("(S (PP )PP XX XX XX )S", w)) == "(S (XX a) (XX b) (XX c))"  # empty PP removed


GOLD = "(S (NP (DT The) (NN dog)) (VP (VBD saw) (NP (DT a) (NN cat)) (PRT (RP off))) (. .))"


def test_evalb_counts_constituents_by_hand():
    gold = one(GOLD)
    # gold brackets: S(0,6) NP(0,2) VP(2,6) NP(3,5) PRT(5,6); '.' deleted, so S spans 0-6 of 6 words
    assert sorted(brackets(gold, [True] * 6 + [False])) == [
        ("ADVP", 5, 6), ("NP", 0, 2), ("NP", 3, 5), ("S", 0, 6), ("VP", 2, 6)]
    test = one("(S (NP (DT The) (NN dog)) (VP (VBD saw) (NP (DT a) (NN cat) (ADVP (RB off)))) (. .))")
    s = evalb([gold], [test])
    # test: S(0,6) NP(0,2) VP(2,6) NP(3,6) ADVP(5,6) -> matched S, NP(0,2), VP, ADVP=PRT = 4 of 5 each
    assert (s.matched, s.gold, s.test) == (4, 5, 5)
    assert s.precision == pytest.approx(80.0) and s.recall == pytest.approx(80.0) and s.f1 == pytest.approx(80.0)
    assert evalb([gold], [gold]).f1 == 100.0 and evalb([gold], [gold]).exact == 1


def test_evalb_deletes_punctuation_by_the_gold_tags():
    gold = one("(S (NP (NNP Bob)) (VP (VBD left)) (, ,) (S (ADVP (RB then))) (. .))")
    # a test bracket that differs only by punctuation is the same span once punctuation is deleted
    test = one("(S (NP (XX Bob)) (VP (XX left) (XX ,)) (S (ADVP (XX then)) (XX .)))")
    s = evalb([gold], [test])
    assert (s.matched, s.gold, s.test) == (5, 5, 5)  # S NP VP S ADVP on both sides
    only_punct = one("(S (NP (NNP Bob)) (VP (VBD left)) (X (, ,)) (. .))")
    assert ("X", 2, 2) not in brackets(only_punct, [True, True, False, False])
    assert sum(brackets(only_punct, [True, True, False, False]).values()) == 3


def test_evalb_refuses_trees_over_other_words():
    with pytest.raises(TreeError, match="tree 1: the test tree's words differ"):
        evalb([one("(S (NN a))")], [one("(S (NN b))")])


def test_right_branching_baseline():
    t = right_branching(["a", "b", "c"])
    assert str(t) == "(S (XX a) (S (XX b) (XX c)))"
    assert str(right_branching(["a"])) == "(S (XX a))"


# -- end to end ------------------------------------------------------------------------------------
def aiayn(*args):
    return subprocess.run([sys.executable, "-m", "aiayn", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def refused(capsys, *args) -> tuple[int, str]:
    """A verb run in this process (no interpreter start): its exit code and what it wrote to stderr."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_prepare_train_parse_score_end_to_end(tmp_path, capsys):
    (tmp_path / "tb").mkdir()
    tb = tiny_treebank(tmp_path / "tb")
    prep, run = tmp_path / "prep", tmp_path / "run"
    p = aiayn("prepare", "--task", "parse", "--treebank", tb, "-o", prep, "--preset", "parse",
              "--data.vocab_size", "60")
    assert p.returncode == 0, p.stderr[-1500:]
    assert (prep / "test.gold.mrg").read_text().splitlines()[0] == "(S (NP (DT The) (NN dog)) (VP (VBZ runs)) (. .))"
    p = aiayn("train", "--data", prep, "--run-dir", run, "--preset", "parse", "--model.d_model", "32", "--model.d_ff",
              "64", "--model.N", "1", "--train.max_steps", "40", "--train.max_minutes", "0", "--train.threads", "1",
              "--data.max_tokens", "600", "--train.lr_scale", "2", "--train.save_every", "20")
    assert p.returncode == 0, p.stderr[-1500:]
    ckpt = sorted((run / "checkpoints").glob("step-*.safetensors"))[-1]
    # The target's leaves are the source's own subwords (what lets each leaf copy its word).
    with pytest.raises(CheckpointError, match="is an input of §6.3's parser: parse with"):
        Translator.load(ckpt)  # the translation models' builder knows no parser
    t = Translator.load(ckpt, build=build_any)
    for src, tgt in zip((prep / "raw/train.words").read_text().splitlines(),
                        (prep / "raw/train.parse").read_text().splitlines()):
        pieces = t.tokenizer.id_to_piece(t.tokenizer.encode([tgt])[0])
        assert [p for p in pieces if not is_bracket(p.lstrip("\u2581"))] == t.tokenizer.id_to_piece(
            t.tokenizer.encode([src])[0])
    # The search itself writes trees over exactly the input's words (before any repair).
    parser = Parser.load(ckpt)
    words = (prep / "test.words.txt").read_text().splitlines() + ["a b c d e f g h i j k l", "unseen zebra words"]
    hyps = parser.translator.translate_ids(parser.translator.encode_sources(words), beam=21)  # more beams than moves
    for line, h in zip(words, hyps):
        pieces = parser.translator.tokenizer.id_to_piece(h[0].tokens)
        assert _valid(pieces, parser.translator.tokenizer.id_to_piece(parser.translator.tokenizer.encode([line])[0]))
    assert [tree.words() for tree in parser.parse(words)] == [line.split() for line in words]
    # Parentheses in the input are spelled as the treebank does, never read as brackets: the tree reads back.
    (tree,) = parser.parse(["( the dog ) runs (NP a)"])
    want = ["-LRB-", "the", "dog", "-RRB-", "runs", "-LRB-NP", "a-RRB-"]
    assert tree.words() == want and one(str(tree)).words() == want
    # A translation model is refused by its metadata, in one line.
    meta_free = tmp_path / "translation.safetensors"
    tensors, meta = read_weights(ckpt)
    save_file(tensors, meta_free, {**meta, "extra": "{}"})
    # Refusals are one line from the verb (in this process: a traceback would fail the test).
    code, err = refused(capsys, "parse", "--checkpoint", meta_free, "-i", prep / "test.words.txt")
    assert code == 2 and "not a parsing model (its metadata names the task 'translate')" in err
    code, err = refused(capsys, "parse", "--checkpoint", ckpt, meta_free, "-i", prep / "test.words.txt")
    assert code == 2 and f"{meta_free}: not a parsing model" in err  # nor inside an ensemble
    for verb in (["translate", "-i", prep / "test.words.txt"], ["tune", "--data", prep], ["serve"]):
        code, err = refused(capsys, verb[0], "--checkpoint", ckpt, *verb[1:])  # nor by the translation verbs
        assert code == 2 and f"{ckpt}: a parsing model (its metadata names the task 'parse'); `aiayn {verb[0]}`" in err
    code, err = refused(capsys, "parse", "--checkpoint", ckpt, tmp_path / "none.safetensors", "-i",
                        prep / "test.words.txt")
    assert code == 2 and "none.safetensors: no such file" in err
    # Two checkpoints of the run parse as an ensemble, still trees over exactly the words.
    two = sorted((run / "checkpoints").glob("step-*.safetensors"))[-2:]
    assert len(two) == 2
    p = aiayn("parse", "--checkpoint", *two, "-i", prep / "test.words.txt", "-o", tmp_path / "ens.mrg")
    assert p.returncode == 0, p.stderr[-1500:]
    assert [t.words() for t in read_trees((tmp_path / "ens.mrg").read_text())] == [
        line.split() for line in (prep / "test.words.txt").read_text().splitlines()]
    p = aiayn("parse", "--checkpoint", ckpt, "-i", prep / "test.words.txt", "-o", tmp_path / "hyp.mrg")
    assert p.returncode == 0, p.stderr[-1500:]
    gold = read_trees((prep / "test.gold.mrg").read_text())
    hyps = read_trees((tmp_path / "hyp.mrg").read_text())
    assert [h.words() for h in hyps] == [g.words() for g in gold]  # well-formed, words preserved
    p = aiayn("score", "--parse", "--hyp", tmp_path / "hyp.mrg", "--ref", prep / "test.gold.mrg")
    assert p.returncode == 0 and p.stdout.startswith(f"F1 {evalb(gold, hyps).f1:.2f}")
    p = aiayn("score", "--parse", "--pcfg", prep / "train.gold.mrg", "--ref", prep / "test.gold.mrg")
    expected = evalb(gold, pcfg_parses(read_trees((prep / "train.gold.mrg").read_text()), gold)[0])
    assert p.returncode == 0 and p.stdout.startswith(f"F1 {expected.f1:.2f}") and expected.f1 > 50
    p = aiayn("score", "--parse", "--right-branching", "--ref", prep / "test.gold.mrg")
    assert p.returncode == 0 and "unlabeled: F1" in p.stdout
    (tb / "wsj_0003.mrg").write_text("(S (NN a)\n( (S (NN b)) )\n")
    code, err = refused(capsys, "prepare", "--task", "parse", "--treebank", tb, "-o", tmp_path / "prep2")
    assert code == 2 and "wsj_0003.mrg: tree 1" in err


# -- search that can only write trees --------------------------------------------------------------
PIECES = ["<pad>", "<unk>", "<s>", "</s>", "\u2581(S", "\u2581)S", "\u2581(NP", "\u2581)NP", "\u2581XX", "\u2581a", "c",
          "\u2581b", "\u2581(VP"]  # (VP has no closing symbol: it must never be opened


class _Tok:
    def __len__(self):
        return len(PIECES)

    def id_to_piece(self, ids):
        return [PIECES[i] for i in ids]

    def encode(self, lines):
        return [[PIECES.index("\u2581" + w) for w in line.split()] for line in lines]


class _Flat(torch.nn.Module):
    """Any token is as likely as any other: what search may write is the constraint's alone."""

    cfg = None

    class State:
        def reorder(self, rows, sources=None):
            pass

    def start_decoding(self, src, group=1):
        return self.State()

    def decode_step(self, tokens, state):
        return torch.zeros(tokens.numel(), len(PIECES))


def _valid(seq: list[str], leaves: list[str]) -> bool:
    """Brute-force truth: one well-nested tree, labels matched, every constituent holding a leaf,
    exactly `leaves` in order, no bracket inside a word (between a piece and its continuation)."""
    stack, out, filled = [], [], []
    for i, p in enumerate(seq):
        if p.startswith("\u2581(") or p.startswith("\u2581)"):
            if i + 1 < len(seq) and not seq[i + 1].startswith("\u2581"):
                return False  # a continuation piece right after a bracket
            if p[1] == "(":
                if not stack and out:
                    return False  # a second top-level constituent
                stack.append(p[2:])
                filled.append(False)
            elif not stack or stack.pop() != p[2:] or not filled.pop():
                return False
        else:
            if not stack:
                return False
            out.append(p)
            filled = [True] * len(filled)
    return not stack and out == leaves


def _reachable(search: TreeSearch, src: list[int], limit: int) -> set[tuple[str, ...]]:
    """Every complete output (EOS-terminated, at most `limit` tokens before it) the masks allow."""
    done, todo = set(), [[]]
    while todo:
        prefix = todo.pop()
        state = search.start_decoding(torch.tensor([src + [EOS]]))
        mask = None
        for tok in [BOS] + prefix:
            mask = torch.isfinite(search.decode_step(torch.tensor([tok]), state))[0]
        for tok in mask.nonzero().squeeze(1).tolist():
            if tok == EOS:
                done.add(tuple(PIECES[i] for i in prefix))
            elif len(prefix) < limit:
                todo.append(prefix + [tok])
    return done


@pytest.mark.slow
@pytest.mark.parametrize("words,src,leaves,limit", [
    (True, ["\u2581a", "c", "\u2581b"], ["\u2581a", "c", "\u2581b"], 7),  # a word of two pieces, then one of one
    (False, ["\u2581a", "c", "\u2581b"], ["\u2581XX", "\u2581XX"], 7),  # the paper's XX: one leaf per word
    (True, ["\u2581b"], ["\u2581b"], 7),
])
def test_tree_search_allows_exactly_the_valid_trees_brute_force(words, src, leaves, limit):
    search = TreeSearch(_Flat(), _Tok(), words)
    allowed = _reachable(search, [PIECES.index(p) for p in src], limit)
    alphabet = [p for p in PIECES[4:] if p not in ("\u2581XX",) or not words]
    truth = set()
    for n in range(limit + 1):
        for seq in __import__("itertools").product(alphabet, repeat=n):
            if _valid(list(seq), leaves):
                truth.add(seq)
    assert allowed == truth and len(truth) > 5


def test_tree_search_refuses_a_vocabulary_without_brackets():
    class Plain(_Tok):
        def id_to_piece(self, ids):
            return ["\u2581w" if i > 3 else "<x>" for i in ids]
    with pytest.raises(TreeError, match="no bracket symbols"):
        TreeSearch(_Flat(), Plain(), True)


# -- the pointer input (model.pointer_input) ----------------------------------------------------------
def test_pointer_follows_the_leaves_by_hand():
    from aiayn.parsing.pointer import next_positions

    a, b, c, op, cl = 10, 11, 12, 5, 6  # source words a b c (then EOS); brackets op/cl
    src = torch.tensor([[a, b, c, EOS], [a, EOS, 0, 0]])
    tgt_in = torch.tensor([[BOS, op, a, b, cl, c, cl], [BOS, op, a, cl, 0, 0, 0]])
    # input t has placed the leaves among tgt_in[:t+1]: the next word is at that count, EOS once all are
    assert next_positions(src, tgt_in).tolist() == [[0, 0, 1, 2, 2, 3, 3], [0, 0, 1, 1, 1, 1, 1]]
    # a word out of turn is not a leaf: the pointer waits for the next one
    assert next_positions(src[:1], torch.tensor([[BOS, b, a, c]])).tolist() == [[0, 0, 1, 1]]


def test_pointer_model_steps_equal_teacher_forcing_and_group_like_copies():
    from conftest import check_cached_steps_and_padding, check_grouped_cache

    from aiayn.config import ConfigError, ModelConfig
    from aiayn.parsing.model import ParserTransformer

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=23, d_model=16, d_ff=32, h=2, N=2, p_drop=0.0, pointer_input=True)
    m = ParserTransformer(cfg).eval()
    check_cached_steps_and_padding(m)
    check_grouped_cache(m)
    src, tgt = torch.randint(4, 23, (2, 5)), torch.randint(4, 23, (2, 4))
    plain = m(src, tgt)
    torch.nn.init.zeros_(m.pointer_proj.weight)
    assert not torch.allclose(plain, m(src, tgt))  # the pointer reaches the logits
    with pytest.raises(ConfigError, match="pointer_input is a Transformer option"):
        ModelConfig(arch="rnn", pointer_input=True).validate()


# -- the depth input (model.depth_input) --------------------------------------------------------------
def test_bracket_depth_counts_open_brackets_by_hand():
    from aiayn.parsing.pointer import BracketDepth, bracket_deltas

    pieces = ["<pad>", "<s>", "</s>", "<unk>", "\u2581(S", "\u2581)S", "\u2581(NP", "\u2581)NP", "\u2581the", "\u2581(",
              "\u2581)", "("]
    assert bracket_deltas(pieces).tolist() == [0, 0, 0, 0, 1, -1, 1, -1, 0, 0, 0, 0]  # a bare ( is a word
    d = BracketDepth(len(pieces), 8)
    d.delta.copy_(bracket_deltas(pieces))
    seen = []
    d._at = lambda depth: seen.append(depth.tolist()) or depth  # record the depths, not the embeddings
    d(torch.tensor([[1, 4, 6, 8, 7, 8, 5, 0]]))  # BOS (S (NP the )NP the )S pad
    assert seen == [[[0, 1, 2, 2, 1, 1, 0, 0]]]


def test_depth_model_steps_equal_teacher_forcing_and_the_depth_reaches_the_logits():
    from conftest import check_cached_steps_and_padding, check_grouped_cache

    from aiayn.config import ConfigError, ModelConfig
    from aiayn.parsing.model import ParserTransformer

    torch.manual_seed(0)
    for pointer in (False, True):
        cfg = ModelConfig(vocab_size=23, d_model=16, d_ff=32, h=2, N=2, p_drop=0.0, depth_input=True,
                          pointer_input=pointer)
        m = ParserTransformer(cfg).eval()
        m.depth.delta[4:8] = torch.tensor([1.0, -1.0, 1.0, -1.0])  # ids 4, 6 open; 5, 7 close
        check_cached_steps_and_padding(m)
        check_grouped_cache(m)
        src, tgt = torch.randint(4, 23, (2, 5)), torch.tensor([[BOS, 4, 6, 9, 7], [BOS, 4, 9, 9, 5]])
        plain = m(src, tgt)
        m.depth.delta.zero_()  # every input at depth 0: different logits where the depth was not 0
        assert not torch.allclose(plain[:, 1:], m(src, tgt)[:, 1:])
        assert torch.allclose(plain[:, 0], m(src, tgt)[:, 0], atol=1e-6)
    with pytest.raises(ConfigError, match="depth_input is a Transformer option"):
        ModelConfig(arch="rnn", depth_input=True).validate()


# -- subtree augmentation (prepare --subtrees) ----------------------------------------------------------
def test_constituents_by_hand_and_the_augmented_training_split(tmp_path):
    from aiayn.parsing.trees import constituents, write_splits

    t = clean(one("( (S (NP (DT A) (NN cat)) (VP (VBZ sits) (PP (IN on) (NP (DT the) (NN mat)))) (. .)) )"))
    assert [str(c) for c in constituents(t, 2)] == [
        "(NP (DT A) (NN cat))", "(VP (VBZ sits) (PP (IN on) (NP (DT the) (NN mat))))",
        "(PP (IN on) (NP (DT the) (NN mat)))", "(NP (DT the) (NN mat))"]
    assert [str(c) for c in constituents(t, 3)] == ["(VP (VBZ sits) (PP (IN on) (NP (DT the) (NN mat))))",
                                                    "(PP (IN on) (NP (DT the) (NN mat)))"]
    (tmp_path / "tb").mkdir()
    tb = tiny_treebank(tmp_path / "tb")
    plain = write_splits(tb, tmp_path / "plain")
    aug = write_splits(tb, tmp_path / "aug", subtrees=2)
    p_src, p_tgt = (f.read_text().splitlines() for f in plain["train"])
    a_src, a_tgt = (f.read_text().splitlines() for f in aug["train"])
    assert a_src[:len(p_src)] == p_src and a_tgt[:len(p_tgt)] == p_tgt  # every sentence, first and as before
    extra = list(zip(a_src[len(p_src):], a_tgt[len(p_tgt):]))
    # each distinct constituent of 2+ words once: the dog / A cat / sits on the mat / on the mat / the mat / a dog;
    # "saw a dog" is a VP of 3 words; Bob's NP and the VPs of one word are too short
    assert sorted(s for s, _ in extra) == sorted(["The dog", "A cat", "sits on the mat", "on the mat", "the mat",
                                                  "saw a dog", "a dog"])
    for s, tgt in extra:  # the pairs read back as trees over their own words
        assert delinearize(" ".join(x if is_bracket(x) else LEAF for x in tgt.split()), s.split()).words() == s.split()
    for split in ("valid", "test"):  # only training is augmented; the gold trees are the sentences'
        assert [f.read_text() for f in aug[split]] == [f.read_text() for f in plain[split]]
    assert (tmp_path / "aug/train.gold.mrg").read_text() == (tmp_path / "plain/train.gold.mrg").read_text()


@pytest.mark.long
@pytest.mark.slow
def test_ptb_script_trains_members_side_by_side_and_parses_with_their_ensemble(tmp_path):
    """scripts/ptb.sh as the README runs it (MEMBERS unset: two) on a tiny treebank: two seeds trained at
    once, each averaged, both splits parsed by their ensemble into trees over exactly the words, then scored."""
    import os

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "tb").mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "MEMBERS"}, "TREEBANK": str(tiny_treebank(tmp_path / "tb")),
           "RUN": str(tmp_path / "run"), "DATA": str(tmp_path / "data")}
    p = subprocess.run(["bash", str(repo / "scripts/ptb.sh"), "--model.d_model", "16", "--model.d_ff", "32",
                        "--model.N", "1", "--train.max_steps", "6", "--data.max_tokens", "600"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]
    for k in (1, 2):
        run = tmp_path / f"run/member{k}"
        assert (run / "averaged.safetensors").is_file()
        assert f"--train.seed {k}" in " ".join(__import__("json").loads((run / "run.json").read_text())
                                               ["sessions"][0]["command"])
    for split in ("valid", "test"):
        words = (tmp_path / f"data/{split}.words.txt").read_text().splitlines()
        for kind in ("parsed", "free"):
            trees = read_trees((tmp_path / f"run/{split}.{kind}.mrg").read_text())
            assert [t.words() for t in trees] == [line.split() for line in words]
    assert p.stdout.count("2 parser(s)") == 2 and p.stdout.count("F1 ") >= 6


def test_a_treebank_zip_is_read_in_bounded_pieces_and_names_are_unique(tmp_path, monkeypatch):
    """A member larger than a .mrg file may be is refused unread (and read at most that far, whatever
    its header claims: a zip bomb claims little); two members with one base name were silently one."""
    import zipfile

    import aiayn.parsing.trees as parse

    tree = "( (S (NP (NN dog)) (VP (VBZ runs))) )\n"
    dup = tmp_path / "dup.zip"
    with zipfile.ZipFile(dup, "w") as z:
        z.writestr("treebank/a/wsj_0001.mrg", tree)
        z.writestr("treebank/b/wsj_0001.mrg", tree)
    with pytest.raises(TreeError, match="a second wsj_0001.mrg"):
        read_treebank(dup)
    big = tmp_path / "big.zip"
    with zipfile.ZipFile(big, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("treebank/wsj_0001.mrg", tree * 200)
    monkeypatch.setattr(parse, "MAX_MRG_BYTES", 1000)
    with pytest.raises(TreeError, match="wsj_0001.mrg: 7,600 bytes; a .mrg file may hold 1,000"):
        read_treebank(big)
    folder = tmp_path / "tb"
    folder.mkdir()
    (folder / "wsj_0002.mrg").write_text(tree * 200)
    with pytest.raises(TreeError, match="wsj_0002.mrg: 7,600 bytes"):
        read_treebank(folder)
    many = tmp_path / "many.zip"  # each member under the file bound, together over the treebank's
    with zipfile.ZipFile(many, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(10):
            z.writestr(f"treebank/wsj_{i:04d}.mrg", tree * 20)
    monkeypatch.setattr(parse, "MAX_TREEBANK_BYTES", 3000)
    with pytest.raises(TreeError, match="more than 3,000 bytes in all \\(at .*wsj_0003.mrg\\)"):
        read_treebank(many)
