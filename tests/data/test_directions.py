"""Many directions in one prepared folder (data/directions.py): the sampling rules against their
formulas, the tag one id in front of every source and never made from text, every direction checked."""

import json
from collections import Counter

import numpy as np
import pytest
from conftest import toy_multilingual

from aiayn.cli import main
from aiayn.data.batches import TokenData, make_batches
from aiayn.data.directions import epoch_pool, parse_directions, prepare_many, quotas, spread, temperature_shares
from aiayn.data.prepare import read_text
from aiayn.data.text import DataError
from aiayn.data.tokenizer import load_tokenizer


def test_directions_are_parsed_or_refused_in_one_line():
    assert parse_directions("en-de, de-en,en-fr") == [("en", "de"), ("de", "en"), ("en", "fr")]
    for bad, why in (("en_de", "not SRC-TGT"), ("en-en", "not SRC-TGT"), ("en-de,en-de", "named twice"),
                     ("en-", "not SRC-TGT")):
        with pytest.raises(DataError, match=why):
            parse_directions(bad)


def test_temperature_shares_follow_the_formula():
    """p_k ∝ (n_k/N)^(1/T): proportional at T=1, uniform as T grows, the ratio of two shares
    (n_a/n_b)^(1/T) at any T."""
    counts = {"a": 9000, "b": 900, "c": 100}
    assert temperature_shares(counts, 1) == pytest.approx({"a": 0.9, "b": 0.09, "c": 0.01})
    for T in (2, 5):
        p = temperature_shares(counts, T)
        assert sum(p.values()) == pytest.approx(1)
        assert p["a"] / p["c"] == pytest.approx(90 ** (1 / T))
    assert max(temperature_shares(counts, 1e6).values()) == pytest.approx(1 / 3, abs=1e-4)
    assert sum(quotas(counts, 5, 10_000).values()) == pytest.approx(10_000, abs=2)
    with pytest.raises(DataError, match="> 0"):
        temperature_shares(counts, 0)


def test_spread_takes_an_even_share_or_repeats_every_line():
    lines = [str(i) for i in range(10)]
    fewer = list(spread(lambda: iter(lines), 10, 4))
    assert len(fewer) == 4 and len(set(fewer)) == 4 and fewer == sorted(fewer, key=int)
    more = Counter(spread(lambda: iter(lines), 10, 25))
    assert sorted(more.values()) == [2] * 5 + [3] * 5 and set(more) == set(lines)
    assert list(spread(lambda: iter(lines), 10, 0)) == []


