"""The training loop (§5): token-count batches, Adam + Eq. 3, label smoothing, checkpoints, DDP.

One code path for one process and for `torchrun` (PyTorch DDP): every rank builds the same
batch order from (seed, epoch), takes its share of each update's batches, and normalizes its
loss by the update's global target-token count, so N ranks compute exactly the update that one
process would on all their batches. Only rank 0 logs, validates and writes checkpoints.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sacrebleu
import torch
import torch.distributed as dist
import yaml
from torch import nn
from tqdm import tqdm

from .checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_into,
    load_state,
    model_tensors,
    read_weights,
    save_state,
    save_weights,
)
from .config import Config, load_yaml
from .data import Batch, TokenData, collate, load_manifest, make_batches
from .files import atomic_write, hold_data, lock_run
from .linear import kernel_cache
from .loss import label_smoothed_loss
from .models import build_model
from .optim import make_optimizer, noam_lr, set_lr
from .tokenizer import Tokenizer
from .translate import Translator, pick_device

log = logging.getLogger("aiayn")
progress_log = logging.getLogger("aiayn.progress")  # periodic loss lines: train.log only (tqdm shows them)
progress_log.propagate = False


# -- devices and processes -----------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str | None, threads: int, timeout_minutes: float = 60.0) -> Dist:
    """Pick the device; join the process group when started by torchrun (WORLD_SIZE > 1), with
    an explicit time limit for collectives (validation is shared by the ranks, so none waits long)."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    kernel_cache(16)  # token-count batches bring new shapes all the time (linear.py)
    dev = pick_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    if rank != 0:
        log.setLevel(logging.WARNING)  # rank 0 speaks for the run
    return Dist(rank, world, dev)


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# -- one update ----------------------------------------------------------------------------
def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list[tuple[Batch, float]],
               total_tokens: int, cfg: Config, lr: float, world: int, device: torch.device
               ) -> tuple[float, float]:
    """One optimizer update from this rank's micro-batches, each with a weight (0 for a stand-in
    batch that only keeps DDP's collective calls in step). The loss is the label-smoothed sum
    divided by the update's global target-token count. Returns (loss sum, NLL sum) of this rank."""
    model.train()
    loss_total, nll_total = 0.0, 0.0
    for j, (batch, weight) in enumerate(batches):
        batch = batch.to(device)
        sync = j == len(batches) - 1 or not isinstance(model, nn.parallel.DistributedDataParallel)
        with (contextlib.nullcontext() if sync else model.no_sync()):
            with autocast(device, cfg.train.precision):
                logits = model(batch.src, batch.tgt_in)
            loss, nll, _ = label_smoothed_loss(logits, batch.tgt_out, cfg.train.label_smoothing, cfg.model.pad_id)
            # DDP averages gradients over ranks; scaling by world makes that a global-token mean.
            (loss * (weight * world / total_tokens)).backward()
        loss_total += weight * loss.item()
        nll_total += weight * nll.item()
    if cfg.train.clip_norm > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
    set_lr(optimizer, lr)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_total, nll_total


def epoch_batches(data: TokenData, cfg: Config, epoch: int) -> list[np.ndarray]:
    """The epoch's batches in training order; they depend only on (seed, epoch, max_tokens, data)."""
    return make_batches(data.src_lens, data.tgt_lens, cfg.data.max_tokens, cfg.train.seed, epoch)


def shard(group: list[np.ndarray], rank: int, world: int) -> list[tuple[np.ndarray, float]]:
    """This rank's batches of an update (strided), with weight 1. Ranks left short get the
    group's first batch with weight 0, so every rank runs as many forward/backward passes."""
    per_rank = math.ceil(len(group) / world)
    mine = [(b, 1.0) for b in group[rank::world]]
    return mine + [(group[0], 0.0)] * (per_rank - len(mine))


