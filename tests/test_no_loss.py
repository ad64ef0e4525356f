"""Nothing is lost to any command: run and data folders are locked against a second writer (real
processes, the holder's PID named), a prepared cache is swapped in whole (a failure leaves the old
one, a memory-mapped reader keeps its files), small files are replaced atomically with an ordinary
file's mode, and a folder aiayn did not write is never cleared."""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, aiayn

from aiayn.config import Config
from aiayn.data import prepare as data_module
from aiayn.data.prepare import prepare
from aiayn.files import MARKER, FileError, atomic_write, check_output_file, lock_holders, new_folder, owned
from aiayn.training.run_folder import Run


def wait_for(cond, what: str, proc: subprocess.Popen | None = None, limit: float = 120) -> None:
    deadline = time.time() + limit
    while not cond():
        assert proc is None or proc.poll() is None, f"the process ended before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def splits(corpus: Path) -> dict:
    return {name: (corpus / f"{name}.en", corpus / f"{name}.de") for name in ("train", "valid", "test")}


@pytest.mark.slow
def test_a_second_trainer_and_a_prepare_are_refused_while_a_run_trains(toy_corpus, toy_prepared, tmp_path):
    """Trainer A holds its run and its data. B (`train --resume`) and `prepare` into A's data are
    refused with A's PID and change nothing; A is then SIGKILLed before its first checkpoint, and the
    resumed run lists each step's metrics once; the files it wrote have an ordinary file's mode."""
    prep, run = tmp_path / "prep", tmp_path / "run"
    shutil.copytree(toy_prepared, prep)
    endless = [*TINY, "--train.max_steps", "100000", "--train.save_every", "0", "--train.log_every", "1"]
    a = subprocess.Popen(aiayn("train", "--data", str(prep), "--run-dir", str(run), *endless),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.umask(0o022))
    try:
        metrics = run / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "metrics", a)
        assert a.pid in lock_holders(run) and a.pid in lock_holders(prep)
        before = {p: p.read_bytes() for p in prep.iterdir() if p.is_file()}
        b = subprocess.run(aiayn("train", "--resume", str(run)), capture_output=True, text=True, timeout=120)
        assert b.returncode == 2 and f"PID {a.pid}" in b.stderr and "being trained" in b.stderr, b.stderr[-2000:]
        p = subprocess.run(aiayn("prepare", "--data-dir", str(toy_corpus), "--src", "en", "--tgt", "de", "--train",
                                 "train", "--valid", "valid", "-o", str(prep), "--data.vocab_size", "61"),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and f"PID {a.pid}" in p.stderr and "in use" in p.stderr, p.stderr[-2000:]
        assert {q: q.read_bytes() for q in prep.iterdir() if q.is_file()} == before
        assert not [q for q in prep.parent.iterdir() if q.name.startswith(".prep.")]  # no half-built cache left
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait()
    assert not list((run / "checkpoints").glob("step-*"))  # killed before its first checkpoint
    res = subprocess.run(aiayn("train", "--resume", str(run), "--train.max_steps", "4"), capture_output=True,
                         text=True, timeout=120, preexec_fn=lambda: os.umask(0o022))
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 4, steps  # the killed process's rows are gone
    for f in [run / "run.json", run / "config.yaml", *(run / "checkpoints").glob("step-*")]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
    assert run.stat().st_mode & 0o077 == 0o055  # the run folder itself is not private either


def test_a_failed_prepare_leaves_the_old_cache_whole(toy_corpus, tmp_path, monkeypatch):
    out = tmp_path / "prep"
    prepare(splits(toy_corpus), out, "en", "de", vocab_size=60, max_len=32)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(data_module, "encode_split", broken)
    with pytest.raises(OSError, match="disk full"):
        prepare(splits(toy_corpus), out, "en", "de", vocab_size=61, max_len=32)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # manifest included
    assert [p.name for p in tmp_path.iterdir()] == ["prep"]  # no temporary folder left beside it


def test_a_reader_keeps_its_memory_mapped_files_through_a_new_prepare(toy_corpus, tmp_path):
    out = tmp_path / "prep"
    prepare(splits(toy_corpus), out, "en", "de", vocab_size=60, max_len=32)
    mapped = np.load(out / "train.src.tok.npy", mmap_mode="r")
    copy = np.array(mapped)
    inode = (out / "train.src.tok.npy").stat().st_ino
    prepare(splits(toy_corpus), out, "en", "de", vocab_size=50, max_len=32)  # a new vocabulary
    assert (out / "train.src.tok.npy").stat().st_ino != inode  # new files, not the old ones rewritten
    assert np.array_equal(mapped, copy)  # the old mapping reads what it read before
    assert json.loads((out / "manifest.json").read_text())["settings"]["vocab_size"] == 50


def test_prepare_refuses_a_folder_it_did_not_write(toy_corpus, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    with pytest.raises(FileError, match="not empty"):
        prepare(splits(toy_corpus), out, "en", "de", vocab_size=60, max_len=32)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_config_yaml_is_replaced_not_rewritten_in_place(tmp_path):
    path = tmp_path / "config.yaml"
    Run(tmp_path).save_config(Config())
    with open(path) as old:  # a reader that opened it before the write
        cfg = Config()
        cfg.train.lr_scale = 3.0
        Run(tmp_path).save_config(cfg)
        assert old.read() == _yaml(Config())  # the old file is whole, not truncated or mixed
    assert path.read_text() == _yaml(cfg)


def _yaml(cfg: Config) -> str:
    import yaml

    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == mode


def test_new_folder_replaces_only_its_own_output(tmp_path):
    out = tmp_path / "maps"
    with new_folder(out, "maps") as tmp:
        (tmp / "a.png").write_bytes(b"1")
        (tmp / "sub").mkdir()
        (tmp / "sub/b.png").write_bytes(b"1")
    with new_folder(out, "maps") as tmp:
        (tmp / "b.png").write_bytes(b"2")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "b.png"]  # its own earlier output: replaced whole
    with pytest.raises(FileError, match="not empty"):  # another command's output is not this one's
        with new_folder(out, "export"):
            pass
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileError, match="not empty"):
        with new_folder(out, "maps"):
            pass
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(RuntimeError):
        with new_folder(tmp_path / "fresh", "maps") as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("killed half-way")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps"]  # nothing half-written left
    cwd = os.getcwd()
    try:
        os.chdir(out)
        with pytest.raises(FileError):
            with new_folder(".", "maps"):
                pass
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("extra", ["sub/notes.txt", "sub/", "link"])
def test_a_marked_folder_holding_anything_unlisted_is_refused(tmp_path, extra):
    out = tmp_path / "out"
    with new_folder(out, "maps") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub/a.png").write_bytes(b"1")
    target = out / extra.rstrip("/")
    if extra == "link":
        target.symlink_to(tmp_path)
    elif extra.endswith("/"):
        (out / "sub/deeper").mkdir()
    else:
        target.write_text("mine")
    assert not owned(out, "maps")
    with pytest.raises(FileError, match="not empty"):
        with new_folder(out, "maps"):
            pass
    assert (out / "sub/a.png").exists()


