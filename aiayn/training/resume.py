"""Resuming a run (§5) bit for bit: the weights, optimizer, progress, loss window, loss scale and
every rank's random streams back from a checkpoint's training state, and the data position checked
against what orders the batches now."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..checkpoint import CheckpointError, load_into, load_state, read_meta, read_weights
from ..data.prepare import check_vocabulary
from .state import Progress, check_state, rank_seed, set_rng_state

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("aiayn")

# What fixes the order of the training data: a saved position is exact only while these hold.
DATA_ORDER = {"max_tokens": "data.max_tokens", "seed": "train.seed", "pairs": "the prepared training pairs"}


def restore(trainer: Trainer, state_path: Path, force_batching: bool = False) -> None:
    """Continue from a checkpoint: weights, optimizer, progress, and every rank's RNG."""
    weights_path = state_path.with_name(state_path.name.replace(".state.pt", ".safetensors"))
    tensors, meta = read_weights(weights_path)
    check_vocabulary(read_meta(meta, weights_path)[1].proto, trainer.data_dir)  # --resume RUN --data OTHER
    saved = load_state(state_path)
    check_state(saved, state_path)
    try:
        trainer.optimizer.load_state_dict(saved["optimizer"])
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{state_path}: the optimizer state does not fit this model ({e})") from None
    trainer.progress = Progress.from_dict(saved["progress"], trainer.batching())
    was = saved["progress"].get("batching", {})
    check_batching(trainer, was, state_path, force_batching)
    rngs = saved["rng"] if isinstance(saved["rng"], list) else [saved["rng"]]
    if trainer.env.rank < len(rngs):
        set_rng_state(rngs[trainer.env.rank], trainer.env.device)
    else:  # more ranks than when the checkpoint was written: a fresh stream for this rank
        torch.manual_seed(rank_seed(trainer.cfg.train.seed + trainer.progress.step, trainer.env.rank))
    if len(rngs) != trainer.env.world:
        log.warning("the checkpoint holds the random streams of %d rank(s), this run has %d: "
                    "dropout masks will differ from an uninterrupted run", len(rngs), trainer.env.world)
    trainer.window.restore(saved.get("window"), trainer.env.rank, trainer.env.world, trainer.progress.step)
    trainer.scaler.load_state_dict(saved.get("scaler"))
    load_into(trainer.model, tensors, weights_path)  # in place: the optimizer keeps these parameters
    log.info("resumed from %s at step %d (epoch %d, batch %d)", weights_path.name, trainer.progress.step,
             trainer.progress.epoch, trainer.progress.batch)

def check_batching(trainer: Trainer, was: dict, state_path: Path, force: bool) -> None:
    """A saved data position holds only while what orders the data is the same (--force-batching:
    from the next epoch); another number of batches per update is said in the log."""
    now = trainer.batching()
    changed = [f"{what} was {was[k]} and is now {now[k]}" for k, what in DATA_ORDER.items()
               if k in was and was[k] != now[k]]
    if changed and trainer.progress.batch > 0:
        if not force:
            raise CheckpointError(
                f"cannot resume from {state_path}: {'; '.join(changed)}. The saved position (batch "
                f"{trainer.progress.batch} of epoch {trainer.progress.epoch}) has no exact place in the new "
                "batches. Resume with the old value, or pass --force-batching to continue from the start "
                "of the next epoch with the new batching")
        log.warning("%s; --force-batching: continuing from the start of epoch %d",
                    "; ".join(changed), trainer.progress.epoch + 1)
        trainer.progress.epoch += 1
        trainer.progress.batch = 0
    g_was = was.get("per_update", was.get("world", 1) * was.get("update_freq", 1))
    if was and g_was != now["per_update"]:
        log.warning("batches per update were %d and are now %d: the data position is the same, each update "
                    "is a different size", g_was, now["per_update"])
