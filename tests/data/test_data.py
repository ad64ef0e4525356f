"""Data preparation: validation with file:line messages, joint BPE, cache, batches."""

import gzip
import json
import unicodedata

import numpy as np
import pytest

from aiayn.cli import main
from aiayn.data.batches import TokenData, collate, make_batches
from aiayn.data.prepare import prepare
from aiayn.data.text import DataError, read_lines, read_parallel
from aiayn.data.tokenizer import BOS, EOS, PAD, Tokenizer

SENTS_EN = [f"the {a} dog runs to the {b} house number {i}" for i, (a, b) in
            enumerate(zip(["big", "small", "red", "old"] * 20, ["blue", "green", "white", "new"] * 20))]
SENTS_DE = [f"der {a} hund läuft zum {b} haus nummer {i}" for i, (a, b) in
            enumerate(zip(["große", "kleine", "rote", "alte"] * 20, ["blaue", "grüne", "weiße", "neue"] * 20))]


def write(path, lines, gz=False):
    data = "".join(x + "\n" for x in lines).encode("utf-8")
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def corpus(tmp_path, n_valid=10):
    d = tmp_path / "corpus"
    d.mkdir()
    write(d / "train.en.gz", SENTS_EN, gz=True)
    write(d / "train.de.gz", SENTS_DE, gz=True)
    write(d / "valid.en", SENTS_EN[:n_valid])
    write(d / "valid.de", SENTS_DE[:n_valid])
    return d


def test_misaligned_files_name_both(tmp_path):
    a = write(tmp_path / "a.en", ["x", "y", "z"])
    b = write(tmp_path / "b.de", ["x", "y"])
    with pytest.raises(DataError, match=r"a\.en has 3 lines but .*b\.de has 2"):
        read_parallel(a, b)


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "bad.en"
    p.write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    with pytest.raises(DataError, match=r"bad\.en:3: invalid UTF-8"):
        read_lines(p)


def test_empty_lines_dropped_and_counted_or_strict(tmp_path):
    a = write(tmp_path / "a.en", ["one", "", "three", "four"])
    b = write(tmp_path / "b.de", ["eins", "zwei", "  ", "vier"])
    s, t, dropped = read_parallel(a, b)
    assert (s, t, dropped) == (["one", "four"], ["eins", "vier"], 2)
    with pytest.raises(DataError, match=r"a\.en:2: empty line"):
        read_parallel(a, b, strict=True)


def test_nfc_normalization(tmp_path):
    decomposed = unicodedata.normalize("NFD", "Mädchen")
    assert decomposed != "Mädchen"
    p = write(tmp_path / "x.de", [decomposed])
    assert read_lines(p) == ["Mädchen"]


def test_joint_vocabulary_round_trips_both_languages():
    tok = Tokenizer.train(SENTS_EN + SENTS_DE, 120)
    assert (tok.sp.pad_id(), tok.sp.unk_id(), tok.sp.bos_id(), tok.sp.eos_id()) == (PAD, 1, BOS, EOS)
    ids = tok.encode([SENTS_EN[3], SENTS_DE[3]])
    assert tok.decode(ids) == [SENTS_EN[3], SENTS_DE[3]]
    assert Tokenizer(tok.proto).encode([SENTS_DE[5]]) == tok.encode([SENTS_DE[5]])


