"""`translate -o OUTPUT`'s finished chunks, kept beside the output as they are done (OUTPUT.parts/),
so a translation killed after hours — a training set for back-translation or distillation — resumes
at its first unfinished chunk and gives the bytes an uninterrupted run gives; the folder goes once
the output is whole. Each part records the digest of its input lines, and the folder what every part
depends on (model, settings, chunk size): anything else changed and the parts are made anew."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from ..files import FileError, add_to_marker, atomic_write, marked, owned, read_json, write_marker

log = logging.getLogger("aiayn")
PARTS = "translate-parts"  # the kind in the folder's marker (files.MARKER): only such a folder is reused or removed


def _lines_digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


class Parts:
    """The chunks of one `translate -o` run, by index; `key`: what their translations depend on."""

    def __init__(self, output: Path, key: dict):
        self.folder = output.with_name(output.name + ".parts")
        self.key = key
        if self.folder.is_symlink() or (self.folder.exists() and not self.folder.is_dir()):
            raise FileError(f"{self.folder}: in the way of the resumable parts of {output} (not a folder aiayn "
                            "made); move it away")
        if self.folder.is_dir():
            if marked(self.folder, PARTS):  # a write cut short by a kill leaves a temporary file: never a part
                for tmp in self.folder.glob(".*.tmp"):
                    tmp.unlink()
            if not owned(self.folder, PARTS):
                raise FileError(f"{self.folder}: holds files aiayn did not write there; aiayn never deletes what "
                                "it did not write: move it away")
            try:
                same = read_json(self.folder / "key.json") == key
            except FileError:
                same = False
            if not same:
                log.info("%s: made with another model, settings or input: translating anew", self.folder)
                shutil.rmtree(self.folder)
        done = len(list(self.folder.glob("[0-9]*.json"))) if self.folder.is_dir() else 0
        if done:
            log.info("resuming %s: %d chunk(s) already translated (%s)", output, done, self.folder)

    def get(self, k: int, lines: list[str]) -> dict | None:
        """Chunk k's record if it was finished for these input lines, else None."""
        path = self.folder / f"{k:06d}.json"
        if not path.is_file():
            return None
        try:
            record = read_json(path, limit=1 << 30)
        except FileError:
            return None
        return record if record.get("input_sha256") == _lines_digest(lines) else None

    def put(self, k: int, lines: list[str], record: dict) -> None:
        """Keep chunk k's record (the folder made with the first: a run that fails before it leaves nothing)."""
        if not self.folder.is_dir():
            self.folder.mkdir(parents=True)
            atomic_write(self.folder / "key.json", json.dumps(self.key, indent=1).encode())
            write_marker(self.folder, PARTS)
        name = f"{k:06d}.json"
        add_to_marker(self.folder, PARTS, [name])  # listed before it exists: a kill leaves the folder ours
        atomic_write(self.folder / name, json.dumps({**record, "input_sha256": _lines_digest(lines)}).encode())

    def finish(self) -> None:
        """The output is whole: the parts go (only a folder of ours, as made)."""
        if owned(self.folder, PARTS):
            shutil.rmtree(self.folder)

