"""Where a training run (§5) runs: one process or torchrun's ranks, the device, the CPU threads, and
the kernels a CPU run takes (for the log)."""

from __future__ import annotations

import datetime
import gc
import logging
import os
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..device import huge_pages, native_bf16, pick_device
from ..models.linear import kernel_cache, onednn_available, onednn_fp32
from ..presets import TRAIN_LIMITS

log = logging.getLogger("aiayn")


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
        kernel = "oneDNN" if onednn_available() and onednn_fp32() else "MKL (F.linear)"
        words.append(f"fp32 products through {kernel}, attention through SDPA")
    return "; ".join(words)


def main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
