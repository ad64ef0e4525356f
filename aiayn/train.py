"""The training loop (§5): token-count batches, Adam + Eq. 3, label smoothing, checkpoints, DDP.

One code path for one process and for `torchrun` (PyTorch DDP): every rank builds the same
batch order from (seed, epoch), takes its share of each update's batches, and normalizes its
loss by the update's global target-token count, so N ranks compute exactly the update that one
process would on all their batches. Only rank 0 logs, validates and writes checkpoints.
"""

from __future__ import annotations

import contextlib
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
from .loss import label_smoothed_loss
from .model import Transformer
from .optim import make_optimizer, noam_lr, set_lr
from .tokenizer import Tokenizer
from .translate import Translator

log = logging.getLogger("aiayn")


# -- devices and processes -----------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str | None, threads: int) -> Dist:
    """Pick the device; join the process group when started by torchrun (WORLD_SIZE > 1)."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda asked for, but CUDA is not available")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
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


def update_groups(data: TokenData, cfg: Config, epoch: int, world: int) -> list[list[np.ndarray]]:
    """The epoch's batches, grouped per update: world × update_freq batches each."""
    batches = make_batches(data.src_lens, data.tgt_lens, cfg.data.max_tokens, cfg.train.seed, epoch)
    g = world * cfg.train.update_freq
    return [batches[i:i + g] for i in range(0, len(batches), g)]


def shard(group: list[np.ndarray], rank: int, world: int) -> list[tuple[np.ndarray, float]]:
    """This rank's batches of an update (strided), with weight 1. Ranks left short get the
    group's first batch with weight 0, so every rank runs as many forward/backward passes."""
    per_rank = math.ceil(len(group) / world)
    mine = [(b, 1.0) for b in group[rank::world]]
    return mine + [(group[0], 0.0)] * (per_rank - len(mine))


# -- validation ----------------------------------------------------------------------------
@torch.no_grad()
def validate(model: Transformer, data: TokenData, cfg: Config, device: torch.device) -> dict[str, float]:
    """Label-smoothed loss, NLL per token and perplexity on the validation split."""
    model.eval()
    loss_sum = nll_sum = 0.0
    n = 0
    for idx in make_batches(data.src_lens, data.tgt_lens, cfg.data.max_tokens, 0, 0):
        b = collate(data, idx).to(device)
        with autocast(device, cfg.train.precision):
            logits = model(b.src, b.tgt_in)
        loss, nll, k = label_smoothed_loss(logits, b.tgt_out, cfg.train.label_smoothing, cfg.model.pad_id)
        loss_sum, nll_sum, n = loss_sum + loss.item(), nll_sum + nll.item(), n + k
    return {"valid_loss": loss_sum / n, "valid_nll": nll_sum / n, "valid_ppl": math.exp(min(nll_sum / n, 50))}


def valid_bleu(model: Transformer, tokenizer: Tokenizer, src: list[str], ref: list[str], cfg: Config,
               device: torch.device) -> float:
    """Greedy-search sacreBLEU on validation sentences (cheap enough to run during training)."""
    hyps = Translator(model, tokenizer, cfg.decode, device, cfg.train.precision).translate(src, beam=1)
    return sacrebleu.corpus_bleu(hyps, [ref]).score