# -- validation ----------------------------------------------------------------------------
@torch.no_grad()
def validate(model: nn.Module, data: TokenData, cfg: Config, device: torch.device, env: Dist | None = None
             ) -> dict[str, float]:
    """Label-smoothed loss, NLL per token and perplexity on the validation split; under DDP each
    rank takes every world-th batch and the sums are all-reduced (collective)."""
    env = env or Dist(device=device)
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)  # loss, NLL, tokens
    for idx in make_batches(data.src_lens, data.tgt_lens, cfg.data.max_tokens, 0, 0)[env.rank::env.world]:
        b = collate(data, idx).to(device)
        with autocast(device, cfg.train.precision):
            logits = model(b.src, b.tgt_in)
        loss, nll, k = label_smoothed_loss(logits, b.tgt_out, cfg.train.label_smoothing, cfg.model.pad_id)
        sums += torch.tensor([loss.item(), nll.item(), k], dtype=torch.float64)
    if env.world > 1:
        sums = sums.to(device)
        dist.all_reduce(sums)
    loss_sum, nll_sum, n = sums.tolist()
    return {"valid_loss": loss_sum / n, "valid_nll": nll_sum / n, "valid_ppl": math.exp(min(nll_sum / n, 50))}


def valid_bleu(model: nn.Module, tokenizer: Tokenizer, src: list[str], ref: list[str], cfg: Config,
               device: torch.device, env: Dist | None = None) -> float:
    """Greedy-search sacreBLEU on validation sentences (cheap enough to run during training);
    under DDP each rank translates every world-th sentence and all gather the translations."""
    env = env or Dist(device=device)
    mine = Translator(model, tokenizer, cfg.decode, device, cfg.train.precision).translate(
        src[env.rank::env.world], beam=1)
    shares: list = [mine]
    if env.world > 1:
        shares = [None] * env.world
        dist.all_gather_object(shares, mine)
    hyps = [""] * len(src)
    for rank, share in enumerate(shares):
        hyps[rank::env.world] = share
    return sacrebleu.corpus_bleu(hyps, [ref]).score



# -- the run directory and the random streams -----------------------------------------------
class Run:
    """A run directory: config.yaml, run.json, train.log, metrics.jsonl, checkpoints/."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"

    def metrics(self, record: dict) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def forget_metrics_after(self, step: int) -> None:
        """Drop metric rows past `step` (written by a process killed before its next checkpoint),
        so the resumed run's rows are not listed twice."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return
        rows = path.read_text().splitlines(keepends=True)
        kept = []
        for row in rows:
            try:
                if json.loads(row).get("step", 0) <= step:
                    kept.append(row)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
        if len(kept) != len(rows):
            atomic_write(path, "".join(kept).encode())

    def latest_state(self) -> Path | None:
        for w in reversed(list_checkpoints(self.path)):
            s = w.with_name(w.name.replace(".safetensors", ".state.pt"))
            if s.exists():
                return s
        return None


def _check_state(saved: object, path: Path) -> None:
    """A training state holds the optimizer, the progress (step, epoch) and the random streams."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: not a training state (a {type(saved).__name__}, not a mapping)")
    missing = [k for k in ("optimizer", "progress", "rng") if k not in saved]
    progress = saved.get("progress")
    if isinstance(progress, dict):
        missing += [f"progress.{k}" for k in ("step", "epoch") if k not in progress]
    elif "progress" not in missing:
        missing.append("progress (not a mapping)")
    if missing:
        raise CheckpointError(f"{path}: incomplete training state, missing {', '.join(missing)}")


def _rank_seed(seed: int, rank: int) -> int:
    """§5.4 dropout differs between ranks: each rank's stream is seeded from (seed, rank)."""
    return int(np.random.SeedSequence([seed, rank, 5]).generate_state(1)[0])


