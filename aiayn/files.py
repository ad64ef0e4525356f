"""Files that are never lost: atomic writes, output folders swapped into place, locks.

Every command that writes follows three rules. A file is written beside its final name and
renamed over it (a reader sees the old file or the new one, never half of one). A folder is
built as a hidden sibling and renamed into place, and a folder that holds anything aiayn did not
write is refused, never cleared. A run or a prepared data folder in use is locked, and a second
writer is refused with the holder's PID.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


class FileError(ValueError):
    """An output that would destroy something, or a folder in use; the message names it."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync, rename over `path`, fsync the folder.
    The file gets the mode an ordinary write would (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def check_output_file(path: str | Path, flag: str = "--output") -> Path:
    """Before any work: an output file's folder exists and the path is not a folder."""
    path = Path(path)
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


def check_output_folder(out: str | Path, ours: Callable[[Path], bool] | None = None, flag: str = "--output") -> Path:
    """An output folder may be new, empty, or one that `ours` recognises as this command's own
    earlier output (to be replaced whole). Anything else is refused: aiayn never deletes a file
    it did not write. Returns the absolute path."""
    out = Path(os.path.abspath(out))
    if out.exists() and not out.is_dir():
        raise FileError(f"{flag} {out}: is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (ours and ours(out)):
        raise FileError(f"{flag} {out}: exists and is not empty ({_describe(out)}); aiayn never deletes "
                        "what it did not write: choose a new folder")
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise FileError(f"{flag} {out}: is the current folder or holds it")
    return out


@contextlib.contextmanager
def new_folder(out: str | Path, ours: Callable[[Path], bool] | None = None, flag: str = "--output"
               ) -> Iterator[Path]:
    """Yield a hidden sibling folder to write into; on success it replaces `out` in one rename
    (an earlier output of the same command is moved aside first, then removed). On an error the
    sibling is removed and `out` is untouched."""
    out = check_output_folder(out, ours, flag)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        check_output_folder(out, ours, flag)  # still ours: nothing appeared there meanwhile
        os.chmod(tmp, 0o777 & ~_umask())
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / "x")
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
