"""A training run's surroundings (§5): the devices and processes (one, or torchrun's ranks), the run
directory (config, provenance, metrics, checkpoints) and the random streams a resume restores."""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoint import (
    DamagedState,
    list_checkpoints,
)
from ..config import Config
from ..device import cpu_label, huge_pages, native_bf16, pick_device
from ..files import FileError, atomic_write, digest, read_bounded, read_json
from ..models.linear import kernel_cache, onednn_available, onednn_trains
from ..presets import TRAIN_LIMITS
from ..version import __version__

log = logging.getLogger("aiayn")
progress_log = logging.getLogger("aiayn.progress")  # periodic loss lines: train.log only (tqdm shows them)
progress_log.propagate = False


# -- devices and processes -----------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # setup() joined the process group, so leave() leaves it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def cpu_threads(threads: int, world: int) -> int:
    """CPU threads for one process: train.threads if set; else OMP_NUM_THREADS if set, as OpenMP and
    PyTorch read it (one process only: torchrun sets it to 1 for every rank it starts); else all cores,
    shared by the ranks."""
    if threads:
        return threads
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if world == 1 and omp.isdigit() and 0 < int(omp) <= TRAIN_LIMITS["threads"]:
        log.info("CPU threads: %s (OMP_NUM_THREADS)", omp)
        return int(omp)
    return max(1, (os.cpu_count() or 1) // world)


def setup(device: str | None, threads: int, timeout_minutes: float = 60.0) -> Dist:
    """Pick the device; join the process group when started by torchrun (WORLD_SIZE > 1), with
    an explicit time limit for collectives (validation is shared by the ranks, so none waits long)."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    kernel_cache(16)  # token-count batches bring new shapes all the time (linear.py)
    huge_pages()
    dev = pick_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(cpu_threads(threads, world))
    owns = world > 1 and not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    if rank != 0:
        log.setLevel(logging.WARNING)  # rank 0 speaks for the run
    return Dist(rank, world, dev, owns)


def leave(env: Dist) -> None:
    """Leave the process group that `setup` joined, while Python is still whole, as PyTorch asks of
    every run (a group left to interpreter shutdown can abort a rank); a caller's own group stays."""
    if env.owns_group and dist.is_initialized():
        gc.collect()  # a DDP wrapper caught in a reference cycle would free the group's threads at exit
        dist.destroy_process_group()


def cpu_paths(precision: str) -> str:
    """The CPU's relevant flags and the kernels a CPU training run takes with them, for the log."""
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    native = native_bf16()
    words = [f"CPU vector unit {capability}, native bf16 {'yes (' + ', '.join(native) + ')' if native else 'no'}"]
    if precision == "bf16":
        words.append("products in bf16 through oneDNN (autocast), attention as explicit products "
                     "(SDPA's CPU kernel is slower in bf16)")
    else:
        kernel = "oneDNN" if onednn_available() and onednn_trains() else "MKL (F.linear)"
        words.append(f"fp32 products through {kernel}, attention through SDPA")
    words.append("dropout masks from 16-bit uniforms, four per 64-bit draw")
    return "; ".join(words)


# -- the run directory and the random streams -----------------------------------------------
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

class LossWindow:
    """§5's training loss per target token over the updates since the last log. Its sums go into
    checkpoints, so the first log after a resume averages the same updates as an uninterrupted run."""

    def __init__(self, step: int = 0):
        self.loss, self.nll, self.tokens, self.start, self.step = 0.0, 0.0, 0, time.perf_counter(), step

    def add(self, loss: float | torch.Tensor, nll: float | torch.Tensor, tokens: int) -> None:
        """Sums kept as the step returned them (tensors on a GPU: no wait for it until `sums`)."""
        self.loss, self.nll, self.tokens = self.loss + loss, self.nll + nll, self.tokens + tokens

    def pause(self, seconds: float) -> None:
        """Leave time spent on something else (validation) out of the tokens/s."""
        self.start += seconds

    def sums(self) -> list:
        """This rank's loss and nll sums, all ranks' target tokens, and the seconds so far."""
        return [float(self.loss), float(self.nll), self.tokens, time.perf_counter() - self.start]

    def restore(self, saved: object, rank: int, world: int, step: int) -> None:
        """Reopen the window a checkpoint saved; one saved before windows were, or by another number
        of ranks, starts afresh at the checkpoint's step."""
        self.loss, self.nll, self.tokens, self.start, self.step = 0.0, 0.0, 0, time.perf_counter(), step
        ranks = saved.get("ranks", ()) if isinstance(saved, dict) else ()
        if len(ranks) == world and len(ranks[rank]) == 4:  # anything else: a fresh window, as before
            loss, nll, tokens, seconds = ranks[rank]
            self.add(float(loss), float(nll), int(tokens))
            self.start, self.step = self.start - float(seconds), int(saved["step"])


@dataclass
class Progress:
    """Where a run stands (§5): updates, the data position, time, the best validation scores and
    when it last validated and saved. Saved in each training state as the mapping it always was."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # batches of this epoch already used
    elapsed: float = 0.0  # seconds of training
    best_bleu: float = -1.0
    best_loss: float = 1e9
    stale: int = 0  # validations without improvement (train.patience)
    batching: dict = field(default_factory=dict)  # what fixes the order of the batches (Trainer.batching)
    validated_at: int | None = None  # the step of the last validation
    saved_at: int | None = None  # the step of the last checkpoint

    def to_dict(self) -> dict:
        """The mapping a training state holds (the steps never reached left out, as before)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, saved: dict, batching: dict) -> Progress:
        """A saved mapping (any aiayn's: older ones counted `cursor` updates, not batches), with this
        run's `batching`; the saved batching is Trainer._check_batching's to compare."""
        d = dict(saved)
        was = d.get("batching", {})
        if "batch" not in d:  # written before the position counted batches
            d["batch"] = d.pop("cursor", 0) * was.get("world", 1) * was.get("update_freq", 1)
        known = {f.name for f in dataclasses.fields(cls)} - {"batching"}
        return cls(**{k: v for k, v in d.items() if k in known}, batching=batching)