def _rng_state(device: torch.device) -> dict:
    """This process's random streams (dropout draws from torch's generator)."""
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
            "python_pos": random.getstate()[2],
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _set_rng_state(s: dict, device: torch.device) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate((3, tuple(int(x) for x in s["python"]), s["python_pos"]))
    if s.get("cuda") is not None and device.type == "cuda":
        cuda = s["cuda"]
        torch.cuda.set_rng_state(cuda[0] if isinstance(cuda, list) else cuda, device)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


# What fixes the order of the training data: a saved position is exact only while these hold.
_DATA_ORDER = {"max_tokens": "data.max_tokens", "seed": "train.seed", "pairs": "the prepared training pairs"}


# -- the training loop -----------------------------------------------------------------------
class Trainer:
    """§5's loop for one run, in parts that read on their own: set-up (`__init__`, `restore`), one
    update (`update`), validation (`validate`), saving (`save`) and the stop decision (`agree`).

    Progress (`state`) is the data position — epoch and batches consumed in it, so a different
    world size or update_freq continues at exactly the same batch — the step, the elapsed time
    and the best validation scores. Stop and save decisions that depend on a clock or a signal
    are taken collectively, so DDP ranks always leave the loop at the same update.
    """

    def __init__(self, cfg: Config, data_dir: Path, run: Run, env: Dist):
        self.cfg, self.run, self.env = cfg, run, env
        self.data_dir = Path(data_dir)
        self.manifest = load_manifest(data_dir)
        self.tokenizer = Tokenizer.load(str(self.data_dir / "spm.model"))
        cfg.model.vocab_size = len(self.tokenizer)
        cfg.validate()
        self.train_data, self.valid_data = TokenData(data_dir, "train"), TokenData(data_dir, "valid")
        self._batches: tuple[int, list[np.ndarray]] | None = None
        self.per_update = self._batches_per_update()
        self.state: dict = {"step": 0, "epoch": 0, "batch": 0, "elapsed": 0.0, "best_bleu": -1.0,
                            "best_loss": 1e9, "stale": 0, "batching": self.batching()}
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
        self.model = build_model(cfg.model).to(env.device)
        torch.manual_seed(_rank_seed(cfg.train.seed, env.rank))  # a dropout stream per rank
        random.seed(_rank_seed(cfg.train.seed, env.rank))
        self.optimizer = make_optimizer(self.model, cfg.train)
        self.fwd_model: nn.Module = torch.compile(self.model) if cfg.train.compile else self.model
        if env.world > 1:
            self.fwd_model = nn.parallel.DistributedDataParallel(
                self.fwd_model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
        settings = self.manifest["settings"]
        k = cfg.train.valid_bleu_sentences
        self.v_src = (self.data_dir / f"valid.{settings['src']}.txt").read_text().splitlines()[:k]
        self.v_ref = (self.data_dir / f"valid.{settings['tgt']}.txt").read_text().splitlines()[:k]
        self.tb = None  # opened when the loop starts: a refused start leaves the run folder alone
        self.signal: int | None = None  # set by the SIGTERM/SIGINT handler
        self.bar: tqdm | None = None
        self._window = [0.0, 0.0, 0, time.perf_counter()]  # this rank's loss and nll sums, all tokens, start
        self._window_step = 0  # the step the window starts after

    def batching(self) -> dict:
        return {"max_tokens": self.cfg.data.max_tokens, "seed": self.cfg.train.seed,
                "pairs": len(self.train_data), "world": self.env.world, "update_freq": self.cfg.train.update_freq,
                "per_update": self.per_update}

    def _batches_per_update(self) -> int:
        """§5.1: batches in one update. With train.tokens_per_update, the number of this data's
        batches (at data.max_tokens) whose target tokens add up closest to it — the same whatever
        the world size, as ranks share an update's batches; otherwise world × update_freq."""
        t_cfg = self.cfg.train
        if not t_cfg.tokens_per_update:
            return self.env.world * t_cfg.update_freq
        self._batches = (0, epoch_batches(self.train_data, self.cfg, 0))
        mean = float(self.train_data.tgt_lens.sum()) / max(len(self._batches[1]), 1)
        n = max(1, round(t_cfg.tokens_per_update / mean))
        log.info("tokens per update: %d target tokens asked; %d batches of %.0f on average (data.max_tokens %d) "
                 "make %.0f, over %d rank(s)", t_cfg.tokens_per_update, n, mean, self.cfg.data.max_tokens,
                 n * mean, self.env.world)
        if n > len(self._batches[1]):
            log.warning("an update of %d batches is more than an epoch (%d batches): each update is one epoch",
                        n, len(self._batches[1]))
        return n

    # -- set-up ------------------------------------------------------------------------------
    def restore(self, state_path: Path, force_batching: bool = False) -> None:
        """Continue from a checkpoint: weights, optimizer, progress, and every rank's RNG."""
        weights_path = state_path.with_name(state_path.name.replace(".state.pt", ".safetensors"))
        tensors, _ = read_weights(weights_path)
        load_into(self.model, tensors, weights_path)
        saved = load_state(state_path)
        _check_state(saved, state_path)
        try:
            self.optimizer.load_state_dict(saved["optimizer"])
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise CheckpointError(f"{state_path}: the optimizer state does not fit this model ({e})") from None
        progress = dict(saved["progress"])
        was = progress.get("batching", {})
        if "batch" not in progress:  # written before the position counted batches
            progress["batch"] = progress.pop("cursor", 0) * was.get("world", 1) * was.get("update_freq", 1)
        self.state.update({k: v for k, v in progress.items() if k != "batching"})
        self._check_batching(was, state_path, force_batching)
        rngs = saved["rng"] if isinstance(saved["rng"], list) else [saved["rng"]]
        if self.env.rank < len(rngs):
            _set_rng_state(rngs[self.env.rank], self.env.device)
        else:  # more ranks than when the checkpoint was written: a fresh stream for this rank
            torch.manual_seed(_rank_seed(self.cfg.train.seed + self.state["step"], self.env.rank))
        if len(rngs) != self.env.world:
            log.warning("the checkpoint holds the random streams of %d rank(s), this run has %d: "
                        "dropout masks will differ from an uninterrupted run", len(rngs), self.env.world)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", weights_path.name, self.state["step"],
                 self.state["epoch"], self.state["batch"])

    def _check_batching(self, was: dict, state_path: Path, force: bool) -> None:
        now = self.batching()
        changed = [f"{what} was {was[k]} and is now {now[k]}" for k, what in _DATA_ORDER.items()
                   if k in was and was[k] != now[k]]
        if changed and self.state["batch"] > 0:
            if not force:
                raise CheckpointError(
                    f"cannot resume from {state_path}: {'; '.join(changed)}. The saved position (batch "
                    f"{self.state['batch']} of epoch {self.state['epoch']}) has no exact place in the new "
                    "batches. Resume with the old value, or pass --force-batching to continue from the start "
                    "of the next epoch with the new batching")
            log.warning("%s; --force-batching: continuing from the start of epoch %d",
                        "; ".join(changed), self.state["epoch"] + 1)
            self.state["epoch"] += 1
            self.state["batch"] = 0
        g_was = was.get("per_update", was.get("world", 1) * was.get("update_freq", 1))
        if was and g_was != now["per_update"]:
            log.warning("batches per update were %d and are now %d: the data position is the same, each update "
                        "is a different size", g_was, now["per_update"])

    # -- one update --------------------------------------------------------------------------
    def epoch_batches(self) -> list[np.ndarray]:
        epoch = self.state["epoch"]
        if self._batches is None or self._batches[0] != epoch:
            self._batches = (epoch, epoch_batches(self.train_data, self.cfg, epoch))
        return self._batches[1]

    def update(self) -> None:
        """One optimizer update on the epoch's next `per_update` batches, shared by the ranks (Eq. 3 lr)."""
        t_cfg, env, state = self.cfg.train, self.env, self.state
        batches = self.epoch_batches()
        group = batches[state["batch"]:state["batch"] + self.per_update]
        total = int(sum(self.train_data.tgt_lens[b].sum() for b in group))
        mine = [(collate(self.train_data, b), w) for b, w in shard(group, env.rank, env.world)]
        lr = noam_lr(state["step"] + 1, self.cfg.model.d_model, t_cfg.warmup_steps, t_cfg.lr_scale)
        loss, nll = train_step(self.fwd_model, self.optimizer, mine, total, self.cfg, lr, env.world, env.device)
        state["step"] += 1
        state["batch"] += len(group)
        w = self._window
        w[0], w[1], w[2] = w[0] + loss, w[1] + nll, w[2] + total
        if state["step"] % t_cfg.log_every == 0:  # collective under DDP: every rank's losses are summed
            self._log_training(lr)
        if state["batch"] >= len(batches):
            state["epoch"] += 1
            state["batch"] = 0
            log.info("epoch %d done at step %d", state["epoch"], state["step"])

    def _log_training(self, lr: float) -> None:
        """Loss and perplexity per target token of the updates since the last log (all ranks)."""
        loss, nll, tokens, start = self._window
        now = time.perf_counter()
        self._window = [0.0, 0.0, 0, now]
        self._window_step, last_step = self.state["step"], self._window_step
        if self.env.world > 1:
            t = torch.tensor([loss, nll], dtype=torch.float64,
                             device=self.env.device if self.env.device.type == "cuda" else "cpu")
            dist.all_reduce(t)
            loss, nll = t.tolist()
        if not self.env.is_main:
            return
        tok = max(tokens, 1)
        rec = {"step": self.state["step"], "epoch": self.state["epoch"], "lr": lr, "loss": loss / tok,
               "nll": nll / tok, "ppl": math.exp(min(nll / tok, 50)), "tgt_tok_s": tokens / (now - start),
               "elapsed_s": self.state["elapsed"],
               "tgt_tokens_per_update": tokens / max(1, self.state["step"] - last_step)}
        self.run.metrics(rec)
        progress_log.info("step %d epoch %d loss %.4f ppl %.2f lr %.3g %.0f target tok/s %.0f target tokens/update",
                          rec["step"], rec["epoch"], rec["loss"], rec["ppl"], lr, rec["tgt_tok_s"],
                          rec["tgt_tokens_per_update"])
        if self.tb:
            for key in ("lr", "loss", "ppl", "tgt_tok_s"):
                self.tb.add_scalar(f"train/{key}", rec[key], rec["step"])
        if self.bar is not None:
            self.bar.set_postfix(step=rec["step"], loss=f"{rec['loss']:.3f}", lr=f"{lr:.2e}",
                                 tok_s=f"{rec['tgt_tok_s']:.0f}", refresh=False)
            self.bar.refresh()

    # -- validation --------------------------------------------------------------------------
    def validate(self) -> bool:
        """Validation loss/perplexity (and greedy BLEU); True when it is the best so far. Collective:
        every rank validates its share and holds the same result; rank 0 records it."""
        state = self.state
        metrics = validate(self.model, self.valid_data, self.cfg, self.env.device, self.env)
        if self.v_src:
            metrics["valid_bleu"] = valid_bleu(self.model, self.tokenizer, self.v_src, self.v_ref, self.cfg,
                                               self.env.device, self.env)
            better = metrics["valid_bleu"] > state["best_bleu"]
        else:
            better = metrics["valid_loss"] < state["best_loss"]
        state["best_bleu"] = max(state["best_bleu"], metrics.get("valid_bleu", -1))
        state["best_loss"] = min(state["best_loss"], metrics["valid_loss"])
        state["stale"] = 0 if better else state.get("stale", 0) + 1  # validations without improvement
        self._window[3] = time.perf_counter()  # keep tokens/s honest
        if not self.env.is_main:
            return better
        self.run.metrics({"step": state["step"], "epoch": state["epoch"], **metrics})
        log.info("validation step %d: %s", state["step"], " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        if self.tb:
            for key, v in metrics.items():
                self.tb.add_scalar(key, v, state["step"])
        return better

    # -- saving ------------------------------------------------------------------------------
    def save(self, best: bool = False) -> None:
        """Collective: every rank hands its RNG state to rank 0, which writes the checkpoint."""
        rng = _rng_state(self.env.device)
        if self.env.world > 1:
            rngs: list | None = [None] * self.env.world if self.env.is_main else None
            dist.gather_object(rng, rngs, dst=0)
        else:
            rngs = [rng]
        if not self.env.is_main:
            return
        state, run = self.state, self.run
        name = f"step-{state['step']:08d}"
        tensors = model_tensors(self.model)
        save_weights(run.ckpt_dir / f"{name}.safetensors", tensors, self.cfg, self.tokenizer, state["step"])
        save_state(run.ckpt_dir / f"{name}.state.pt",
                   {"optimizer": self.optimizer.state_dict(), "progress": dict(state), "rng": rngs})
        if best:
            save_weights(run.ckpt_dir / "best.safetensors", tensors, self.cfg, self.tokenizer, state["step"])
        for old in list_checkpoints(run.path)[:-self.cfg.train.keep_last]:
            old.unlink(missing_ok=True)
            old.with_name(old.name.replace(".safetensors", ".state.pt")).unlink(missing_ok=True)
        log.info("saved %s", name)

    def save_best(self) -> None:
        """best.safetensors alone (rank 0; weights are the same on every rank)."""
        if self.env.is_main:
            save_weights(self.run.ckpt_dir / "best.safetensors", model_tensors(self.model), self.cfg,
                         self.tokenizer, self.state["step"])
            log.info("saved best.safetensors (step %d)", self.state["step"])

    # -- the stop decision -------------------------------------------------------------------
    def agree(self, save_wish: bool, early_stop: bool = False) -> tuple[bool, bool, bool]:
        """The collective decision after an update: rank 0's clock, save wish and early-stopping
        verdict and every rank's pending signal, shared in one all-reduce. Returns (save now, stop
        for a signal, stop early), the same on every rank; a signal that arrives after the snapshot
        is acted on at the next update."""
        elapsed = time.perf_counter() - self.start
        signalled = float(self.signal is not None)
        if self.env.world > 1:
            main = float(self.env.is_main)
            t = torch.tensor([elapsed * main, float(save_wish) * main, signalled, float(early_stop) * main],
                             dtype=torch.float64, device=self.env.device if self.env.device.type == "cuda" else "cpu")
            dist.all_reduce(t)
            elapsed, save_wish, signalled, early_stop = float(t[0]), bool(t[1] > 0), float(t[2]), bool(t[3] > 0)
        self.state["elapsed"] = elapsed
        stop = signalled > 0
        return save_wish or stop or early_stop, stop, early_stop

    def stopped_early(self) -> bool:
        p = self.cfg.train.patience
        return bool(p and self.state.get("stale", 0) >= p)

    def finished(self) -> bool:
        t_cfg, state = self.cfg.train, self.state
        limit_s = t_cfg.max_minutes * 60
        return bool(state["step"] >= t_cfg.max_steps or (t_cfg.max_epochs and state["epoch"] >= t_cfg.max_epochs)
                    or (limit_s and state["elapsed"] >= limit_s) or self.stopped_early())

    def _on_signal(self, signum, frame) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            if self.env.world == 1:
                raise KeyboardInterrupt  # a second Ctrl-C: stop at once, without a checkpoint
            # Under torchrun it could land inside a collective and leave the other ranks waiting:
            # every rank stops at the next update boundary instead, together.
            log.warning("already stopping at the next update boundary (all ranks together)")
            return
        self.signal = signum  # acted on at the next update boundary

    # -- the loop ----------------------------------------------------------------------------
    def loop(self) -> dict:
        """Update until a limit is reached; on SIGTERM/SIGINT, checkpoint at the update boundary
        (a state that resumes exactly) and raise KeyboardInterrupt."""
        t_cfg, state, env = self.cfg.train, self.state, self.env
        limit_s = t_cfg.max_minutes * 60
        self.bar = tqdm(total=int(limit_s) if limit_s else t_cfg.max_steps, unit="s" if limit_s else "step",
                        disable=not env.is_main, dynamic_ncols=True)
        self.start = time.perf_counter() - state["elapsed"]
        self._window_step = state["step"]
        if env.is_main:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.run.path / "tensorboard"))
            except Exception:  # tensorboard is optional
                self.tb = None
        last_save = time.perf_counter()
        handlers = {}
        if _main_thread():
            handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            validated = saved = False
            while not self.finished():
                self.update()
                validated = saved = False
                better = False
                if t_cfg.valid_every and state["step"] % t_cfg.valid_every == 0:  # collective
                    better, validated = self.validate(), True
                now = time.perf_counter()
                # Interval checkpoints (§6.1) keep their spacing: a better validation score writes
                # best.safetensors only, never a step checkpoint that would push one out of the rotation.
                wish = bool(t_cfg.save_every and state["step"] % t_cfg.save_every == 0) or bool(
                    t_cfg.save_every_minutes and now - last_save >= t_cfg.save_every_minutes * 60)
                early = bool(validated and t_cfg.patience and state["stale"] >= t_cfg.patience)
                save, stop, early = self.agree(wish, early)
                if save:
                    self.save(best=better)
                    last_save, saved = now, True
                elif better:
                    self.save_best()
                if stop:
                    log.warning("stopped by a signal at step %d; checkpoint written", state["step"])
                    raise KeyboardInterrupt
                if early:
                    log.info("early stopping at step %d: %d validations without improvement (train.patience)",
                             state["step"], state["stale"])
                    break
                self.bar.n = int(state["elapsed"]) if limit_s else state["step"]
            better = self.validate() if not validated and not self.stopped_early() else False
            if self.agree(not saved)[0]:
                self.save(best=better)
            elif better:
                self.save_best()
            log.info("finished at step %d, epoch %d, %.1f minutes", state["step"], state["epoch"],
                     state["elapsed"] / 60)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            self.bar.close()
            if self.tb:
                self.tb.close()
        if env.world > 1:
            dist.barrier()
        return state


