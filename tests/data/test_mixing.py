"""Weighted training corpora (data/mixing.py): back-translated pairs tagged <BT> (Caswell et al. 2019),
each corpus's weight read back and honoured by every epoch, the tag never a source word."""

import json
from collections import Counter

import numpy as np
import pytest

from aiayn.cli import main
from aiayn.config import Config
from aiayn.data.alignments import reference_links
from aiayn.data.batches import TokenData
from aiayn.data.mixing import BT_TAG, TrainingCorpus, corpus_pool
from aiayn.data.prepare import prepare
from aiayn.data.text import DataError
from aiayn.data.tokenizer import load_tokenizer
from aiayn.training.step import epoch_batches


def _splits(d):
    return {name: (d / f"{name}.en", d / f"{name}.de") for name in ("train", "valid", "test")}


@pytest.fixture(scope="module")
def synthetic(toy_corpus, tmp_path_factory):
    """A back-translated corpus: the toy corpus's German with a source of the German words reversed
    (a stand-in for a DE->EN model's output), 200 pairs."""
    d = tmp_path_factory.mktemp("bt")
    de = (toy_corpus / "train.de").read_text().splitlines()[:200]
    (d / "bt.en").write_text("".join(" ".join(reversed(x.split())) + "\n" for x in de))
    (d / "bt.de").write_text("".join(x + "\n" for x in de))
    return d


@pytest.fixture(scope="module")
def mixed(toy_corpus, synthetic, tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed") / "prep"
    bt = TrainingCorpus("synthetic1", synthetic / "bt.en", synthetic / "bt.de", weight=0.5)
    manifest = prepare(_splits(toy_corpus), out, "en", "de", vocab_size=80, max_len=32, corpora=(bt,),
                       train_weight=2.0)
    return out, manifest


def test_synthetic_sources_carry_the_bt_tag_and_genuine_ones_do_not(mixed):
    out, manifest = mixed
    tok = load_tokenizer(str(out / "spm.model"))
    bt = tok.control_id(BT_TAG)
    assert bt is not None and bt in tok.markers
    data = TokenData(out, "train")
    labels, weights = data.corpora
    assert weights.tolist() == [2.0, 0.5]
    splits = manifest["splits"]
    assert int((labels == 0).sum()) == splits["train.parallel"]["pairs"]
    assert int((labels == 1).sum()) == splits["train.synthetic1"]["pairs"] > 150
    parts = splits["train.parallel"]["pairs"] + splits["train.synthetic1"]["pairs"]
    assert len(data) == splits["train"]["pairs"] == parts
    firsts = np.array([data.src(i)[0] for i in range(len(data))])
    assert np.all(firsts[labels == 1] == bt) and not np.any(firsts[labels == 0] == bt)
    assert bt not in {int(x) for i in np.flatnonzero(labels == 1) for x in data.src(i)[1:]}
    # the tag is a control piece: text that spells it is never encoded as it
    assert bt not in tok.encode([f"{BT_TAG} the dog"])[0]
    assert manifest["settings"]["corpora"][1] == {"name": "synthetic1", "weight": 0.5, "synthetic": True,
                                                  "tag": BT_TAG}


def test_every_epoch_draws_each_corpus_by_its_weight_the_same_after_a_resume(mixed):
    out, _ = mixed
    data = TokenData(out, "train")
    labels, weights = data.corpora
    cfg = Config()
    cfg.data.max_tokens = 200
    seen = Counter(int(i) for b in epoch_batches(data, cfg, 3) for i in b)
    genuine, synth = np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)
    assert all(seen[int(i)] == 2 for i in genuine)  # weight 2: every genuine pair twice
    drawn = [int(i) for i in synth if seen[int(i)]]
    assert len(drawn) == round(0.5 * len(synth)) and all(seen[i] == 1 for i in drawn)  # half, without repeats
    again = [b.tolist() for b in epoch_batches(data, cfg, 3)]
    assert again == [b.tolist() for b in epoch_batches(data, cfg, 3)]
    other = {int(i) for b in epoch_batches(data, cfg, 4) for i in b if labels[int(i)] == 1}
    assert other != set(drawn)  # a fresh half each epoch


def test_weights_of_one_draw_every_pair_once():
    labels = np.array([0, 0, 1, 1, 1], np.int16)
    assert corpus_pool(labels, np.array([1.0, 1.0]), 1, 0) is None
    pool = corpus_pool(labels, np.array([0.0, 3.0]), 1, 0)
    assert sorted(Counter(pool.tolist()).items()) == [(2, 3), (3, 3), (4, 3)]


def test_guided_links_never_point_at_the_tag(mixed):
    out, _ = mixed
    data = TokenData(out, "train")
    tok = load_tokenizer(str(out / "spm.model"))
    flat, offsets = reference_links(data, tok)
    labels = data.corpora[0]
    tagged = [i for i in range(len(data)) if labels[i] == 1]
    assert tagged and all(not np.any(flat[offsets[i]:offsets[i + 1], 0] == 0) for i in tagged)
    assert all(np.all(flat[offsets[i]:offsets[i + 1], 0] < len(data.src(i))) for i in range(len(data)))
    assert sum(offsets[i + 1] - offsets[i] for i in tagged) > len(tagged)  # the synthetic pairs are aligned