def test_prepare_filters_long_pairs_and_reuses_cache(tmp_path):
    d = corpus(tmp_path)
    long_en = write(d / "train2.en", SENTS_EN + ["word " * 200])
    long_de = write(d / "train2.de", SENTS_DE + ["wort " * 200])
    out = tmp_path / "prep"
    m = prepare({"train": (long_en, long_de), "valid": (d / "valid.en", d / "valid.de")}, out, "en", "de",
                vocab_size=120, max_len=40)
    assert m["splits"]["train"]["dropped_too_long"] == 1
    assert m["splits"]["train"]["pairs"] == len(SENTS_EN)
    data = TokenData(out, "train")
    tok = Tokenizer.load(str(out / "spm.model"))
    assert len(data) == len(SENTS_EN)
    assert tok.decode([data.src(7).tolist(), data.tgt(7).tolist()]) == [SENTS_EN[7], SENTS_DE[7]]
    stamp = (out / "train.src.tok.npy").stat().st_mtime_ns
    again = prepare({"train": (long_en, long_de), "valid": (d / "valid.en", d / "valid.de")}, out, "en", "de",
                    vocab_size=120, max_len=40)
    assert again == m and (out / "train.src.tok.npy").stat().st_mtime_ns == stamp
    changed = prepare({"train": (long_en, long_de), "valid": (d / "valid.en", d / "valid.de")}, out, "en",
                      "de", vocab_size=120, max_len=500)
    assert changed["splits"]["train"]["dropped_too_long"] == 0


def test_batches_cover_every_pair_once_within_budget():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 60, 1000), rng.integers(1, 60, 1000)
    batches = make_batches(src, tgt, 500, seed=3, epoch=0)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(1000))
    for b in batches:
        assert len(b) * max(src[b].max(), tgt[b].max()) <= 500
    # grouped by length: padding stays small compared with random batches
    pad = sum(len(b) * tgt[b].max() - tgt[b].sum() for b in batches)
    assert pad < 0.1 * tgt.sum()
    assert all(np.array_equal(x, y) for x, y in zip(batches, make_batches(src, tgt, 500, 3, 0)))
    other = make_batches(src, tgt, 500, 3, 1)
    assert any(len(x) != len(y) or not np.array_equal(x, y) for x, y in zip(batches, other))


def test_collate_adds_bos_eos_and_padding(tmp_path):
    d = corpus(tmp_path)
    out = tmp_path / "prep"
    prepare({"train": (d / "train.en.gz", d / "train.de.gz"), "valid": (d / "valid.en", d / "valid.de")},
            out, "en", "de", vocab_size=120, max_len=60)
    data = TokenData(out, "train")
    b = collate(data, np.array([3, 10]))
    for row, i in enumerate([3, 10]):
        s, t = data.src(i).tolist(), data.tgt(i).tolist()
        assert b.src[row, :len(s) + 1].tolist() == s + [EOS] and (b.src[row, len(s) + 1:] == PAD).all()
        assert b.tgt_in[row, :len(t) + 1].tolist() == [BOS] + t
        assert b.tgt_out[row, :len(t) + 1].tolist() == t + [EOS]
    assert b.n_tokens == int((b.tgt_out != PAD).sum())


def test_prepare_cli_local_corpus_and_errors(tmp_path, capsys):
    d = corpus(tmp_path)
    out = tmp_path / "prep"
    args = ["prepare", "--data-dir", str(d), "--src", "en", "--tgt", "de", "--out", str(out),
            "--data.vocab_size", "120"]
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["valid"]["pairs"] == 10 and manifest["vocab_size"] <= 120
    assert len(manifest["inputs"]["train"]["src_sha256"]) == 64
    write(d / "valid.de", SENTS_DE[:9])
    assert main(args) == 2
    assert "valid.de has 9" in capsys.readouterr().err
    assert main(["prepare", "--data-dir", str(d), "--src", "en", "--tgt", "fr", "--out", str(out)]) == 2
    assert "train.fr" in capsys.readouterr().err


