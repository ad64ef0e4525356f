"""A run folder (§5): config.yaml, run.json (where the data is, how each session started, the commit),
train.log, metrics.jsonl and checkpoints/."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch

from ..checkpoint import (
    list_checkpoints,
)
from ..config import Config
from ..device import cpu_label
from ..files import FileError, atomic_write, digest, read_bounded, read_json
from ..version import __version__
from .processes import Dist

log = logging.getLogger("aiayn")
progress_log = logging.getLogger("aiayn.progress")  # periodic loss lines: train.log only (tqdm shows them)
progress_log.propagate = False


class Run:
    """A run directory: config.yaml, run.json, train.log, metrics.jsonl, checkpoints/."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"

    def save_config(self, cfg: Config) -> None:
        """config.yaml, written atomically: never half a file, and a reader of the old one keeps it whole."""
        atomic_write(self.path / "config.yaml", cfg.to_yaml().encode())

    def metrics(self, record: dict) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def tensorboard(self):
        """A TensorBoard writer in RUN/tensorboard, or None where tensorboard is not installed."""
        try:
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(str(self.path / "tensorboard"))
        except Exception:  # tensorboard is optional
            return None

    def forget_metrics_after(self, step: int, validated: bool = True) -> None:
        """Drop metric rows past `step` (written by a process killed before its next checkpoint),
        so the resumed run's rows are not listed twice; and the validation at `step` itself unless
        the checkpoint was `validated` (it was written before that validation, which is made again)."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return
        try:
            rows = read_bounded(path).splitlines(keepends=True)
        except FileError as e:  # not text, too big, not a file: kept aside, not lost, and a new one started
            aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(path, aside)
            log.warning("%s; kept as %s, and a new one started", e, aside.name)
            return
        kept = [row for row, record in zip(rows, map(_metric, rows), strict=True) if record is not None and (
            record["step"] < step or record["step"] == step and (validated or "valid_loss" not in record))]
        if len(kept) != len(rows):
            atomic_write(path, "".join(kept).encode())

    def latest_state(self) -> Path | None:
        for w in reversed(list_checkpoints(self.path)):
            s = w.with_name(w.name.replace(".safetensors", ".state.pt"))
            if s.exists():
                return s
        return None


def _metric(line: str) -> dict | None:
    """One row of metrics.jsonl: its numbers, with a step; None for a line cut short by a kill or not a record."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    record = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return record if "step" in record else None


def read_metrics(run_dir: Path) -> list[dict]:
    """A run's metrics.jsonl (§5's curves), read as untrusted input (files.read_bounded): one dict of numbers
    per training or validation row; lines that are not such a row are skipped; [] before the first row."""
    path = Path(run_dir) / "metrics.jsonl"
    return [r for r in map(_metric, read_bounded(path).splitlines()) if r is not None] if path.exists() else []


def git_commit() -> str | None:
    """The commit of the aiayn source tree, with "+dirty" for uncommitted changes; None outside git."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def record_start(run: Run, data_dir: Path, cfg: Config, env: Dist, resumed: bool, per_update: int,
                 precision_why: str = "") -> None:
    """The run's record of this start: its config.yaml, and in run.json where the data is and how each
    session of the run was started (command line, versions, git commit, device and CPU class,
    threads, ranks, tokens per update, precision and why)."""
    import platform
    import sys

    path = run.path / "run.json"
    try:
        record = read_json(path) if resumed and path.exists() else {}
        if not isinstance(record.get("sessions", []), list):
            raise ValueError("not a mapping with a list of sessions")
    except ValueError as e:  # unreadable, not JSON, too big (FileError is a ValueError): kept aside, not lost
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(path, aside)
        log.warning("%s is damaged (%s); kept as %s, and a new one started", path, str(e)[:80], aside.name)
        record = {}
    record["data_dir"] = str(data_dir.resolve())
    if cfg.train.init_from and "parent" not in record:  # fine-tuning: the checkpoint it started from
        parent = Path(cfg.train.init_from)
        record["parent"] = {"checkpoint": str(parent.resolve()), "sha256": digest(parent)}
    record.setdefault("sessions", []).append({
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "resumed": resumed, "command": sys.argv,
        "aiayn": __version__, "git": git_commit(), "torch": torch.__version__,
        "python": platform.python_version(), "device": str(env.device),
        "cpu": cpu_label() if env.device.type == "cpu" else None,
        "precision": cfg.train.precision, "precision_why": precision_why,
        "threads": torch.get_num_threads() if env.device.type == "cpu" else None, "world": env.world,
        "update_freq": cfg.train.update_freq, "tokens_per_update": cfg.train.tokens_per_update,
        "batches_per_update": per_update, "max_tokens_per_update": cfg.data.max_tokens * per_update,
    })
    run.save_config(cfg)
    atomic_write(path, json.dumps(record, indent=1).encode())