@pytest.mark.parametrize("marker", ["not json", "[1]", '{"aiayn": "maps", "wrote": "*"}', "{" * 100_000])
def test_a_damaged_or_forged_marker_owns_nothing(tmp_path, marker):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / MARKER).write_text(marker)
    assert not owned(tmp_path / "out", "maps")


@pytest.mark.parametrize("exchange", [True, False])
def test_the_old_output_goes_only_after_the_new_one_is_in_place(tmp_path, monkeypatch, exchange):
    """Killed while removing the replaced folder: the new output is already at its name, the old
    one lies beside it; with or without the one-step exchange (renameat2)."""
    import aiayn.files as files

    out = tmp_path / "out"
    with new_folder(out, "maps") as tmp:
        (tmp / "old.png").write_bytes(b"old")
    if not exchange:
        monkeypatch.setattr(files.ctypes, "CDLL", lambda *a, **k: object())  # a libc without renameat2

    def killed(path, ignore_errors=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        with new_folder(out, "maps") as tmp:
            (tmp / "new.png").write_bytes(b"new")
    assert (out / "new.png").read_bytes() == b"new" and not (out / "old.png").exists()
    aside = [p for p in tmp_path.iterdir() if p.name != "out"]
    assert [(p / "old.png").read_bytes() for p in aside] == [b"old"]


def test_an_output_file_that_is_an_input_is_refused(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a dog\n")
    (tmp_path / "link.txt").symlink_to(src)
    for out in (src, tmp_path / "link.txt", tmp_path / "." / "in.txt"):
        with pytest.raises(FileError, match="also an input"):
            check_output_file(out, inputs=(str(src), None))
    assert check_output_file(tmp_path / "out.txt", inputs=(str(src),)) == tmp_path / "out.txt"


def test_a_single_file_output_replaces_only_a_file_of_its_kind_that_aiayn_wrote(tmp_path):
    """check_safetensors_output: a new path, or aiayn's own file of that kind (its header says so), is
    replaced; a user's text, another tool's safetensors and a shortlist where a checkpoint belongs are not."""
    from safetensors.torch import save_file

    from aiayn.checkpoint import check_safetensors_output

    mine, theirs, shortlist, notes = (tmp_path / n for n in ("mine.st", "theirs.st", "sl.st", "notes.txt"))
    save_file({"w": torch.zeros(1)}, mine, metadata={"format": "aiayn-1"})
    save_file({"w": torch.zeros(1)}, theirs, metadata={"format": "pt"})
    save_file({"table": torch.zeros(1)}, shortlist, metadata={"aiayn_shortlist": "{}"})
    notes.write_text("my notes\n")
    assert check_safetensors_output(mine) == mine and check_safetensors_output(tmp_path / "new.st")
    for path in (theirs, shortlist, notes):
        with pytest.raises(FileError, match="exists and is not an aiayn checkpoint"):
            check_safetensors_output(path)
    assert check_safetensors_output(shortlist, ours=lambda meta: "aiayn_shortlist" in meta) == shortlist
    assert notes.read_text() == "my notes\n"


def test_export_twice_replaces_the_earlier_export_and_leaves_nothing_beside(toy_prepared, tmp_path):
    pytest.importorskip("transformers")
    from conftest import tiny_config

    from aiayn.cli import main
    from aiayn.training.session import train

    cfg = tiny_config(max_steps=1)
    cfg.model.N = 1
    train(cfg, toy_prepared, tmp_path / "run")
    ckpt = sorted((tmp_path / "run/checkpoints").glob("step-*.safetensors"))[-1]
    out = tmp_path / "out" / "hf"
    assert main(["export", "hf", "--checkpoint", str(ckpt), "-o", str(out)]) == 0
    first = sorted(p.name for p in out.iterdir())
    assert main(["export", "hf", "--checkpoint", str(ckpt), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == first
    assert [p.name for p in out.parent.iterdir()] == ["hf"]
    if sys.modules.get("ctranslate2") or _has("ctranslate2"):
        ct2 = tmp_path / "out" / "ct2"
        assert main(["export", "ct2", "--checkpoint", str(ckpt), "-o", str(ct2)]) == 0
        assert sorted(p.name for p in out.parent.iterdir()) == ["ct2", "hf"]  # no ct2.hf left behind


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_a_full_disk_during_a_checkpoint_is_one_line_and_loses_nothing(toy_prepared, tmp_path, monkeypatch, capsys):
    """The disk fills while a checkpoint is written: the command ends with one line naming the file,
    exit 2, the checkpoints written before are whole and no temporary file is left."""
    import errno

    import aiayn.files as files
    from aiayn.cli import main

    run = tmp_path / "run"
    tiny = ["--model.d_model", "16", "--model.d_ff", "32", "--model.h", "2", "--model.N", "1",
            "--model.max_positions", "64", "--data.max_tokens", "400", "--train.valid_every", "0",
            "--train.valid_bleu_sentences", "0", "--train.save_every_minutes", "0", "--train.save_every", "2",
            "--train.threads", "1", "--train.tokens_per_update", "0"]
    assert main(["train", "--data", str(toy_prepared), "--run-dir", str(run), *tiny, "--train.max_steps", "2"]) == 0
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    real_fsync = os.fsync

    def full(fd):
        real_fsync(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--train.max_steps", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "No space left on device" in err[-1] and "unchanged" in err[-1] and "Traceback" not in "\n".join(err)
    after = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    assert {k: v for k, v in after.items() if k in before} == before
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]


def test_a_damaged_run_json_is_kept_aside_on_resume(toy_prepared, tmp_path, caplog):
    """run.json holds the history of a run's starts and resumes; a damaged one was replaced silently."""
    import logging

    from aiayn.cli import main

    run = tmp_path / "run"
    tiny = ["--model.d_model", "16", "--model.d_ff", "32", "--model.h", "2", "--model.N", "1",
            "--model.max_positions", "64", "--data.max_tokens", "400", "--train.valid_every", "0",
            "--train.valid_bleu_sentences", "0", "--train.save_every_minutes", "0", "--train.threads", "1",
            "--train.tokens_per_update", "0"]
    assert main(["train", "--data", str(toy_prepared), "--run-dir", str(run), *tiny, "--train.max_steps", "1"]) == 0
    (run / "run.json").write_text('{"sessions": [{"started": "2026-01-01"')  # cut short
    with caplog.at_level(logging.WARNING, logger="aiayn"):
        assert main(["train", "--resume", str(run), "--train.max_steps", "2"]) == 2  # where is its data?
        assert main(["train", "--resume", str(run), "--data", str(toy_prepared), "--train.max_steps", "2"]) == 0
    aside = list(run.glob("run.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == '{"sessions": [{"started": "2026-01-01"'
    assert "damaged" in caplog.text and aside[0].name in caplog.text
    assert len(json.loads((run / "run.json").read_text())["sessions"]) == 1


@pytest.mark.parametrize("damage", [b"\x93NUMPY binary", b"[" * 100_000 + b"]" * 100_000 + b"\n"])
def test_a_damaged_metrics_file_is_kept_aside_or_its_bad_lines_dropped_on_resume(toy_prepared, tmp_path, damage):
    """A resume rewrites metrics.jsonl without the rows past its checkpoint: a line that is not a record is
    dropped with them; a file that is not text is moved aside whole (never read into a traceback, never lost)."""
    from aiayn.cli import main

    run = tmp_path / "run"
    tiny = ["--model.d_model", "16", "--model.d_ff", "32", "--model.h", "2", "--model.N", "1",
            "--data.max_tokens", "400", "--train.valid_every", "0", "--train.valid_bleu_sentences", "0",
            "--train.threads", "1", "--train.tokens_per_update", "0", "--train.log_every", "1"]
    assert main(["train", "--data", str(toy_prepared), "--run-dir", str(run), *tiny, "--train.max_steps", "2"]) == 0
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(damage)
    assert main(["train", "--resume", str(run), "--train.max_steps", "3"]) == 0
    aside = list(run.glob("metrics.jsonl.corrupt-*"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]  # training rows (a validation row follows the last update)
    if damage.startswith(b"["):
        assert not aside and [r["step"] for r in rows] == [1, 2, 3]
    else:
        assert len(aside) == 1 and aside[0].read_bytes().endswith(damage) and [r["step"] for r in rows] == [3]


def test_read_bounded_refuses_what_is_no_small_text_file_without_reading_it(tmp_path):
    """Files aiayn wrote for itself are read as untrusted (files.read_bounded, read_json): one FileError
    naming the file for a folder, a FIFO (refused at once: a read would wait for a writer forever), a
    device, a sparse 3 GiB file (refused by its size, never read), bytes that are not UTF-8; and for
    JSON that is no object or is nested past the recursion limit, with what to do about it."""
    from aiayn.files import read_bounded, read_json

    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(3 << 30)
    (tmp_path / "binary").write_bytes(b"ok\xff\xfe")
    (tmp_path / "small").write_text("x" * 101)
    for name, says in [("", "not a regular file"), ("fifo", "not a regular file"), ("missing", "cannot read"),
                       ("sparse", "3,221,225,472 bytes, more than such a file holds"),
                       ("binary", "not a text file (invalid UTF-8 at byte 2)"),
                       ("small", "101 bytes, more than such a file holds (100)")]:
        with pytest.raises(FileError, match=re.escape(f"{tmp_path / name}: {says}")):
            read_bounded(tmp_path / name, limit=100)
    with pytest.raises(FileError, match="not a regular file"):
        read_bounded("/dev/zero")
    assert read_bounded(tmp_path / "small", limit=101) == "x" * 101
    for text, says in [("[1, 2]", "a JSON list, not an object"), ("7", "a JSON int"), ('{"a": ', "corrupt"),
                       ("[" * 100_000, "nested past Python's recursion limit")]:
        (tmp_path / "r.json").write_text(text)
        with pytest.raises(FileError, match=re.escape(says) + ".*; re-run it$"):
            read_json(tmp_path / "r.json", fix="re-run it")
    (tmp_path / "r.json").write_text('{"a": [1]}')
    assert read_json(tmp_path / "r.json") == {"a": [1]}


@pytest.mark.parametrize("link", ["loop", "dangling", "to an empty folder"])
def test_an_output_folder_that_is_a_link_is_one_line_before_any_work(toy_prepared, tmp_path, link, capsys):
    """A symbolic link as --output (a loop, a link to nowhere, or to an empty folder the swap would
    replace by a folder of its own): refused in one line before the model is loaded; nothing changes."""
    from aiayn.checkpoint import model_tensors, save_weights
    from aiayn.cli import main
    from aiayn.config import Config
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.models.transformer import Transformer

    tok, cfg = Tokenizer.load(str(toy_prepared / "spm.model")), Config()
    cfg.model.vocab_size, cfg.model.d_model, cfg.model.d_ff, cfg.model.h, cfg.model.N = len(tok), 16, 32, 2, 1
    ckpt = tmp_path / "model.safetensors"
    save_weights(ckpt, model_tensors(Transformer(cfg.model)), cfg, tok, 0)
    out = tmp_path / "maps"
    if link == "loop":
        out.symlink_to(tmp_path / "maps")
    elif link == "dangling":
        out.symlink_to(tmp_path / "nowhere")
    else:
        (tmp_path / "empty").mkdir()
        out.symlink_to(tmp_path / "empty")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["plot", "attention", "--checkpoint", str(ckpt), "--src", "a dog",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a symbolic link" in err[0] and "Traceback" not in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before and out.is_symlink()
    for verb in (["export", "hf", "--checkpoint", str(ckpt), "-o", str(out)],
                 ["prepare", "--data-dir", str(tmp_path), "--src", "en", "--tgt", "de", "-o", str(out)]):
        assert main(verb) == 2 and "is a symbolic link" in capsys.readouterr().err
