"""WMT14 EN-DE (§5.1) from archives with the official layout, built here: extraction, SGML, checks."""

import hashlib
import io
import logging
import re
import tarfile
from pathlib import Path

import pytest
from sacrebleu.dataset.fake_sgml import FakeSGMLDataset

from aiayn.cli import main
from aiayn.data import corpora
from aiayn.data.corpora import DataError, fetch_wmt14

EP = (["Wiederaufnahme der Sitzungsperiode", "", "Ich bitte Sie, sich zu einer Schweigeminute zu erheben."],
      ["Resumption of the session", "Please rise, then.", "Please rise, then, for this minute's silence."])
CC = (["Ein Haus am See.", "Zwei Hunde spielen."], ["A house by the lake.", "Two dogs play."])
NC = (["Die Wirtschaft wächst.", "Gold steigt."], ["The economy grows.", "Gold rises."])


def sgml(lines: list[str], lang: str) -> str:
    segs = "".join(f'<seg id="{i}">  {x}  </seg>\n' for i, x in enumerate(lines, 1))
    return f'<srcset setid="x" srclang="any">\n<doc sysid="ref" docid="d1" genre="news" origlang="{lang}">\n' \
           f"<p>\n{segs}</p>\n</doc>\n</srcset>\n"


def tgz(path: Path, members: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def lines(xs: list[str], end: bool = True) -> str:
    return "\n".join(xs) + ("\n" if end else "")


@pytest.fixture
def archives(tmp_path) -> Path:
    d = tmp_path / "archives"
    d.mkdir()
    tgz(d / "training-parallel-europarl-v7.tgz", {
        "training/europarl-v7.de-en.de": lines(EP[0], end=False),  # no final newline: the next corpus must not join
        "training/europarl-v7.de-en.en": lines(EP[1], end=False),
        "training/europarl-v7.fr-en.fr": "pas ici\n"})
    tgz(d / "training-parallel-commoncrawl.tgz", {"commoncrawl.de-en.de": lines(CC[0]),
                                                   "commoncrawl.de-en.en": lines(CC[1])})
    tgz(d / "training-parallel-nc-v9.tgz", {"training/news-commentary-v9.de-en.de": lines(NC[0]),
                                             "training/news-commentary-v9.de-en.en": lines(NC[1])})
    dev = ["Die Katze schläft &amp; träumt.", "Es   regnet."], ["The cat sleeps &amp; dreams.", "It   rains."]
    tgz(d / "test.tgz", {"test/newstest2013-src.de.sgm": sgml(dev[0], "de"),
                         "test/newstest2013-src.en.sgm": sgml(dev[1], "en")})
    test = {("src", "en"): ["source side, English"], ("ref", "de"): ["Referenz, Deutsch"],
            ("src", "de"): ["Quelle, Deutsch"], ("ref", "en"): ["reference, English"]}
    tgz(d / "test-full.tgz", {f"test-full/newstest2014-deen-{r}.{lang}.sgm": sgml(x, lang)
                              for (r, lang), x in test.items()})
    return d


def test_prepare_wmt14_from_local_archives(archives, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "prep"
    with caplog.at_level(logging.WARNING, logger="aiayn"):
        assert main(["prepare", "--corpus", "wmt14-en-de", "--data-dir", str(archives), "--src", "en", "--tgt", "de",
                     "-o", str(out), "--data.vocab_size", "80", "--trust-local"]) == 0
    assert caplog.text.count("not the official archive, used as given") == 5  # these small ones, and said so
    text = tmp_path / "cache" / "wmt14-en-de"
    assert (text / "train.de").read_text().splitlines() == EP[0] + CC[0] + NC[0]
    assert (text / "train.en").read_text().splitlines() == EP[1] + CC[1] + NC[1]
    # the test sets as sacreBLEU itself reads the SGML (a second implementation)
    for split, member in (("newstest2013", "test/newstest2013-src.de.sgm"),
                          ("newstest2014", "test-full/newstest2014-deen-ref.de.sgm")):
        with tarfile.open(archives / ("test.tgz" if split == "newstest2013" else "test-full.tgz")) as tar:
            tar.extract(member, tmp_path / "x", filter="data")
        sacrebleu_reader = FakeSGMLDataset.__new__(FakeSGMLDataset)
        sacrebleu_reader._convert_format(str(tmp_path / "x" / member), str(tmp_path / "x" / "plain"))
        assert (text / f"{split}.de").read_text() == (tmp_path / "x" / "plain").read_text()
    assert (out / "newstest2014.en.txt").read_text() == "source side, English\n"
    assert (out / "newstest2014.de.txt").read_text() == "Referenz, Deutsch\n"
    assert (out / "valid.de.txt").read_text().splitlines()[1] == "Es regnet."
    import json

    m = json.loads((out / "manifest.json").read_text())
    assert m["splits"]["train"]["pairs_in"] == 7 and m["splits"]["train"]["dropped_empty"] == 1
    assert m["tests"] == ["newstest2014"]
    stamp = (text / "train.de").stat().st_mtime_ns  # a second prepare extracts nothing
    fetch_wmt14("en", "de", tmp_path / "cache", archives, trust_local=True)
    assert (text / "train.de").stat().st_mtime_ns == stamp


def test_german_to_english_takes_the_other_sides_of_newstest2014(archives, tmp_path):
    text = fetch_wmt14("de", "en", tmp_path / "cache", archives, trust_local=True)
    assert (text / "newstest2014.de").read_text() == "Quelle, Deutsch\n"
    assert (text / "newstest2014.en").read_text() == "reference, English\n"


def test_download_is_verified_and_a_bad_file_is_not_kept(archives, tmp_path, monkeypatch):
    table = {}
    for name, (url, _, _) in corpora.WMT14_ARCHIVES.items():
        data = (archives / name).read_bytes()
        table[name] = (url, len(data), "sha256:" + hashlib.sha256(data).hexdigest())
    monkeypatch.setattr(corpora, "WMT14_ARCHIVES", table)
    text = fetch_wmt14("en", "de", tmp_path / "cache", mirror=archives.as_uri())
    assert (text / "train.en").read_text().splitlines() == EP[1] + CC[1] + NC[1]
    assert sorted(p.name for p in (text / "archives").iterdir() if p.name[0] != ".") == sorted(table)
    # a corrupted archive on the mirror: refused, named, and not left in the cache
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in table:
        (bad / name).write_bytes((archives / name).read_bytes())
    (bad / "test.tgz").write_bytes(b"\0" * table["test.tgz"][1])
    with pytest.raises(DataError, match=r"test\.tgz: sha256 .* the official archive's is"):
        fetch_wmt14("en", "de", tmp_path / "cache2", mirror=bad.as_uri())
    assert not (tmp_path / "cache2/wmt14-en-de/archives/test.tgz").exists()
    assert not list((tmp_path / "cache2/wmt14-en-de/archives").glob("*.part"))


def test_local_copies_are_checked_and_a_different_one_is_named(archives, tmp_path, monkeypatch, caplog):
    table = {name: (url, (archives / name).stat().st_size,
                    "sha256:" + hashlib.sha256((archives / name).read_bytes()).hexdigest())
             for name, (url, _, _) in corpora.WMT14_ARCHIVES.items()}
    name = "training-parallel-nc-v9.tgz"
    table[name] = (table[name][0], table[name][1], "sha256:" + "0" * 64)
    monkeypatch.setattr(corpora, "WMT14_ARCHIVES", table)
    with pytest.raises(DataError, match=r"nc-v9\.tgz: sha256 .*--trust-local"):
        fetch_wmt14("en", "de", tmp_path / "cache", archives)
    with caplog.at_level(logging.WARNING, logger="aiayn"):
        fetch_wmt14("en", "de", tmp_path / "cache", archives, trust_local=True)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and re.search(r"nc-v9\.tgz: sha256 [0-9a-f]{64}, the official archive's is 0{64}",
                                          warned[0])


def test_missing_archive_member_or_language_gets_a_clear_error(archives, tmp_path, capsys):
    (archives / "test.tgz").unlink()
    assert main(["prepare", "--corpus", "wmt14-en-de", "--data-dir", str(archives), "--src", "en", "--tgt", "de",
                 "-o", str(tmp_path / "p"), "--trust-local"]) == 2
    assert "test.tgz: missing" in capsys.readouterr().err
    tgz(archives / "test.tgz", {"test/newstest2013-src.de.sgm": sgml(["x"], "de")})
    with pytest.raises(DataError, match=r"test\.tgz: has no test/newstest2013-src\.en\.sgm"):
        fetch_wmt14("en", "de", tmp_path / "cache", archives, trust_local=True)
    with pytest.raises(DataError, match="must be en and de"):
        fetch_wmt14("en", "fr", tmp_path / "cache", archives)


@pytest.mark.slow
def test_wmt14_script_refuses_a_cpu_and_runs_end_to_end_when_allowed(archives, tmp_path):
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "AIAYN_ALLOW_CPU"}
    env.update(AIAYN_CACHE=str(tmp_path / "cache"), AIAYN_WMT14=str(archives), AIAYN_TRUST_LOCAL="1",
               DATA=str(tmp_path / "data"), RUN=str(tmp_path / "run"), PATH=f"{tmp_path}:{env['PATH']}")
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")  # whatever this machine has: no GPU
    (tmp_path / "nvidia-smi").chmod(0o755)
    res = subprocess.run(["bash", str(root / "scripts/wmt14.sh")], env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "no CUDA GPU found" in res.stderr and not (tmp_path / "data").exists()
    tiny = ["--model.d_model", "32", "--model.d_ff", "64", "--model.h", "4", "--model.N", "1", "--train.max_steps",
            "2", "--train.tokens_per_update", "0", "--data.max_tokens", "400", "--train.valid_bleu_sentences", "0",
            "--train.threads", "1", "--train.save_every", "1"]
    res = subprocess.run(["bash", str(root / "scripts/wmt14.sh"), *tiny], env={**env, "AIAYN_ALLOW_CPU": "1"},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout.splitlines()
    assert out[-3].startswith("BLEU = ") and out[-1].startswith("paper BLEU (tokenized")
    assert len((tmp_path / "run/newstest2014.de.hyp").read_text().splitlines()) == 1
    assert "averaged 2 checkpoints" in res.stdout


def test_an_archive_whose_check_was_cut_short_is_checked_again(archives, tmp_path, monkeypatch):
    table = {name: (url, (archives / name).stat().st_size,
                    "sha256:" + hashlib.sha256((archives / name).read_bytes()).hexdigest())
             for name, (url, _, _) in corpora.WMT14_ARCHIVES.items()}
    monkeypatch.setattr(corpora, "WMT14_ARCHIVES", table)
    fetch_wmt14("en", "de", tmp_path / "cache", mirror=archives.as_uri())
    cached = tmp_path / "cache/wmt14-en-de/archives/test.tgz"
    (cached.parent / ".test.tgz.verified").unlink()  # as if killed between the download and its check
    cached.write_bytes(b"\0" * cached.stat().st_size)
    with pytest.raises(DataError, match=r"test\.tgz: sha256"):
        fetch_wmt14("en", "de", tmp_path / "cache", mirror=archives.as_uri())
    assert not cached.exists()  # not kept: the next run downloads it again
    fetch_wmt14("en", "de", tmp_path / "cache", mirror=archives.as_uri())
    assert cached.read_bytes() == (archives / "test.tgz").read_bytes()


def test_an_interrupted_download_is_an_error_and_leaves_no_file(tmp_path, monkeypatch):
    class Short(io.BytesIO):  # a server that promised 100 bytes and dropped the connection after 10
        headers = {"Content-Length": "100"}

        def __enter__(self):
            return self

    monkeypatch.setattr(corpora.urllib.request, "urlopen", lambda url, timeout: Short(b"x" * 10))
    with pytest.raises(DataError, match="interrupted"):
        corpora._download("https://example.invalid/a.tgz", tmp_path / "a.tgz", "")
    assert list(tmp_path.iterdir()) == []

    def dropped(url, timeout):
        raise corpora.http.client.IncompleteRead(b"partial", 90)

    monkeypatch.setattr(corpora.urllib.request, "urlopen", dropped)
    with pytest.raises(DataError, match="cannot download"):
        corpora._download("https://example.invalid/a.tgz", tmp_path / "a.tgz", "")
    with pytest.raises(DataError, match="not a URL"):
        corpora.check_mirror("notaurl")


def test_sgml_that_is_not_utf8_is_named_and_leaves_no_pieces(archives, tmp_path):
    with tarfile.open(archives / "test-full.tgz", "w:gz") as tar:  # Latin-1 bytes, not UTF-8
        for r, lang in (("src", "en"), ("ref", "de"), ("src", "de"), ("ref", "en")):
            data = "<seg id=1>caf\xe9</seg>\n".encode("latin-1")
            info = tarfile.TarInfo(f"test-full/newstest2014-deen-{r}.{lang}.sgm")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=r"test-full\.tgz: test-full/newstest2014-deen-src\.en\.sgm: line 1: invalid"):
        fetch_wmt14("en", "de", tmp_path / "cache", archives, trust_local=True)
    out = tmp_path / "cache/wmt14-en-de"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no .train.0.en and the like


def test_a_local_multi30k_copy_is_checked(multi30k_dir, tmp_path, caplog):
    import shutil

    local = tmp_path / "m30k"
    shutil.copytree(multi30k_dir, local)
    corpora.verify_multi30k(local, "en", "de")  # the published text
    (local / "val.de.gz").chmod(0o644)
    import gzip

    (local / "val.de.gz").write_bytes(gzip.compress(b"ein anderer Satz\n"))
    with pytest.raises(DataError, match=r"val\.de\.gz: text sha256 .*--trust-local"):
        corpora.verify_multi30k(local, "en", "de")
    corpora.verify_multi30k(local, "en", "fr")  # the changed file is not among these languages
    with caplog.at_level(logging.WARNING, logger="aiayn"):
        corpora.verify_multi30k(local, "en", "de", trust_local=True)
    assert "val.de.gz" in caplog.text


def test_a_damaged_multi30k_cache_file_is_checked_and_fetched_again(multi30k_dir, tmp_path, monkeypatch):
    """A cached file was trusted once present: a damaged one was used for ever. Each use checks it."""
    import shutil

    fetched = []

    def download(url, dest, _hint):
        name = url.rsplit("/", 1)[1]
        fetched.append(name)
        shutil.copyfile(multi30k_dir / name, dest)

    monkeypatch.setattr(corpora, "_download", download)
    out = corpora.fetch_multi30k("en", "de", tmp_path)
    first = len(fetched)
    assert first == 8  # train, val, 2 tests x 2 languages
    corpora.fetch_multi30k("en", "de", tmp_path)
    assert len(fetched) == first  # whole files are not fetched again
    (out / "val.de.gz").write_bytes((out / "val.de.gz").read_bytes()[:-40])  # truncated on disk
    corpora.fetch_multi30k("en", "de", tmp_path)
    assert fetched[first:] == ["val.de.gz"]
    assert corpora.text_sha256(out / "val.de.gz") == corpora.MULTI30K_SHA256["val.de"]
