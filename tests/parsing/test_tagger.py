"""Part-of-speech tags beside the parser's words (tagger.py, model.tag_input)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_treebank
from safetensors.torch import save_file
from test_treesearch import aiayn

from aiayn.checkpoint import CheckpointError, load_checkpoint, read_weights
from aiayn.cli import main
from aiayn.config import ConfigError, ModelConfig
from aiayn.data.tokenizer import EOS, PAD, Tokenizer
from aiayn.models.build import build_model
from aiayn.models.transformer import Transformer
from aiayn.parsing.model import build_any, read_tagger
from aiayn.parsing.tagger import OTHER, TAG_ID, SourceTagger, Tagger, jackknife, subword_tags
from aiayn.parsing.trees import read_trees
from aiayn.parsing.treesearch import Parser

pytest.importorskip("nltk")

SENTS = [[("the", "DT"), ("dog", "NN"), ("runs", "VBZ")], [("a", "DT"), ("cat", "NN"), ("sits", "VBZ")],
         [("the", "DT"), ("cat", "NN"), ("saw", "VBD"), ("a", "DT"), ("dog", "NN")],
         [("dogs", "NNS"), ("run", "VBP")], [("a", "DT"), ("zyzzyva", "FW"), ("sleeps", "VBZ")]]


def test_json_round_trip_tags_as_the_trained_tagger():
    tagger = Tagger.train(SENTS * 4)
    again = Tagger.from_json(tagger.to_json())
    probes = [["the", "cat", "runs"], ["a", "dogs", "saw", "unknown", "words"], []]
    assert [again.tag(p) for p in probes] == [tagger.tag(p) for p in probes]
    assert tagger.tag(["the", "dog", "runs"]) == ["DT", "NN", "VBZ"]  # it learned the training tags


def test_training_is_seeded_and_leaves_the_global_random_state_alone():
    import random

    random.seed(5)
    before = random.random()
    random.seed(5)
    a = Tagger.train(SENTS * 3).to_json()
    assert random.random() == before
    assert Tagger.train(SENTS * 3).to_json() == a


def test_jackknifed_tags_come_from_taggers_that_never_saw_the_sentence():
    # "zyzzyva" (FW) occurs once: a tagger trained on every sentence knows it; the jackknifed one cannot.
    sents = SENTS * 2 + [[("a", "DT"), ("quux", "FW"), ("runs", "VBZ")]]
    assert Tagger.train(sents).tag(["a", "quux", "runs"])[1] == "FW"
    tags = jackknife(sents, folds=len(sents))  # leave one out
    assert [len(t) for t in tags] == [len(s) for s in sents]
    assert tags[-1][1] != "FW"
    with pytest.raises(Exception, match="not a tagger"):
        Tagger.from_json("{}")


def test_subword_tags_repeat_each_words_tag_over_its_pieces(tmp_path):
    # Independent truth: SentencePiece splits at spaces first, so a sentence's pieces are its words' pieces.
    lines = ["the quick brown fox jumps over the lazy dog", "unbelievable things happen", "a b c"] * 20
    tok = Tokenizer.train(lines, vocab_size=60)
    tags = ["DT", "JJ", "JJ", "NN", "VBZ", "IN", "DT", "JJ", "NN"]
    sentence = lines[0].split()
    want = [TAG_ID[t] for w, t in zip(sentence, tags) for _ in tok.pieces(w)]
    assert subword_tags(tok.pieces(lines[0]), tags) == want
    assert subword_tags(tok.pieces("a b"), ["DT", "NOT-A-PTB-TAG"])[-1] == OTHER
    # The model's tagger: ids -> the same ids, rows padded with 0 after the words (EOS, padding).
    tagger = Tagger.train([list(zip(sentence, tags))] * 5)
    st = SourceTagger(tagger, tok.pieces_list())
    ids = tok.encode([lines[0]])[0]
    src = torch.tensor([ids + [EOS], ids[:2] + [EOS] + [PAD] * (len(ids) - 2)])
    out = st(src)
    assert out[0, :len(ids)].tolist() == want and out[0, len(ids)] == 0
    assert out[1, 2:].tolist() == [0] * (len(ids) - 1)


def test_tags_reach_the_encoder_and_the_tagger_is_a_second_path_to_them():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=30, d_model=16, d_ff=32, h=2, N=1, p_drop=0.0, tag_input=True)
    m = build_any(cfg).eval()  # the parser's model (parsing/model.py)
    src, tgt = torch.randint(4, 30, (2, 5)), torch.randint(4, 30, (2, 4))
    tags = torch.randint(1, 40, (2, 5))
    with pytest.raises(ValueError, match="neither tags nor a tagger"):
        m(src, tgt)
    a = m(src, tgt, tags)
    assert not torch.allclose(a, m(src, tgt, torch.ones_like(tags)))  # tags change the output
    m.src_tagger = lambda s: tags
    assert torch.equal(m(src, tgt), a)  # the model's own tagger gives what explicit tags give
    assert not hasattr(build_any(ModelConfig(vocab_size=30, d_model=16, d_ff=32, h=2, N=1)), "tag_embed")
    assert type(build_any(ModelConfig(vocab_size=30, d_model=16, d_ff=32, h=2, N=1))) is Transformer
    with pytest.raises(ConfigError, match="model.tag_input is an input of §6.3's parser"):
        build_model(cfg)  # the translation models' builder knows no parser


@pytest.mark.slow
def test_prepare_with_tags_train_and_parse_end_to_end(tmp_path, capsys):
    """prepare --tags writes a tagger and jackknifed tags aligned with every source subword; a model with
    model.tag_input trains on them and its checkpoint parses with the tagger it carries."""
    (tmp_path / "tb").mkdir()
    tb = tiny_treebank(tmp_path / "tb")
    prep, run = tmp_path / "prep", tmp_path / "run"
    logs, arrays = [], []
    for i in range(3):  # again (scripts/ptb.sh re-run): the folder is reused and its taggers are not retrained;
        if i == 2:  # a third time with a tag array lost (a crash before it was written): it comes back the same
            (prep / "train.src.tag.npy").unlink()
        p = aiayn("prepare", "--task", "parse", "--tags", "--treebank", tb, "-o", prep, "--preset", "parse",
                  "--data.vocab_size", "60")
        assert p.returncode == 0, p.stderr[-1500:]
        logs.append(p.stderr)
        arrays.append((prep / "train.src.tag.npy").read_bytes())
    assert ["training a part-of-speech tagger" in x for x in logs] == [True, False, False]
    assert ["reusing the prepared data" in x for x in logs] == [False, True, True]
    assert arrays[0] == arrays[1] == arrays[2]
    from aiayn.files import owned

    assert owned(prep, "prepare")  # the tag arrays written after the swap are in its marker: replaceable
    tok = Tokenizer.load(str(prep / "spm.model"))
    jk = {" ".join(w): t.split() for w, t in zip(
        (s.words() for s in read_trees((prep / "train.gold.mrg").read_text())),
        (prep / "raw/train.tags").read_text().splitlines())}
    ids, off = np.load(prep / "train.src.tok.npy"), np.load(prep / "train.src.off.npy")
    tags = np.load(prep / "train.src.tag.npy")
    for i in range(len(off) - 1):
        words = tok.decode([ids[off[i]:off[i + 1]].tolist()])[0]
        want = [TAG_ID[t] for w, t in zip(words.split(), jk[words]) for _ in tok.pieces(w)]
        assert tags[off[i]:off[i + 1]].tolist() == want
    common = ["--preset", "parse", "--model.d_model", "32", "--model.d_ff", "64", "--model.N", "1",
              "--train.max_steps", "6", "--train.max_minutes", "0", "--train.threads", "1", "--data.max_tokens", "600"]
    p = aiayn("train", "--data", prep, "--run-dir", run, *common, "--model.tag_input", "true")
    assert p.returncode == 0, p.stderr[-1500:]
    ckpt = sorted((run / "checkpoints").glob("step-*.safetensors"))[-1]
    with pytest.raises(CheckpointError, match="model.pointer_input is an input of §6.3's parser"):
        load_checkpoint(ckpt)  # without the parser's builder: one line
    words = (prep / "test.words.txt").read_text().splitlines()
    assert read_tagger(ckpt).tag(words[0].split()) == Tagger.from_json((prep / "tagger.json").read_text()).tag(
        words[0].split())
    p = aiayn("parse", "--checkpoint", ckpt, "-i", prep / "test.words.txt", "-o", tmp_path / "hyp.mrg")
    assert p.returncode == 0, p.stderr[-1500:]
    trees = read_trees((tmp_path / "hyp.mrg").read_text())
    assert [t.words() for t in trees] == [w.split() for w in words]
    tagger = Tagger.from_json((prep / "tagger.json").read_text())
    assert [[tag for tag, _ in t.tagged()] for t in trees] == [tagger.tag(w.split()) for w in words]  # not XX
    # A checkpoint without its tagger, and data without tags, are refused in one line.
    tensors, meta = read_weights(ckpt)
    extra = json.loads(meta["extra"])
    del extra["tagger"]
    save_file(tensors, tmp_path / "untagged.safetensors", {**meta, "extra": json.dumps(extra)})
    with pytest.raises(CheckpointError, match="untagged.safetensors: damaged metadata .model.tag_input is on"):
        Parser.load(tmp_path / "untagged.safetensors")
    p = aiayn("prepare", "--task", "parse", "--treebank", tb, "-o", tmp_path / "plain", "--preset", "parse-paper",
              "--data.vocab_size", "60")  # words alone: the paper's model reads no tags
    assert p.returncode == 0, p.stderr[-1500:]
    assert not (tmp_path / "plain/train.src.tag.npy").exists()
    p = aiayn("prepare", "--task", "parse", "--treebank", tb, "-o", tmp_path / "auto", "--preset", "parse",
              "--data.vocab_size", "60")
    assert p.returncode == 0, p.stderr[-1500:]
    assert (tmp_path / "auto/train.src.tag.npy").exists()  # the parse preset's model reads tags: prepare tags
    capsys.readouterr()  # refused in one line, by the verb run in this process
    assert main(["train", "--data", str(tmp_path / "plain"), "--run-dir", str(tmp_path / "run2"), *common,
                 "--model.tag_input", "true"]) == 2
    assert "train.src.tag.npy is missing: model.tag_input needs data prepared with tags" in capsys.readouterr().err


def test_a_tagger_nested_past_the_recursion_limit_is_one_error():
    from aiayn.parsing.tagger import Tagger, TaggerError

    with pytest.raises(TaggerError, match="not a tagger"):
        Tagger.from_json('{"weights": ' + "[" * 100_000 + "]" * 100_000 + "}", "tagger.json")


def test_a_tagger_file_is_read_bounded(tmp_path):
    """tagger.json of a prepared parse folder is read as untrusted: a FIFO is refused, not waited on."""
    import os

    from aiayn.files import FileError
    from aiayn.parsing.tagger import tagger_text

    os.mkfifo(tmp_path / "tagger.json")
    with pytest.raises(FileError, match="tagger.json: not a regular file"):
        tagger_text(tmp_path)


def test_a_prepared_folders_gold_trees_are_read_bounded(tmp_path):
    """Reusing a tagged parse folder reads its train.gold.mrg as untrusted: a FIFO there is refused, not waited on."""
    import os

    from aiayn.files import FileError
    from aiayn.parsing.treebank_data import _read_tagging

    os.mkfifo(tmp_path / "train.gold.mrg")
    with pytest.raises(FileError, match="train.gold.mrg: not a regular file"):
        _read_tagging(tmp_path)
