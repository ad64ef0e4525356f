"""Public corpora for `aiayn prepare --corpus NAME`: download (or take a local copy), verify, extract.

Both end as a folder of aligned ``{split}.{lang}`` text files that `data.prepare` reads:

- ``multi30k``: the Multi30k task-1 files (gzipped text), as published.
- ``wmt14-en-de``: the paper's data (§5.1): Europarl v7, Common Crawl and News Commentary v9 for
  training (about 4.5M pairs), newstest2013 for validation and newstest2014 for test, from the
  official WMT archives. Archives are checked against their published size and checksum
  (SHA-256 from TensorFlow Datasets' records for the training sets, MD5 from sacreBLEU's for the
  test sets), test sets are read from their SGML the way sacreBLEU reads them, and the
  extracted text is cached, so a second prepare downloads and extracts nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
import urllib.request
from pathlib import Path

from tqdm import tqdm

from .data import DataError

log = logging.getLogger("aiayn")

MULTI30K = {
    "url": "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{split}.{lang}.gz",
    "env": "AIAYN_MULTI30K",
    "train": "train", "valid": "val", "test": ["test_2016_flickr", "test_2017_flickr"],
}

# file name -> official URL, size in bytes and checksum ("sha256:..." or "md5:...")
WMT14_ARCHIVES = {
    "training-parallel-europarl-v7.tgz": (
        "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz", 657632379,
        "sha256:0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"),
    "training-parallel-commoncrawl.tgz": (
        "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", 918311367,
        "sha256:c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"),
    "training-parallel-nc-v9.tgz": (
        "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", 80418416,
        "sha256:cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485"),
    "test.tgz": ("https://statmt.org/wmt13/test.tgz", None, "md5:48eca5d02f637af44e85186847141f67"),
    "test-full.tgz": ("https://statmt.org/wmt14/test-full.tgz", None, "md5:a8cd784e006feb32ac6f3d9ec7eb389a"),
}
# split -> [(archive, member with {lang} (and {role}: src for the source language, ref for the target))]
WMT14_MEMBERS = {
    "train": [("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en.{lang}"),
              ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en.{lang}"),
              ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en.{lang}")],
    "newstest2013": [("test.tgz", "test/newstest2013-src.{lang}.sgm")],
    "newstest2014": [("test-full.tgz", "test-full/newstest2014-deen-{role}.{lang}.sgm")],
}
WMT14 = {"env": "AIAYN_WMT14", "train": "train", "valid": "newstest2013", "test": ["newstest2014"]}
CORPORA = {"multi30k": MULTI30K, "wmt14-en-de": WMT14}


def cache_dir() -> Path:
    return Path(os.environ.get("AIAYN_CACHE", Path.home() / ".cache" / "aiayn"))


def _download(url: str, dest: Path, what: str) -> None:
    """url -> dest through dest.part (removed on failure), with a progress bar."""
    log.info("downloading %s", url)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f, \
                tqdm(total=int(r.headers.get("Content-Length") or 0) or None, unit="B", unit_scale=True,
                     desc=dest.name, disable=None, leave=False) as bar:
            for block in iter(lambda: r.read(1 << 20), b""):
                f.write(block)
                bar.update(len(block))
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"cannot download {url}: {e}. {what}") from None
    os.replace(tmp, dest)


def fetch_multi30k(src: str, tgt: str, root: Path) -> Path:
    """Download Multi30k's raw files into root/multi30k (once) and return that folder."""
    out = root / "multi30k"
    out.mkdir(parents=True, exist_ok=True)
    for split in [MULTI30K["train"], MULTI30K["valid"], *MULTI30K["test"]]:
        for lang in (src, tgt):
            dest = out / f"{split}.{lang}.gz"
            if dest.exists():
                continue
            try:
                _download(MULTI30K["url"].format(split=split, lang=lang), dest,
                          f"Pass --data-dir with a local copy (or set {MULTI30K['env']})")
            except DataError as e:
                if split in MULTI30K["test"]:
                    log.warning("no %s for %s (%s); skipping that test set", split, lang, e)
                    continue
                raise
    return out


def checksum(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, size: int | None, expected: str) -> None:
    """The published size and checksum, or a DataError that names the file and both values."""
    if size is not None and path.stat().st_size != size:
        raise DataError(f"{path}: {path.stat().st_size} bytes, the official archive has {size}; "
                        "a truncated or different file (delete it to download again)")
    algorithm, want = expected.split(":")
    got = checksum(path, algorithm)
    if got != want:
        raise DataError(f"{path}: {algorithm} {got}, the official archive's is {want}; "
                        "a damaged or different file (delete it to download again)")


