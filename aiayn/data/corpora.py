"""Public corpora for `aiayn prepare --corpus NAME`: download (or take a local copy), verify, extract.

Both end as a folder of aligned ``{split}.{lang}`` text files that `data.prepare` reads:

- ``multi30k``: the Multi30k task-1 files (gzipped text), as published, checked against the
  SHA-256 of their uncompressed text (a copy of the dataset repository's ``data/task1/raw``).
- ``wmt14-en-de``: the paper's data (§5.1): Europarl v7, Common Crawl and News Commentary v9 for
  training (about 4.5M pairs), newstest2013 for validation and newstest2014 for test, from the
  official WMT archives. Archives are checked against their published size and checksum
  (SHA-256 from TensorFlow Datasets' records for the training sets, MD5 from sacreBLEU's for the
  test sets), test sets are read from their SGML the way sacreBLEU reads them, and the
  extracted text is cached, so a second prepare downloads and extracts nothing.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shutil
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

from tqdm import tqdm

from ..files import FileError, digest, read_json
from .text import DataError

log = logging.getLogger("aiayn")

MULTI30K = {
    "url": "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{split}.{lang}.gz",
    "env": "AIAYN_MULTI30K",
    "train": "train", "valid": "val", "test": ["test_2016_flickr", "test_2017_flickr"],
}

# file -> SHA-256 of its uncompressed text (gzip headers differ between copies, the text does not)
MULTI30K_SHA256 = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "train.cs": "2be68b38c8d586ff4f54eb13cc6e1baaaa053695b3f070d3038303a47f2268da",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "val.cs": "d53827e469b0a1ca8d57e9e26b2b64c4bc4b33f5479c7b03ae87ae5c882c3e33",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2016_flickr.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
    "test_2016_flickr.cs": "45adb85f688de8407fddcbe1b36dca15d12aab868149b337e2576f2d6d2ff8d8",
    "test_2017_flickr.en": "ce1450ddc5ab0834502579d77a170849952e15a2938b34cc503bdc25ebb4fb98",
    "test_2017_flickr.de": "c3078bc3b36808bf9d20eb2347ed6137016179ef59ec0d2b9b8ecc3fb2880081",
    "test_2017_flickr.fr": "6f3764e31dac41e9455e612958bcfd4e877c5e15cd66df2c2b2be6d9bd83e5b6",
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


def check_mirror(mirror: str | None) -> None:
    """`--mirror` is a URL prefix (http, https, ftp or file), said before anything is fetched."""
    if mirror is not None and urllib.parse.urlparse(mirror).scheme not in ("http", "https", "ftp", "file"):
        raise DataError(f"--mirror {mirror!r}: not a URL (expected a prefix such as https://host/path/)")


def _download(url: str, dest: Path, what: str) -> None:
    """url -> dest through dest.part (removed on failure), with a progress bar; a body shorter
    than its Content-Length (a dropped connection) is an error, not a file."""
    log.info("downloading %s", url)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
            length = int(r.headers.get("Content-Length") or 0) or None
            with tqdm(total=length, unit="B", unit_scale=True, desc=dest.name, disable=None, leave=False) as bar:
                for block in iter(lambda: r.read(1 << 20), b""):
                    f.write(block)
                    bar.update(len(block))
            if length is not None and f.tell() != length:
                raise http.client.IncompleteRead(b"", length - f.tell())
    except (OSError, ValueError, http.client.HTTPException) as e:
        tmp.unlink(missing_ok=True)
        why = f"interrupted ({e!r})" if isinstance(e, http.client.IncompleteRead) else str(e) or type(e).__name__
        raise DataError(f"cannot download {url}: {why}. {what}") from None
    os.replace(tmp, dest)


def text_sha256(path: Path) -> str:
    """SHA-256 of a file's text, uncompressed if it is gzipped (Multi30k's published checksums)."""
    try:
        return digest(path, gunzip=path.suffix == ".gz")
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: not readable ({e})") from None


def verify_multi30k(folder: Path, src: str, tgt: str, trust_local: bool = False) -> None:
    """Every Multi30k file of the two languages in `folder` against its published text: a
    different file is refused (with `trust_local`, used and named in a warning)."""
    for name, want in MULTI30K_SHA256.items():
        if name.rsplit(".", 1)[1] not in (src, tgt):
            continue
        path = next((p for p in (folder / f"{name}.gz", folder / name) if p.is_file()), None)
        if path is None:
            continue  # a missing split is reported by prepare, by name
        got = text_sha256(path)
        if got != want:
            msg = f"{path}: text sha256 {got}, Multi30k's is {want}; a damaged or different file"
            if not trust_local:
                raise DataError(f"{msg} (--trust-local uses it anyway)")
            log.warning("not the published Multi30k file, used as given (--trust-local): %s", msg)


def fetch_multi30k(src: str, tgt: str, root: Path) -> Path:
    """Download Multi30k's raw files into root/multi30k (once) and return that folder. Every file is
    checked against its published text each time, cached or not: a cached file that no longer
    matches (damaged on disk, edited) is downloaded again."""
    out = root / "multi30k"
    out.mkdir(parents=True, exist_ok=True)
    for split in [MULTI30K["train"], MULTI30K["valid"], *MULTI30K["test"]]:
        for lang in (src, tgt):
            dest = out / f"{split}.{lang}.gz"
            if dest.exists():
                if _cached_ok(dest, MULTI30K_SHA256.get(f"{split}.{lang}")):
                    continue
                log.warning("%s: the cached file is not Multi30k's published text; downloading it again", dest)
                dest.unlink()  # aiayn's own cache, written by the download below
            try:
                _download(MULTI30K["url"].format(split=split, lang=lang), dest,
                          f"Pass --data-dir with a local copy (or set {MULTI30K['env']})")
                want = MULTI30K_SHA256.get(f"{split}.{lang}")
                if want and text_sha256(dest) != want:
                    dest.unlink()
                    raise DataError(f"{MULTI30K['url'].format(split=split, lang=lang)}: the downloaded text is not "
                                    "Multi30k's published one (sha256 differs); not kept")
            except DataError as e:
                if split in MULTI30K["test"]:
                    log.warning("no %s for %s (%s); skipping that test set", split, lang, e)
                    continue
                raise
    return out


def _cached_ok(path: Path, want: str | None) -> bool:
    try:
        return want is None or text_sha256(path) == want
    except DataError:  # a truncated gzip
        return False


def verify(path: Path, size: int | None, expected: str) -> None:
    """The published size and checksum, or a DataError that names the file and both values."""
    if size is not None and path.stat().st_size != size:
        raise DataError(f"{path}: {path.stat().st_size} bytes, the official archive has {size}; "
                        "a truncated or different file (delete it to download again)")
    algorithm, want = expected.split(":")
    got = digest(path, algorithm)
    if got != want:
        raise DataError(f"{path}: {algorithm} {got}, the official archive's is {want}; "
                        "a damaged or different file (delete it to download again)")


def _verified(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified")


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def wmt14_archives(local: Path | None, root: Path, mirror: str | None = None,
                   trust_local: bool = False) -> dict[str, Path]:
    """Every WMT14 archive: from `local` when given (checked; a file that is not the official one
    is refused, or with `trust_local` used with a warning), otherwise downloaded into root
    (refused unless official). A downloaded archive is checked until a stamp says it passed, so a
    check cut short by a kill is made again."""
    check_mirror(mirror)
    paths = {}
    for name, (url, size, expected) in WMT14_ARCHIVES.items():
        if local is not None:
            path = Path(local) / name
            if not path.is_file():
                raise DataError(f"{path}: missing; --data-dir for wmt14-en-de must hold "
                                f"{', '.join(WMT14_ARCHIVES)} (as downloaded from statmt.org)")
            try:
                verify(path, size, expected)
            except DataError as e:  # the user's own file: refused unless they vouch for it
                if not trust_local:
                    raise DataError(f"{str(e).split('; ')[0]}; not the official archive (--trust-local uses it "
                                    "anyway)") from None
                log.warning("not the official archive, used as given: %s", str(e).split("; ")[0])
        else:
            path = root / name
            if not path.exists():
                root.mkdir(parents=True, exist_ok=True)
                _download(f"{mirror.rstrip('/')}/{name}" if mirror else url, path,
                          "Pass --data-dir with a folder of the archives (or set AIAYN_WMT14)")
            stamp = _verified(path)
            if not stamp.exists() or stamp.read_text() != _stamp(path):
                try:
                    verify(path, size, expected)
                except DataError:
                    path.unlink()
                    raise
                stamp.write_text(_stamp(path))
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
                    data = f.read()
                    try:
                        text = data.decode("utf-8").split("\n")  # not splitlines: U+2028 is text
                    except UnicodeDecodeError as e:
                        line = data[:e.start].count(b"\n") + 1
                        raise DataError(f"{archive}: {info.name}: line {line}: invalid UTF-8 at byte {e.start}"
                                        ) from None
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


def fetch_wmt14(src: str, tgt: str, root: Path, local: Path | None = None, mirror: str | None = None,
                trust_local: bool = False) -> Path:
    """WMT14 EN-DE as text files: root/wmt14-en-de/{train,newstest2013,newstest2014}.{en,de}.
    Extracts once; a later call with the same archives returns at once. A failed extraction
    leaves no piece behind."""
    if {src, tgt} != {"en", "de"}:
        raise DataError(f"wmt14-en-de has English and German: --src and --tgt must be en and de, got {src}, {tgt}")
    out = root / "wmt14-en-de"
    archives = wmt14_archives(local, out / "archives", mirror, trust_local)
    stamp = {name: [str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for name, p in archives.items()}
    done = out / "extracted.json"
    try:
        if done.exists() and read_json(done) == stamp:
            return out
    except FileError:  # damaged: extracted again
        pass
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
    try:
        for archive, members in wanted.items():
            log.info("extracting %s", archives[archive].name)
            _extract(archives[archive], members)
        _join(out, pieces)
    except BaseException:
        for piece in (p for parts in pieces.values() for p in parts):
            piece.unlink(missing_ok=True)
        raise
    done.write_text(json.dumps(stamp))
    return out


def _join(out: Path, pieces: dict[str, list[Path]]) -> None:
    """Concatenate each split's pieces into out/SPLIT.LANG (each piece ends its own last line)."""
    for name, parts in pieces.items():
        with open(out / name, "wb") as f:
            for piece in parts:
                with open(piece, "rb") as p:
                    shutil.copyfileobj(p, f, 1 << 22)
                    if p.tell() and (p.seek(-1, os.SEEK_END), p.read(1))[1] != b"\n":
                        f.write(b"\n")  # the next corpus starts on a line of its own
                piece.unlink()
