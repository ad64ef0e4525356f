"""What a training state holds besides the weights (§5): where the run stands, the loss since the
last log, and the random streams a resume restores bit for bit."""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..checkpoint import (
    DamagedState,
)


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
        run's `batching`; the saved batching is resume.check_batching's to compare."""
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