def test_a_changed_weight_prepares_anew_and_the_same_one_reuses(toy_corpus, synthetic, tmp_path):
    out = tmp_path / "prep"
    bt = TrainingCorpus("synthetic1", synthetic / "bt.en", synthetic / "bt.de")
    first = prepare(_splits(toy_corpus), out, "en", "de", vocab_size=80, max_len=32, corpora=(bt,))
    assert not np.any(TokenData(out, "train").corpora[1] != 1.0)
    assert TokenData(out, "train").corpora is not None and corpus_pool(*TokenData(out, "train").corpora, 1, 0) is None
    again = prepare(_splits(toy_corpus), out, "en", "de", vocab_size=80, max_len=32, corpora=(bt,))
    assert again == first
    heavier = TrainingCorpus("synthetic1", bt.src, bt.tgt, weight=3.0)
    prepare(_splits(toy_corpus), out, "en", "de", vocab_size=80, max_len=32, corpora=(heavier,))
    assert TokenData(out, "train").corpora[1].tolist() == [1.0, 3.0]


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf"), 1e9])
def test_a_bad_weight_is_one_line(toy_corpus, synthetic, tmp_path, weight):
    bt = TrainingCorpus("synthetic1", synthetic / "bt.en", synthetic / "bt.de", weight=weight)
    with pytest.raises(DataError, match="corpus weight is a number"):
        prepare(_splits(toy_corpus), tmp_path / "p", "en", "de", vocab_size=80, corpora=(bt,))
    assert not (tmp_path / "p").exists()


def test_a_vocabulary_without_the_tag_is_refused_for_tagged_data(toy_corpus, toy_prepared, synthetic, tmp_path):
    bt = TrainingCorpus("synthetic1", synthetic / "bt.en", synthetic / "bt.de")
    vocab = (toy_prepared / "spm.model").read_bytes()
    with pytest.raises(DataError, match="no <BT> piece"):
        prepare(_splits(toy_corpus), tmp_path / "p", "en", "de", corpora=(bt,), vocabulary=vocab)
    untagged = TrainingCorpus("synthetic1", bt.src, bt.tgt, tag=False)
    prepare(_splits(toy_corpus), tmp_path / "q", "en", "de", corpora=(untagged,), vocabulary=vocab)
    assert TokenData(tmp_path / "q", "train").corpora is not None


def test_damaged_corpus_files_are_one_line(mixed, tmp_path):
    import shutil

    src, _ = mixed
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    n = len(TokenData(out, "train"))
    np.save(out / "train.corpus.npy", np.zeros(n - 1, np.int16))
    with pytest.raises(DataError, match="corpus labels for"):
        TokenData(out, "train")
    np.save(out / "train.corpus.npy", np.full(n, 5, np.int16))
    with pytest.raises(DataError, match="not one of the 2 weighted"):
        TokenData(out, "train")
    np.save(out / "train.corpus.npy", np.zeros(n, np.int16))
    np.save(out / "train.corpus_weights.npy", np.array([0.0, 1.0]))
    with pytest.raises(DataError, match="every corpus has weight 0"):
        TokenData(out, "train")
    (out / "train.corpus_weights.npy").write_bytes(b"not numpy")
    with pytest.raises(DataError, match="unreadable corpus files"):
        TokenData(out, "train")


def test_prepare_synthetic_from_the_command_line(toy_corpus, synthetic, tmp_path, capsys):
    base = ["prepare", "--data-dir", str(toy_corpus), "--src", "en", "--tgt", "de", "--data.vocab_size", "80"]
    assert main([*base, "-o", str(tmp_path / "a"), "--synthetic", str(synthetic / "bt.en")]) == 2
    assert "SRC_FILE,TGT_FILE" in capsys.readouterr().err
    assert main([*base, "-o", str(tmp_path / "a"), "--train-weight", "2"]) == 2
    assert "there are none" in capsys.readouterr().err
    bt = f"{synthetic / 'bt.en'},{synthetic / 'bt.de'}"
    assert main([*base, "-o", str(tmp_path / "a"), "--synthetic", bt, "--synthetic-weight", "1",
                 "--synthetic-weight", "2"]) == 2
    assert "one weight for every" in capsys.readouterr().err
    assert main([*base, "-o", str(tmp_path / "a"), "--synthetic", bt, "--synthetic-weight", "0.5",
                 "--train-weight", "2"]) == 0
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert [c["weight"] for c in manifest["settings"]["corpora"]] == [2.0, 0.5]
    assert manifest["splits"]["train"]["corpora"] == ["parallel", "synthetic1"]


def test_guided_links_skip_the_language_tag_of_many_directions(toy_corpus, tmp_path):
    from conftest import toy_multilingual

    from aiayn.data.directions import prepare_many

    d = toy_multilingual(toy_corpus, tmp_path / "multi")
    splits = {(s, t): {n: (d / f"{n}.{s}", d / f"{n}.{t}") for n in ("train", "valid")}
              for s, t in (("en", "de"), ("en", "fr"))}
    prepare_many(splits, tmp_path / "p", vocab_size=90, max_len=32)
    data = TokenData(tmp_path / "p", "train")
    tok = load_tokenizer(str(tmp_path / "p" / "spm.model"))
    flat, offsets = reference_links(data, tok)
    assert all(data.src(i)[0] in tok.markers for i in range(len(data)))
    assert not np.any(flat[:, 0] == 0) and len(flat) > len(data)