def check_state(saved: object, path: Path) -> None:
    """A training state holds the optimizer, the progress (step, epoch) and the random streams."""
    if not isinstance(saved, dict):
        raise DamagedState(f"{path}: not a training state (a {type(saved).__name__}, not a mapping)")
    missing = [k for k in ("optimizer", "progress", "rng") if k not in saved]
    progress = saved.get("progress")
    if isinstance(progress, dict):
        missing += [f"progress.{k}" for k in ("step", "epoch") if k not in progress]
    elif "progress" not in missing:
        missing.append("progress (not a mapping)")
    if missing:
        raise DamagedState(f"{path}: incomplete training state, missing {', '.join(missing)}")


def rank_seed(seed: int, rank: int) -> int:
    """§5.4 dropout differs between ranks: each rank's stream is seeded from (seed, rank)."""
    return int(np.random.SeedSequence([seed, rank, 5]).generate_state(1)[0])


def seed_rank(seed: int, rank: int) -> None:
    """§5.4: dropout differs between ranks; this rank's torch and Python streams start from (seed, rank)."""
    torch.manual_seed(rank_seed(seed, rank))
    random.seed(rank_seed(seed, rank))


def rng_state(device: torch.device) -> dict:
    """This process's random streams (dropout draws from torch's generator)."""
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
            "python_pos": random.getstate()[2],
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(s: dict, device: torch.device) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate((3, tuple(int(x) for x in s["python"]), s["python_pos"]))
    if s.get("cuda") is not None and device.type == "cuda":
        cuda = s["cuda"]
        torch.cuda.set_rng_state(cuda[0] if isinstance(cuda, list) else cuda, device)


def main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()




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