def _git_commit() -> str | None:
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


def write_provenance(path: Path, data_dir: Path, cfg: Config, env: Dist, resumed: bool, per_update: int) -> None:
    """run.json: where the data is, and how each session of the run was started (command line,
    versions, git commit, device, threads, ranks, tokens per update)."""
    import platform
    import sys

    from . import __version__

    try:
        record = json.loads(path.read_text()) if resumed and path.exists() else {}
    except json.JSONDecodeError:
        record = {}
    record["data_dir"] = str(data_dir.resolve())
    record.setdefault("sessions", []).append({
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "resumed": resumed, "command": sys.argv,
        "aiayn": __version__, "git": _git_commit(), "torch": torch.__version__,
        "python": platform.python_version(), "device": str(env.device),
        "threads": torch.get_num_threads() if env.device.type == "cpu" else None, "world": env.world,
        "update_freq": cfg.train.update_freq, "tokens_per_update": cfg.train.tokens_per_update,
        "batches_per_update": per_update, "max_tokens_per_update": cfg.data.max_tokens * per_update,
    })
    atomic_write(path, json.dumps(record, indent=1).encode())


def _start_run(run: Run, cfg: Config, data_dir: Path, env: Dist, trainer: Trainer, resume: bool,
               resume_from: Path | None, locks: list) -> None:
    """Rank 0, before anything is written: lock the run (one trainer per run), hold the data
    (`prepare` will not replace it meanwhile), clear a killed process's leftovers."""
    locks.append(lock_run(run.path))
    if not resume and (run.path / "config.yaml").exists():
        raise CheckpointError(f"{run.path} already holds a run; continue it with --resume {run.path}")
    try:
        locks.append(hold_data(data_dir))
    except OSError:
        log.debug("could not lock %s for reading", data_dir)
    for stale in run.ckpt_dir.glob(".*.tmp"):  # half-written files of a killed process
        stale.unlink(missing_ok=True)
    if resume_from is None:
        run.forget_metrics_after(0)  # rows of a process killed before its first checkpoint
        cfg.save_yaml(run.path / "config.yaml")
        write_provenance(run.path / "run.json", data_dir, cfg, env, resume is True, trainer.per_update)