def test_prepare_multi30k_from_local_copy_without_network(multi30k_dir, tmp_path, monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("network used")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    monkeypatch.setenv("AIAYN_MULTI30K", str(multi30k_dir))
    out = tmp_path / "m30k"
    assert main(["prepare", "--corpus", "multi30k", "--src", "en", "--tgt", "cs", "--out", str(out),
                 "--data.vocab_size", "500"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["pairs_in"] == 29000
    assert manifest["tests"] == ["test_2016_flickr"]  # test_2017 has no Czech side: skipped


def test_a_vocabulary_smaller_than_asked_is_reported(toy_corpus, tmp_path, caplog):
    splits = {name: (toy_corpus / f"{name}.en", toy_corpus / f"{name}.de") for name in ("train", "valid")}
    with caplog.at_level("WARNING", logger="aiayn"):
        manifest = prepare(splits, tmp_path / "loose", "en", "de", vocab_size=5000, max_len=32)
    got = manifest["vocab_size"]
    assert got < 5000
    assert f"has {got} subwords, fewer than the 5000 asked for" in caplog.text
    with pytest.raises(DataError, match=f"has {got} subwords.*--strict"):
        prepare(splits, tmp_path / "strict", "en", "de", vocab_size=5000, max_len=32, strict=True)
    assert not (tmp_path / "strict" / "spm.model").exists()


def test_streaming_prepare_equals_encoding_the_kept_pairs_whole(tmp_path, monkeypatch):
    """The chunked, two-pass prepare against a second path: every kept pair encoded at once with
    the learned vocabulary. Duplicates, an over-long pair and a wild length ratio are dropped and
    counted (in train only); chunk borders fall everywhere."""
    from aiayn.data import passes as data

    monkeypatch.setattr(data, "_CHUNK", 7)
    en, de = list(SENTS_EN), list(SENTS_DE)
    en += [SENTS_EN[3], SENTS_EN[3], SENTS_EN[5], "word " * 60, "a"]
    de += [SENTS_DE[3], SENTS_DE[3], "anders", "wort " * 60, "ein sehr langer satz mit vielen wörtern darin"]
    d = tmp_path / "c"
    d.mkdir()
    write(d / "train.en.gz", en, gz=True)
    write(d / "train.de", de)
    write(d / "valid.en", SENTS_EN[:6] + SENTS_EN[:2])
    write(d / "valid.de", SENTS_DE[:6] + SENTS_DE[:2])
    out = tmp_path / "prep"
    m = prepare({"train": (d / "train.en.gz", d / "train.de"), "valid": (d / "valid.en", d / "valid.de")}, out,
                "en", "de", vocab_size=120, max_len=40, max_ratio=3.0)
    t = m["splits"]["train"]
    assert (t["pairs_in"], t["dropped_duplicate"], t["dropped_too_long"], t["dropped_ratio"]) == (85, 2, 1, 1)
    assert m["splits"]["valid"]["pairs"] == 8 and "dropped_duplicate" not in m["splits"]["valid"]
    tok = Tokenizer.load(str(out / "spm.model"))
    kept = list(range(len(SENTS_EN))) + [82]  # first copies of each pair, and ("sentence 5", "anders")
    want_src = tok.encode([en[i] for i in kept])
    want_tgt = tok.encode([de[i] for i in kept])
    got = TokenData(out, "train")
    assert len(got) == len(kept)
    assert [got.src(i).tolist() for i in range(len(got))] == want_src
    assert [got.tgt(i).tolist() for i in range(len(got))] == want_tgt
    assert got.src_tok.dtype == np.int32 and got.src_off[-1] == sum(map(len, want_src)) == t["src_tokens"]
    assert (out / "valid.en.txt").read_text().splitlines() == SENTS_EN[:6] + SENTS_EN[:2]
    off = prepare({"train": (d / "train.en.gz", d / "train.de"), "valid": (d / "valid.en", d / "valid.de")},
                  tmp_path / "prep2", "en", "de", vocab_size=120, max_len=40, dedup=False, max_ratio=0)
    assert off["splits"]["train"]["pairs"] == 85 - 1 and "dropped_ratio" not in off["splits"]["train"]


@pytest.mark.parametrize("n_en,n_de", [(5, 3), (3, 5)])
def test_misaligned_corpus_counts_both_files_and_leaves_nothing(tmp_path, n_en, n_de):
    a = write(tmp_path / "t.en", SENTS_EN[:n_en])
    b = write(tmp_path / "t.de", SENTS_DE[:n_de])
    v = write(tmp_path / "v.en", SENTS_EN[:2]), write(tmp_path / "v.de", SENTS_DE[:2])
    with pytest.raises(DataError, match=rf"t\.en has {n_en} lines but .*t\.de has {n_de}"):
        prepare({"train": (a, b), "valid": v}, tmp_path / "out" / "prep", "en", "de", vocab_size=60)
    assert not (tmp_path / "out" / "prep").exists() and list((tmp_path / "out").iterdir()) == []


def test_invalid_utf8_deep_in_a_gzip_file_names_its_line(tmp_path):
    p = tmp_path / "big.de.gz"
    with gzip.open(p, "wb") as f:
        f.write(b"".join(b"zeile %d\n" % i for i in range(5000)) + b"kaputt \xc3\x28\n")
    with pytest.raises(DataError, match=r"big\.de\.gz:5001: invalid UTF-8"):
        read_lines(p)


def test_prepared_text_is_split_at_newlines_only_and_counted(toy_corpus, tmp_path):
    """A validation sentence holding U+2028 (a line separator to str.splitlines) stays one sentence:
    read with splitlines, 20 sources read back as 21 and BLEU against the references fell to 21.7."""
    from aiayn.data.prepare import read_text

    for path in toy_corpus.iterdir():
        text = path.read_text()
        if path.name.startswith("valid"):
            first, rest = text.split("\n", 1)
            text = first.replace(" ", "\u2028", 1) + "\x85\x0c\n" + rest
        (tmp_path / path.name).write_text(text)
    out = tmp_path / "prep"
    prepare({n: (tmp_path / f"{n}.en", tmp_path / f"{n}.de") for n in ("train", "valid")}, out, "en", "de",
            vocab_size=60, max_len=32)
    src, ref = read_text(out, "valid", "src"), read_text(out, "valid", "tgt")
    assert len(src) == len(ref) == 20 and "\u2028" in src[0] and "\u2028" in ref[0]
    (out / "valid.de.txt").write_text((out / "valid.de.txt").read_text() + "one more\n")
    with pytest.raises(DataError, match="21 lines, but the manifest counts 20"):
        read_text(out, "valid", "tgt")


def test_no_text_is_read_with_splitlines():
    """str.splitlines splits at U+2028, U+0085 and form feeds: text aiayn writes one line per "\\n" is
    read with data.read_lines; only files of the system (/proc) and JSON lines (ensure_ascii) may use it."""
    import pathlib
    import re

    allowed = {"device.py", "files.py", "run_folder.py", "plot.py", "rows.py"}  # /proc files; metrics.jsonl rows
    root = pathlib.Path(__file__).resolve().parents[2] / "aiayn"
    for path in root.rglob("*.py"):
        for n, line in enumerate(path.read_text().split("\n"), 1):
            if re.search(r"\.splitlines\(", line) and path.name not in allowed:
                raise AssertionError(f"{path}:{n}: {line.strip()}")


def test_a_dotted_test_set_keeps_its_whole_name(tmp_path):
    """`--test valid.final` was named after its first dotted part, "valid": it silently replaced the
    validation split. Now it is the split "valid.final", beside an untouched "valid"."""
    d = corpus(tmp_path)
    write(d / "valid.final.en", SENTS_EN[:4])
    write(d / "valid.final.de", SENTS_DE[:4])
    out = tmp_path / "prep"
    assert main(["prepare", "--data-dir", str(d), "--src", "en", "--tgt", "de", "--out", str(out),
                 "--data.vocab_size", "120", "--test", "valid.final"]) == 0
    splits = json.loads((out / "manifest.json").read_text())["splits"]
    assert splits["valid"]["pairs"] == 10 and splits["valid.final"]["pairs"] == 4
    from aiayn.data.prepare import read_text

    assert len(read_text(out, "valid.final", "src")) == 4


def test_an_enormous_line_is_dropped_before_it_is_encoded(toy_corpus, tmp_path, monkeypatch):
    """A 100 MB line took 5 GB to encode before it was dropped as too long; a line longer than
    1,024 characters per allowed subword is now dropped (and counted) unencoded."""
    import sentencepiece as spm

    longest, real = [0], spm.SentencePieceProcessor.encode

    def spy(self, text, *a, **k):
        longest[0] = max([longest[0], *(len(x) for x in (text if isinstance(text, list) else [text]))])
        return real(self, text, *a, **k)

    for path in toy_corpus.iterdir():
        text = path.read_text()
        if path.name == "train.en":
            text = "a dog " * 40_000 + "\n" + text.split("\n", 1)[1]  # 240,000 characters for max_len 32
        (tmp_path / path.name).write_text(text)
    monkeypatch.setattr(spm.SentencePieceProcessor, "encode", spy)
    stats = prepare({n: (tmp_path / f"{n}.en", tmp_path / f"{n}.de") for n in ("train", "valid")},
                    tmp_path / "prep", "en", "de", vocab_size=60, max_len=32)["splits"]["train"]
    assert longest[0] < 1024 * 32 and stats["dropped_too_long"] >= 1


def test_a_vocabulary_file_is_read_bounded(tmp_path):
    """spm.model is read as untrusted: a FIFO (a read would wait forever) and a file past the bound are
    refused without being read, and a split vocabulary nested past the recursion limit is one error."""
    import os

    from aiayn.data import tokenizer as tk
    from aiayn.files import FileError

    os.mkfifo(tmp_path / "fifo.model")
    with pytest.raises(FileError, match="not a regular file"):
        tk.load_tokenizer(str(tmp_path / "fifo.model"))
    with open(tmp_path / "huge.model", "wb") as f:
        f.truncate(tk.MAX_VOCABULARY_BYTES + 1)
    with pytest.raises(FileError, match="more than such a file holds"):
        tk.Tokenizer.load(str(tmp_path / "huge.model"))
    nested = b'{"format": "' + tk.SPLIT_FORMAT.encode() + b'", "pieces": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(tk.TokenizerError, match="damaged split vocabulary"):
        tk.read_tokenizer(nested)


def test_the_vocabulary_is_sized_to_the_data_by_its_stated_rule():
    """One subword per 100 running words, in thousands, within 1,000-37,000: Multi30k's ~0.73M
    words give 7,000 (its preset's 8,000 is the same order), 3,000 pairs 1,000, WMT14 the paper's 37,000."""
    from aiayn.data.prepare import vocabulary_size_for

    assert vocabulary_size_for(730_000) == 7000
    assert vocabulary_size_for(72_000) == 1000 and vocabulary_size_for(0) == 1000
    assert vocabulary_size_for(250_000_000) == 37000
    assert vocabulary_size_for(1_260_000) == 13000


def test_prepare_without_a_size_sizes_the_vocabulary_and_takes_multi30ks_val(toy_corpus, tmp_path, caplog):
    """No preset and no --data.vocab_size: the size comes from the training text and the log says how;
    the validation split found under Multi30k's own name, `val`."""
    import logging
    import shutil

    data = tmp_path / "m30k"
    data.mkdir()
    for lang in ("en", "de"):
        shutil.copy(toy_corpus / f"train.{lang}", data / f"train.{lang}")
        shutil.copy(toy_corpus / f"valid.{lang}", data / f"val.{lang}")
    with caplog.at_level(logging.INFO, logger="aiayn"):
        assert main(["prepare", "--data-dir", str(data), "--src", "en", "--tgt", "de", "-o", str(tmp_path / "p")]) == 0
    words = sum(len(x.split()) for lang in ("en", "de") for x in (data / f"train.{lang}").read_text().splitlines())
    assert f"vocabulary size 1000, sized to the data: {words:,} running words" in caplog.text
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["inputs"]["valid"]["src"].endswith("val.en") and manifest["settings"]["vocab_size"] == 0