# -- the run -------------------------------------------------------------------------------
class Run:
    """A run directory: config.yaml, train.log, metrics.jsonl, checkpoints/."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"

    def metrics(self, record: dict) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def latest_state(self) -> Path | None:
        for w in reversed(list_checkpoints(self.path)):
            s = w.with_name(w.name.replace(".safetensors", ".state.pt"))
            if s.exists():
                return s
        return None


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
            "python_pos": random.getstate()[2],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate((3, tuple(int(x) for x in s["python"]), s["python_pos"]))
    if s.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def train(cfg: Config, data_dir: Path | None, run_dir: Path, resume: bool = False,
          device: str | None = None, overrides: dict | None = None) -> dict:
    """Train a model on prepared data; with `resume`, continue run_dir from its last checkpoint."""
    run = Run(run_dir)
    state: dict = {"step": 0, "epoch": 0, "cursor": 0, "elapsed": 0.0, "best_bleu": -1.0, "best_loss": 1e9}
    resume_from = None
    if resume:
        if not (run.path / "config.yaml").exists():
            raise CheckpointError(f"{run.path}: not a run directory (no config.yaml)")
        from .config import apply_overrides

        cfg = apply_overrides(load_yaml(run.path / "config.yaml"), overrides or {}).validate()
        meta = json.loads((run.path / "run.json").read_text())
        data_dir = Path(meta["data_dir"]) if data_dir is None else data_dir
        resume_from = run.latest_state()
        if resume_from is None:
            log.warning("%s has no checkpoint yet; starting from step 0", run.path)
    if data_dir is None:
        raise ValueError("a prepared data directory is required (--data)")
    env = setup(device, cfg.train.threads)
    manifest = load_manifest(data_dir)
    tokenizer = Tokenizer.load(str(Path(data_dir) / "spm.model"))
    cfg.model.vocab_size = len(tokenizer)
    cfg.validate()
    if env.is_main:
        run.path.mkdir(parents=True, exist_ok=True)
        cfg.save_yaml(run.path / "config.yaml")
        (run.path / "run.json").write_text(json.dumps({"data_dir": str(Path(data_dir).resolve())}))
        handler = logging.FileHandler(run.path / "train.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        if log.getEffectiveLevel() > logging.INFO:
            log.setLevel(logging.INFO)

    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    model = Transformer(cfg.model).to(env.device)
    optimizer = make_optimizer(model, cfg.train)
    if resume_from is not None:
        weights_path = resume_from.with_name(resume_from.name.replace(".state.pt", ".safetensors"))
        tensors, _ = read_weights(weights_path)
        load_into(model, tensors, weights_path)
        saved = load_state(resume_from)
        optimizer.load_state_dict(saved["optimizer"])
        state.update(saved["progress"])
        _set_rng_state(saved["rng"])
        log.info("resumed from %s at step %d (epoch %d, update %d)", weights_path.name, state["step"],
                 state["epoch"], state["cursor"])
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %.2fM parameters, vocabulary %d, device %s, world %d, precision %s",
             n_params / 1e6, cfg.model.vocab_size, env.device, env.world, cfg.train.precision)
    fwd_model: nn.Module = model
    if cfg.train.compile:
        fwd_model = torch.compile(model)
    if env.world > 1:
        fwd_model = nn.parallel.DistributedDataParallel(
            fwd_model, device_ids=[env.device.index] if env.device.type == "cuda" else None)

    train_data, valid_data = TokenData(data_dir, "train"), TokenData(data_dir, "valid")
    src_lang, tgt_lang = manifest["settings"]["src"], manifest["settings"]["tgt"]
    v_src = (Path(data_dir) / f"valid.{src_lang}.txt").read_text().splitlines()
    v_ref = (Path(data_dir) / f"valid.{tgt_lang}.txt").read_text().splitlines()
    k = cfg.train.valid_bleu_sentences
    v_src, v_ref = v_src[:k], v_ref[:k]
    tb = None
    if env.is_main:
        try:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(str(run.path / "tensorboard"))
        except Exception:  # tensorboard is optional
            tb = None

    def save(tag_best: bool = False) -> None:
        if not env.is_main:
            return
        name = f"step-{state['step']:08d}"
        tensors = model_tensors(model)
        save_weights(run.ckpt_dir / f"{name}.safetensors", tensors, cfg, tokenizer, state["step"])
        save_state(run.ckpt_dir / f"{name}.state.pt",
                   {"optimizer": optimizer.state_dict(), "progress": dict(state), "rng": _rng_state()})
        if tag_best:
            save_weights(run.ckpt_dir / "best.safetensors", tensors, cfg, tokenizer, state["step"])
        for old in list_checkpoints(run.path)[:-cfg.train.keep_last]:
            old.unlink(missing_ok=True)
            old.with_name(old.name.replace(".safetensors", ".state.pt")).unlink(missing_ok=True)
        log.info("saved %s", name)

    def run_validation() -> bool:
        metrics = validate(model, valid_data, cfg, env.device)
        if v_src:
            metrics["valid_bleu"] = valid_bleu(model, tokenizer, v_src, v_ref, cfg, env.device)
        better = (metrics.get("valid_bleu", -1) > state["best_bleu"]) if v_src else \
            metrics["valid_loss"] < state["best_loss"]
        state["best_bleu"] = max(state["best_bleu"], metrics.get("valid_bleu", -1))
        state["best_loss"] = min(state["best_loss"], metrics["valid_loss"])
        record = {"step": state["step"], "epoch": state["epoch"], **metrics}
        run.metrics(record)
        log.info("validation step %d: %s", state["step"],
                 " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        if tb:
            for key, v in metrics.items():
                tb.add_scalar(key, v, state["step"])
        return better

    t_cfg = cfg.train
    limit_s = t_cfg.max_minutes * 60
    bar = tqdm(total=int(limit_s) if limit_s else t_cfg.max_steps, initial=0,
               unit="s" if limit_s else "step", disable=not env.is_main, dynamic_ncols=True)
    start = time.perf_counter() - state["elapsed"]
    last_save_time = time.perf_counter()
    window_tokens, window_start = 0, time.perf_counter()
    loss_acc = nll_acc = tok_acc = 0.0

    def done() -> bool:
        return (state["step"] >= t_cfg.max_steps or (t_cfg.max_epochs and state["epoch"] >= t_cfg.max_epochs)
                or (limit_s and state["elapsed"] >= limit_s))

    def on_sigterm(signum, frame):  # a scheduler's kill: checkpoint like Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm) if _main_thread() else None
    try:
        while not done():
            groups = update_groups(train_data, cfg, state["epoch"], env.world)
            while state["cursor"] < len(groups) and not done():
                group = groups[state["cursor"]]
                total = int(sum(train_data.tgt_lens[b].sum() for b in group))
                mine = [(collate(train_data, b), w) for b, w in shard(group, env.rank, env.world)]
                lr = noam_lr(state["step"] + 1, cfg.model.d_model, t_cfg.warmup_steps, t_cfg.lr_scale)
                loss, nll = train_step(fwd_model, optimizer, mine, total, cfg, lr, env.world, env.device)
                state["step"] += 1
                state["cursor"] += 1
                state["elapsed"] = time.perf_counter() - start
                loss_acc, nll_acc, tok_acc = loss_acc + loss, nll_acc + nll, tok_acc + total / env.world
                window_tokens += total
                if env.is_main:
                    bar.n = int(state["elapsed"]) if limit_s else state["step"]
                if env.is_main and state["step"] % t_cfg.log_every == 0:
                    now = time.perf_counter()
                    tok_s = window_tokens / (now - window_start)
                    rec = {"step": state["step"], "epoch": state["epoch"], "lr": lr, "loss": loss_acc / tok_acc,
                           "nll": nll_acc / tok_acc, "ppl": math.exp(min(nll_acc / tok_acc, 50)),
                           "tgt_tok_s": tok_s, "elapsed_s": state["elapsed"]}
                    run.metrics(rec)
                    if tb:
                        for key in ("lr", "loss", "ppl", "tgt_tok_s"):
                            tb.add_scalar(f"train/{key}", rec[key], state["step"])
                    bar.set_postfix(step=state["step"], loss=f"{rec['loss']:.3f}", lr=f"{lr:.2e}",
                                    tok_s=f"{tok_s:.0f}", refresh=False)
                    bar.refresh()
                    loss_acc = nll_acc = tok_acc = 0.0
                    window_tokens, window_start = 0, now
                better = False
                if env.is_main and t_cfg.valid_every and state["step"] % t_cfg.valid_every == 0:
                    better = run_validation()
                    window_tokens, window_start = 0, time.perf_counter()  # keep tok/s honest
                now = time.perf_counter()
                if env.is_main and ((t_cfg.save_every and state["step"] % t_cfg.save_every == 0) or better or (
                        t_cfg.save_every_minutes and now - last_save_time >= t_cfg.save_every_minutes * 60)):
                    save(tag_best=better)
                    last_save_time = now
            if state["cursor"] >= len(groups):
                state["epoch"] += 1
                state["cursor"] = 0
                log.info("epoch %d done at step %d", state["epoch"], state["step"])
        bar.close()
        if env.is_main:
            validated = t_cfg.valid_every and state["step"] % t_cfg.valid_every == 0
            better = False if validated else run_validation()
            if better or not (run.ckpt_dir / f"step-{state['step']:08d}.safetensors").exists():
                save(tag_best=better)
        log.info("finished at step %d, epoch %d, %.1f minutes", state["step"], state["epoch"],
                 state["elapsed"] / 60)
    except KeyboardInterrupt:
        log.warning("interrupted at step %d; writing a checkpoint", state["step"])
        save()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        bar.close()
        if tb:
            tb.close()
        if env.is_main:
            log.removeHandler(handler)
            handler.close()
    if env.world > 1:
        dist.barrier()
    return state