def wmt14_archives(local: Path | None, root: Path, mirror: str | None = None) -> dict[str, Path]:
    """Every WMT14 archive: from `local` when given (checked, and a file that is not the official
    one is used with a warning), otherwise downloaded into root (refused unless official)."""
    paths = {}
    for name, (url, size, expected) in WMT14_ARCHIVES.items():
        if local is not None:
            path = Path(local) / name
            if not path.is_file():
                raise DataError(f"{path}: missing; --data-dir for wmt14-en-de must hold "
                                f"{', '.join(WMT14_ARCHIVES)} (as downloaded from statmt.org)")
            try:
                verify(path, size, expected)
            except DataError as e:  # the user's own file: said, and used
                log.warning("not the official archive, used as given: %s", str(e).split("; ")[0])
        else:
            path = root / name
            if not path.exists():
                root.mkdir(parents=True, exist_ok=True)
                _download(f"{mirror.rstrip('/')}/{name}" if mirror else url, path,
                          "Pass --data-dir with a folder of the archives (or set AIAYN_WMT14)")
                try:
                    verify(path, size, expected)
                except DataError:
                    path.unlink()
                    raise
        paths[name] = path
    return paths


_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")


def sgml_segments(lines) -> list[str]:
    """The text of WMT's SGML `<seg>` lines, as sacreBLEU reads it (spaces collapsed, no unescaping)."""
    return [re.sub(r"\s+", " ", _SEG.sub(r"\1", line).strip()) for line in lines if line.startswith("<seg ")]


def _extract(archive: Path, members: dict[str, Path]) -> None:
    """Copy the wanted members (member name -> destination) out of a .tgz in one streaming pass;
    SGML members become one segment per line."""
    found = set()
    try:
        with tarfile.open(archive, "r|gz") as tar:
            for info in tar:
                dest = members.get(info.name.removeprefix("./"))
                if dest is None or not info.isfile():
                    continue
                f = tar.extractfile(info)
                if info.name.endswith(".sgm"):
                    text = f.read().decode("utf-8").splitlines()
                    dest.write_text("".join(x + "\n" for x in sgml_segments(text)), encoding="utf-8")
                else:
                    with open(dest, "wb") as out:
                        shutil.copyfileobj(f, out, 1 << 22)
                found.add(info.name.removeprefix("./"))
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"{archive}: not a readable .tgz archive: {e}") from None
    missing = sorted(set(members) - found)
    if missing:
        raise DataError(f"{archive}: has no {', '.join(missing)}")


def fetch_wmt14(src: str, tgt: str, root: Path, local: Path | None = None, mirror: str | None = None) -> Path:
    """WMT14 EN-DE as text files: root/wmt14-en-de/{train,newstest2013,newstest2014}.{en,de}.
    Extracts once; a later call with the same archives returns at once."""
    if {src, tgt} != {"en", "de"}:
        raise DataError(f"wmt14-en-de has English and German: --src and --tgt must be en and de, got {src}, {tgt}")
    out = root / "wmt14-en-de"
    archives = wmt14_archives(local, out / "archives", mirror)
    stamp = {name: [str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for name, p in archives.items()}
    done = out / "extracted.json"
    if done.exists() and json.loads(done.read_text()) == stamp:
        return out
    done.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, dict[str, Path]] = {}  # archive -> member -> piece: one pass over each archive
    pieces: dict[str, list[Path]] = {}  # split.lang -> its pieces, in order
    for split, parts in WMT14_MEMBERS.items():
        for lang in ("en", "de"):
            for i, (archive, member) in enumerate(parts):
                piece = out / f".{split}.{i}.{lang}"
                wanted.setdefault(archive, {})[member.format(lang=lang, role="src" if lang == src else "ref")] = piece
                pieces.setdefault(f"{split}.{lang}", []).append(piece)
    for archive, members in wanted.items():
        log.info("extracting %s", archives[archive].name)
        _extract(archives[archive], members)
    for name, parts in pieces.items():
        with open(out / name, "wb") as f:
            for piece in parts:
                with open(piece, "rb") as p:
                    shutil.copyfileobj(p, f, 1 << 22)
                    if p.tell() and (p.seek(-1, os.SEEK_END), p.read(1))[1] != b"\n":
                        f.write(b"\n")  # the next corpus starts on a line of its own
                piece.unlink()
    done.write_text(json.dumps(stamp))
    return out