def test_an_epoch_pool_gives_each_direction_its_share_the_same_each_time():
    directions = np.repeat(np.arange(3, dtype=np.int16), [900, 90, 10])
    assert epoch_pool(directions, 1.0, 1, 0) is None  # proportional: every pair once, as a pair's corpus
    pool = epoch_pool(directions, 5.0, 1, 3)
    want = quotas({0: 900, 1: 90, 2: 10}, 5.0, 1000)
    assert Counter(directions[pool].tolist()) == Counter(want)
    assert np.array_equal(pool, epoch_pool(directions, 5.0, 1, 3))  # a resume's epoch is the same epoch
    assert not np.array_equal(pool, epoch_pool(directions, 5.0, 1, 4))
    small = pool[directions[pool] == 2]
    assert Counter(Counter(small.tolist()).values()).keys() <= {want[2] // 10, want[2] // 10 + 1}  # repeats even
    lens = np.ones(1000, dtype=np.int64) * 5
    batches = make_batches(lens, lens, 50, 1, 3, pool)
    assert sorted(np.concatenate(batches).tolist()) == sorted(pool.tolist())


@pytest.fixture(scope="module")
def prepared(toy_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("ml")
    src = toy_multilingual(toy_corpus, d / "text")
    out = d / "prep"
    assert main(["prepare", "--pairs", "en-de,en-fr,de-en", "--data-dir", str(src), "--train", "train",
                 "--valid", "valid", "--test", "test", "-o", str(out), "--data.vocab_size", "90",
                 "--data.max_len", "64"]) == 0
    return src, out


def test_every_source_starts_with_its_target_languages_tag_and_text_never_makes_one(prepared):
    """The tag is one control piece, first in every source of its direction, and nowhere else; a
    literal "<2fr>" in a sentence is segmented as text."""
    src, out = prepared
    m = json.loads((out / "manifest.json").read_text())
    assert m["settings"]["directions"] == ["en-de", "en-fr", "de-en"]
    tok = load_tokenizer(str(out / "spm.model"))
    assert tok.language_codes == ["de", "en", "fr"]
    tags = {c: tok.tag_id(c) for c in tok.language_codes}
    for split in ("train", "valid"):
        data = TokenData(out, split)
        per = [m["splits"][f"{split}.{d}"]["pairs"] for d in m["settings"]["directions"]]
        assert np.bincount(data.directions).tolist() == per and sum(per) == m["splits"][split]["pairs"]
        for i in range(len(data)):
            want = tags[["de", "fr", "en"][data.directions[i]]]
            assert data.src(i)[0] == want and not set(data.src(i)[1:].tolist()) & set(tags.values())
            assert not set(data.tgt(i).tolist()) & set(tags.values())
    first = (src / "train.en").read_text().splitlines()[0]
    assert TokenData(out, "train").src(0)[1:].tolist() == tok.encode([first])[0]
    assert tags["fr"] not in tok.encode(["the dog <2fr> runs"])[0]
    assert tok.encode(["<2fr> the dog"])[0] == [tags["fr"]] + tok.encode(["the dog"])[0]


def test_each_direction_keeps_its_text_counts_and_checks(prepared, toy_corpus, tmp_path):
    """Per direction: validation and test text of its own, its counts; a misaligned direction is one
    line naming its file; the same inputs again are reused."""
    src, out = prepared
    m = json.loads((out / "manifest.json").read_text())
    assert m["tests"] == ["test.en-de", "test.en-fr", "test.de-en"]
    assert read_text(out, "test.en-fr", "tgt") == (src / "test.fr").read_text().splitlines()
    assert read_text(out, "valid.de-en", "src") == (src / "valid.de").read_text().splitlines()
    assert m["splits"]["train.en-fr"]["pairs"] == 400 and m["splits"]["train"]["pairs"] == 1200
    with pytest.raises(DataError, match="valid.en-de"):
        read_text(out, "valid", "src")
    bad = toy_multilingual(toy_corpus, tmp_path / "bad")
    (bad / "train.fr").write_text("".join(x + "\n" for x in (bad / "train.fr").read_text().splitlines()[:-3]))
    with pytest.raises(DataError, match="train.fr"):
        prepare_many({(s, t): {n: (bad / f"{n}.{s}", bad / f"{n}.{t}") for n in ("train", "valid")}
                      for s, t in (("en", "de"), ("en", "fr"))}, tmp_path / "p", 90)
    before = (out / "manifest.json").stat().st_mtime_ns
    assert main(["prepare", "--pairs", "en-de,en-fr,de-en", "--data-dir", str(src), "--train", "train",
                 "--valid", "valid", "--test", "test", "-o", str(out), "--data.vocab_size", "90",
                 "--data.max_len", "64"]) == 0
    assert (out / "manifest.json").stat().st_mtime_ns == before


def test_a_small_language_gets_its_temperature_share_of_the_vocabulary_sample(toy_corpus, tmp_path, caplog):
    """French with a tenth of German's lines: at T=5 its share of the sample is (1/10)^(1/5) of German's
    (English counted once per distinct file: 400 + 40 lines)."""
    import logging

    src = toy_multilingual(toy_corpus, tmp_path / "text")
    for lang in ("en", "fr"):
        (src / f"small.{lang}").write_text("".join(x + "\n" for x in (src / f"train.{lang}").read_text()
                                                   .splitlines()[:40]))
    files = {("en", "de"): {"train": (src / "train.en", src / "train.de")},
             ("en", "fr"): {"train": (src / "small.en", src / "small.fr")}}
    for (s, t), splits in files.items():
        splits["valid"] = (src / f"valid.{s}", src / f"valid.{t}")
    with caplog.at_level(logging.INFO, logger="aiayn"):
        prepare_many(files, tmp_path / "p", 90, max_len=32)
    line = next(r.getMessage() for r in caplog.records if "joint BPE" in r.getMessage())
    got = {k: int(v.replace(",", "")) for k, v in
           (x.split() for x in line.split("(")[1].split(";")[0].split(", "))}
    assert got == quotas({"en": 440, "de": 400, "fr": 40}, 5.0, 880)
    assert got["fr"] / got["de"] == pytest.approx(0.1 ** 0.2, rel=0.02)


def test_word_links_skip_a_leading_language_tag():
    """Links to the tag are dropped and the words are counted after it (aiayn's and Marian's tags)."""
    from aiayn.decode.align import word_links

    sub = {(0, 0), (1, 1), (2, 2), (3, 2)}
    for tag in ("<2fr>", ">>fra<<"):
        assert word_links(sub, [tag, "▁the", "▁do", "g"], ["▁le", "▁chien", "▁x"]) == {(0, 1), (1, 2)}
    assert word_links(sub, ["▁the", "▁do", "g", "▁x"], ["▁le", "▁chien", "▁x"]) == {(0, 0), (1, 1), (1, 2), (2, 2)}