def train(cfg: Config | None, data_dir: str | Path | None, run_dir: str | Path, resume: bool = False,
          device: str | None = None, overrides: dict | None = None, force_batching: bool = False) -> dict:
    """Train a model on prepared data (§5); with `resume`, continue run_dir from its last checkpoint.
    Returns the final progress (step, epoch, elapsed seconds, best validation scores)."""
    run = Run(run_dir)
    data_dir = None if data_dir is None else Path(data_dir)
    resume_from = None
    if resume:
        if not (run.path / "config.yaml").is_file() or not (run.path / "run.json").is_file():
            raise CheckpointError(f"{run.path}: not an aiayn run directory (no config.yaml and run.json)")
        from .config import apply_overrides

        cfg = load_yaml(run.path / "config.yaml")
        if "tokens_per_update" not in (yaml.safe_load((run.path / "config.yaml").read_text()).get("train") or {}):
            cfg.train.tokens_per_update = 0  # written before the setting existed: update_freq sized the update
        cfg = apply_overrides(cfg, overrides or {}).validate()
        try:
            meta = json.loads((run.path / "run.json").read_text())
            data_dir = Path(meta["data_dir"]) if data_dir is None else data_dir
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{run.path / 'run.json'}: damaged (no data_dir)") from None
        resume_from = run.latest_state()
        if resume_from is None:
            log.warning("%s has no checkpoint yet; starting from step 0", run.path)
    elif (run.path / "config.yaml").exists() or list_checkpoints(run.path):
        raise CheckpointError(f"{run.path} already holds a run; continue it with --resume {run.path}, "
                              "or choose another run directory")
    if cfg is None or data_dir is None:
        raise ValueError("a config and a prepared data directory (--data) are required")
    env = setup(device, cfg.train.threads, cfg.train.dist_timeout_minutes)
    trainer = Trainer(cfg, Path(data_dir), run, env)
    handler, locks = None, []
    try:
        if env.is_main:
            _start_run(run, cfg, Path(data_dir), env, trainer, resume, resume_from, locks)
            handler = logging.FileHandler(run.path / "train.log")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            log.addHandler(handler)
            progress_log.addHandler(handler)
            progress_log.setLevel(logging.INFO)
            if log.getEffectiveLevel() > logging.INFO:
                log.setLevel(logging.INFO)
        if resume_from is not None:
            trainer.restore(resume_from, force_batching)
            if env.is_main:  # only once the checkpoint proved good: a refused resume changes nothing
                run.forget_metrics_after(trainer.state["step"])
                cfg.save_yaml(run.path / "config.yaml")
                write_provenance(run.path / "run.json", Path(data_dir), cfg, env, True, trainer.per_update)
        n_params = sum(p.numel() for p in trainer.model.parameters())
        log.info("model: %.2fM parameters, vocabulary %d, device %s, world %d, precision %s",
                 n_params / 1e6, cfg.model.vocab_size, env.device, env.world, cfg.train.precision)
        return trainer.loop()
    finally:
        if handler is not None:
            log.removeHandler(handler)
            progress_log.removeHandler(handler)
            handler.close()
        for lock in locks:
            lock.release()
