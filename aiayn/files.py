"""Files that are never lost: atomic writes, output folders swapped into place, locks.

Every command that writes follows three rules. A file is written beside its final name and
renamed over it (a reader sees the old file or the new one, never half of one). A folder is
built as a hidden sibling, marked with what wrote it and every path it holds (MARKER), and
exchanged with the old one in one step; a folder that holds anything its marker does not list is
refused, never cleared. A run or a prepared data folder in use is locked, and a second
writer is refused with the holder's PID.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import AiaynError


class FileError(AiaynError):
    """An output that would destroy something, or a folder in use; the message names it."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync, rename over `path`, fsync the folder.
    The file gets the mode an ordinary write would (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise FileError(f"{path}: cannot write ({e.strerror or e}); nothing was replaced") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):  # a full disk, a quota: one line, and the old file is whole
            raise FileError(f"{path}: cannot write ({e.strerror or e}); the file there before, if any, is "
                            "unchanged") from None
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def digest(path: str | Path, algorithm: str = "sha256", gunzip: bool = False) -> str:
    """The hex digest of a file's bytes, read in blocks (a file of any size); with `gunzip`, of the
    text inside a gzip file. Raises OSError / EOFError for a file that cannot be read through."""
    h = hashlib.new(algorithm)
    with (gzip.open if gunzip else open)(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


# aiayn's own records (run.json, manifest.json, metrics.jsonl, a result) are read as untrusted input too:
# a user may hand over any folder, and a copy may have been cut short or edited.
RECORD_MAX_BYTES = 1 << 26


def read_bytes(path: str | Path, limit: int = RECORD_MAX_BYTES) -> bytes:
    """A file's bytes, read as untrusted: a regular file (a folder, a FIFO that would block or a device
    is refused without reading) of at most `limit` bytes. Otherwise FileError naming the file."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise FileError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileError(f"{path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1) if st.st_size <= limit else b""
    except OSError as e:
        raise FileError(f"{path}: cannot read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if st.st_size > limit or len(data) > limit:
        raise FileError(f"{path}: {max(st.st_size, len(data)):,} bytes, more than such a file holds ({limit:,})")
    return data


def read_bounded(path: str | Path, limit: int = RECORD_MAX_BYTES) -> str:
    """A file's text, read as untrusted (read_bytes), and UTF-8; otherwise FileError naming the file."""
    try:
        return read_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileError(f"{path}: not a text file (invalid UTF-8 at byte {e.start})") from None


def read_json(path: str | Path, fix: str = "", limit: int = RECORD_MAX_BYTES) -> dict:
    """One of aiayn's JSON records, read as untrusted (read_bounded): a JSON object, or FileError
    saying what is wrong with it and, after a semicolon, `fix` (what to do about it)."""
    path, tail = Path(path), f"; {fix}" if fix else ""
    try:
        value = json.loads(read_bounded(path, limit))
    except FileError as e:
        raise FileError(f"{e}{tail}") from None
    except RecursionError:
        raise FileError(f"{path}: corrupt (JSON nested past Python's recursion limit){tail}") from None
    except ValueError as e:
        raise FileError(f"{path}: corrupt ({str(e)[:80]}){tail}") from None
    if not isinstance(value, dict):
        raise FileError(f"{path}: corrupt (a JSON {type(value).__name__}, not an object){tail}")
    return value


def check_output_file(path: str | Path, flag: str = "--output", inputs: tuple = ()) -> Path:
    """Before any work: an output file's folder exists, the path is not a folder, and it is none
    of the command's `inputs` (the output would replace what it was made from)."""
    path = Path(path)
    flat = [q for p in inputs for q in (p if isinstance(p, (list, tuple)) else [p])]
    for src in (Path(p) for p in flat if p not in (None, "-")):
        if os.path.abspath(src) == os.path.abspath(path) or (src.exists() and path.exists()
                                                              and os.path.samefile(src, path)):
            raise FileError(f"{flag} {path}: is also an input ({src}); writing it would replace what it is "
                            "made from: choose another output file")
    if path.is_dir():
        raise FileError(f"{flag} {path}: is a folder, not a file")
    if not path.parent.is_dir():
        raise FileError(f"{flag} {path}: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise FileError(f"{flag} {path}: folder {path.parent} is not writable")
    return path


def _describe(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}"


# Every folder aiayn builds whole (prepare, export, attention maps, heads) carries this file: what
# wrote it, an id, and every path it wrote (subfolders included).
MARKER = ".aiayn-output.json"
_MARKER_MAX_BYTES = 1 << 22


def _entries(folder: Path) -> set[str]:
    """Every path under folder, relative, links not followed (folders end in '/'); the marker aside."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = os.path.relpath(dirpath, folder)
        for name in dirnames:
            out.add(os.path.normpath(os.path.join(rel, name)) + "/")
        out.update(os.path.normpath(os.path.join(rel, name)) for name in filenames)
    out.discard(MARKER)
    return out


def write_marker(folder: Path, kind: str) -> None:
    """Record in `folder` that aiayn's `kind` wrote it and which paths it wrote."""
    record = {"aiayn": kind, "id": uuid.uuid4().hex, "wrote": sorted(_entries(folder))}
    atomic_write(folder / MARKER, json.dumps(record, indent=1).encode())


def _marker(folder: Path, kind: str) -> dict | None:
    """The marker of `kind` in folder, or None (absent, a link, oversized, unreadable, another kind)."""
    marker = folder / MARKER
    try:
        if marker.is_symlink() or not marker.is_file() or marker.stat().st_size > _MARKER_MAX_BYTES:
            return None
        record = json.loads(marker.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(record, dict) and record.get("aiayn") == kind and isinstance(record.get("wrote"), list)
    return record if ok else None


def marked(folder: Path, kind: str) -> bool:
    """Whether `folder` carries the marker of aiayn's `kind` (whatever else it may hold)."""
    return _marker(folder, kind) is not None


def owned(folder: Path, kind: str) -> bool:
    """True if `folder` is an earlier output of aiayn's `kind` holding nothing beyond what it wrote:
    the marker is there, names `kind`, and lists every path the folder holds now."""
    record = _marker(folder, kind)
    return record is not None and _entries(folder) <= {w for w in record["wrote"] if isinstance(w, str)}


def add_to_marker(folder: Path, kind: str, names: list[str]) -> None:
    """Record paths that `kind` wrote into its folder after the folder was put in place."""
    record = _marker(folder, kind)
    if record is not None:
        record["wrote"] = sorted(set(record["wrote"]) | set(names))
        atomic_write(folder / MARKER, json.dumps(record, indent=1).encode())


def check_output_folder(out: str | Path, kind: str | Callable[[Path], bool] | None = None,
                        flag: str = "--output") -> Path:
    """An output folder may be new, empty, or an earlier output of this `kind` of command, which
    holds its marker and nothing it did not list (it is replaced whole). `kind` may instead be a
    test, for a folder that a command writes into by name and never clears (the evidence report).
    Anything else is refused: aiayn never deletes a file it did not write. Returns the absolute path."""
    out = Path(os.path.abspath(out))
    if out.is_symlink():  # a loop, a dangling link, or a link the swap would replace by a folder of its own
        raise FileError(f"{flag} {out}: is a symbolic link (to {os.readlink(out)}); name the folder itself")
    try:
        out.resolve(strict=False)
    except (RuntimeError, OSError) as e:  # a loop in a folder above it
        raise FileError(f"{flag} {out}: its path cannot be resolved ({e})") from None
    if out.exists() and not out.is_dir():
        raise FileError(f"{flag} {out}: is a file, not a folder")
    ours = kind if callable(kind) else (lambda f: bool(kind) and owned(f, kind))
    if out.is_dir() and any(out.iterdir()) and not ours(out):
        raise FileError(f"{flag} {out}: exists and is not empty ({_describe(out)}) and holds files aiayn did "
                        "not write there; aiayn never deletes what it did not write: choose a new folder")
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise FileError(f"{flag} {out}: is the current folder or holds it")
    return out


def _swap(new: Path, out: Path) -> None:
    """Put folder `new` at `out`. Where `out` exists the two are exchanged in one step (Linux
    renameat2 RENAME_EXCHANGE), so `out` is never missing and the old one ends up at `new`;
    elsewhere the old folder is renamed aside first, then the new one into place."""
    if not out.exists():
        os.rename(new, out)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None and renameat2(-100, bytes(new), -100, bytes(out), 2) == 0:  # AT_FDCWD, EXCHANGE
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.replace(out, aside / "x")
    os.rename(new, out)
    os.rename(aside / "x", new)
    aside.rmdir()


@contextlib.contextmanager
def new_folder(out: str | Path, kind: str, flag: str = "--output") -> Iterator[Path]:
    """Yield a hidden sibling folder to write into; on success it gets the marker of `kind` and takes
    the place of `out` (an earlier output of the same kind is removed only once the new one is in
    place). On an error the sibling is removed and `out` is untouched."""
    out = check_output_folder(out, kind, flag)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        write_marker(tmp, kind)
        check_output_folder(out, kind, flag)  # still ours: nothing appeared there meanwhile
        os.chmod(tmp, 0o777 & ~_umask())
        _swap(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the half-built folder, or after the swap the old one


# -- locks ---------------------------------------------------------------------------------
def lock_holders(path: Path) -> list[int]:
    """PIDs holding a `flock` on `path`, from /proc/locks (Linux); [] where it cannot say."""
    st = os.stat(path)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        rows = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    return sorted({int(f[4]) for f in (r.split() for r in rows) if len(f) > 5 and f[1] == "FLOCK" and f[5] == ident})


class Lock:
    """A `flock` on a folder itself (no lock file is created), held until `release` or until the
    process ends: a killed holder frees it at once. Exclusive for a writer, shared for readers."""

    def __init__(self, folder: Path, what: str, shared: bool = False):
        self.fd: int | None = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            pids = [p for p in lock_holders(folder) if p != os.getpid()]
            holder = f"PID {', '.join(map(str, pids))}" if pids else "PID unknown"
            raise FileError(f"{what} ({holder})") from None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_run(run_dir: Path) -> Lock:
    """One trainer per run directory (the folder is created if need be)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    return Lock(Path(run_dir), f"{run_dir} is being trained by another process; wait for it or stop it")


def hold_data(data_dir: Path) -> Lock:
    """A trainer reading a prepared data folder: `prepare` will not replace it meanwhile."""
    return Lock(Path(data_dir), f"{data_dir} is being replaced by `aiayn prepare`; wait for it", shared=True)


def lock_data(data_dir: Path) -> Lock | None:
    """`prepare` replacing a prepared data folder: refused while a trainer reads it."""
    if not Path(data_dir).is_dir():
        return None
    return Lock(Path(data_dir), f"{data_dir} is in use by a training run; stop it before preparing into it")
