"""The training loop (§5): token-count batches, Adam + Eq. 3, label smoothing, checkpoints, DDP.

One code path for one process and for `torchrun` (PyTorch DDP): every rank builds the same batch order
from (seed, epoch), takes its share of each update's batches, and normalizes its loss by the update's
global target-token count, so N ranks compute exactly the update that one process would on all their
batches. Validation is shared by the ranks; only rank 0 logs and writes checkpoints.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from ..checkpoint import (
    link_last,
    list_checkpoints,
    model_tensors,
    save_state,
    save_weights,
)
from ..config import Config, ConfigError
from ..data.batches import TokenData, collate
from ..data.prepare import load_manifest, read_text
from ..data.tokenizer import load_tokenizer
from ..parsing.model import attach_tagger, build_any
from ..parsing.tagger import Tagger, tagger_text
from ..progress import bar
from . import guided
from .optim import learning_rate, make_optimizer
from .processes import Dist, main_thread
from .run_folder import Run, progress_log
from .scaling import LossScaler
from .state import LossWindow, Progress, rng_state, seed_rank
from .step import bucketed, compile_model, epoch_batches, shard, train_step, valid_bleu, validate

log = logging.getLogger("aiayn")

# -- the training loop -----------------------------------------------------------------------
class Trainer:
    """§5's loop for one run, in parts that read on their own: set-up (`__init__`; resume.py's `restore`), one
    update (`update`), validation (`validate`), saving (`save`) and the stop decision (`agree`).

    Progress (`progress`, runs.Progress) is the data position — epoch and batches consumed in it, so a different
    world size or update_freq continues at exactly the same batch — the step, the elapsed time
    and the best validation scores. Stop and save decisions that depend on a clock or a signal
    are taken collectively, so DDP ranks always leave the loop at the same update.
    """

    def __init__(self, cfg: Config, data_dir: Path, run: Run, env: Dist):
        self.cfg, self.run, self.env = cfg, run, env
        self.data_dir = Path(data_dir)
        self._read_vocabulary()
        self._build_model()
        self._open_data()
        self._set_up_updates()
        self._read_task()
        self.tb = None  # opened when the loop starts: a refused start leaves the run folder alone
        self.signal: int | None = None  # set by the SIGTERM/SIGINT handler
        self.bar: tqdm | None = None
        self.window = LossWindow()

    def _read_vocabulary(self) -> None:
        """The prepared folder's manifest and SentencePiece model; the config checked against them."""
        self.manifest = load_manifest(self.data_dir)
        self.tokenizer = load_tokenizer(str(self.data_dir / "spm.model"))
        if self.cfg.model.vocab_size != len(self.tokenizer):  # set from the data before (training.train)
            raise ConfigError(f"model.vocab_size {self.cfg.model.vocab_size}, {self.data_dir}'s "
                              f"{len(self.tokenizer)} pieces")
        self.cfg.validate()

    def _build_model(self) -> None:
        torch.manual_seed(self.cfg.train.seed)  # the same initial weights on every rank
        self.model = build_any(self.cfg.model, self.tokenizer.pieces_list()).to(self.env.device)

    def _open_data(self) -> None:
        """The token arrays (§5.1), the batches of an update and where the run stands."""
        tags = self.cfg.model.tag_input  # §6.3 option: part-of-speech tags beside the words (tagger.py)
        self.train_data = TokenData(self.data_dir, "train", tags)
        self.valid_data = TokenData(self.data_dir, "valid", tags)
        if self.train_data.corpora is not None:  # prepare --synthetic: what an epoch draws (data/mixing.py)
            labels, weights = self.train_data.corpora
            listed = self.manifest["settings"].get("corpora")
            listed = listed if isinstance(listed, list) else []
            names = [str(c.get("name")) if isinstance(c, dict) else "?" for c in listed]
            log.info("training corpora, weighted: %s", ", ".join(
                f"{names[k] if k < len(names) else k} {int((labels == k).sum()):,} pairs x {w:g}"
                for k, w in enumerate(weights.tolist())))
        self._batches: tuple[int, list[np.ndarray]] | None = None
        self.per_update = self._batches_per_update()
        self.progress = Progress(batching=self.batching())

    def _set_up_updates(self) -> None:
        """What an update needs (§5.3): guided alignment, each rank's dropout stream, Adam, the loss
        scaler, and the forward model (compiled, wrapped for DDP)."""
        cfg, env = self.cfg, self.env
        guided.setup(cfg, self.model, self.train_data, self.tokenizer)  # train.guided_alignment (off: nothing)
        seed_rank(cfg.train.seed, env.rank)  # a dropout stream per rank
        self.optimizer = make_optimizer(self.model, cfg.train)
        self.scaler = LossScaler(env.device, cfg.train.precision)  # fp16: dynamic loss scaling; else a plain step
        self.fwd_model: nn.Module = compile_model(self.model) if cfg.train.compile else self.model
        if env.world > 1:
            self.fwd_model = nn.parallel.DistributedDataParallel(
                self.fwd_model, device_ids=[env.device.index] if env.device.type == "cuda" else None)

    def _read_task(self) -> None:
        """What the checkpoints say of the task (§6.3 models), the tagger a parser carries, and the
        validation sentences BLEU is measured on."""
        settings = self.manifest["settings"]
        self.task = {k: settings[k] for k in ("task", "linearization") if k in settings}  # §6.3 models say so
        if "task" not in settings and "src" in settings and "tgt" in settings:  # the pair, for the server's page
            self.task["languages"] = {"src": str(settings["src"]), "tgt": str(settings["tgt"])}
        if self.cfg.model.tag_input:  # checkpoints carry the tagger, so a parser tags its own input
            self.task["tagger"] = tagger_text(self.data_dir)
            attach_tagger(self.model, Tagger.from_json(self.task["tagger"]), self.tokenizer)
        k = self.cfg.train.valid_bleu_sentences
        directions = settings.get("directions")  # many directions (data/directions.py): BLEU for each
        if isinstance(directions, list) and directions:
            self.task["directions"] = [str(d) for d in directions]
        elif self.cfg.model.lang_tag == "decoder":
            raise ConfigError("model.lang_tag decoder reads the target-language tag each source starts with: "
                              f"{self.data_dir} is one direction's data (prepare several with --pairs)")
        self.v_sets: dict[str, tuple[list[str], list[str]]] = {}
        for d in self.task.get("directions", [""]):
            split = f"valid.{d}" if d else "valid"
            src = read_text(self.data_dir, split, "src", self.manifest)[:k]
            if d:  # the validation sources asked for their direction's target (its tag first)
                src = [f"{self.tokenizer.tag(d.rpartition('-')[2])} {x}" for x in src]
            self.v_sets[d] = (src, read_text(self.data_dir, split, "tgt", self.manifest)[:k])

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

    # -- one update --------------------------------------------------------------------------
    def epoch_batches(self) -> list[np.ndarray]:
        epoch = self.progress.epoch
        if self._batches is None or self._batches[0] != epoch:
            self._batches = (epoch, epoch_batches(self.train_data, self.cfg, epoch))
        return self._batches[1]

    def update(self) -> None:
        """One optimizer update on the epoch's next `per_update` batches, shared by the ranks (Eq. 3 lr)."""
        t_cfg, env, state = self.cfg.train, self.env, self.progress
        batches = self.epoch_batches()
        group = batches[state.batch:state.batch + self.per_update]
        total = int(sum(self.train_data.tgt_lens[b].sum() for b in group))
        mine = [(collate(self.train_data, b, bucketed(self.cfg)), w) for b, w in shard(group, env.rank, env.world)]
        lr = learning_rate(state.step + 1, self.cfg.model.d_model, t_cfg)
        loss, nll = train_step(self.fwd_model, self.optimizer, mine, total, self.cfg, lr, env.world, env.device,
                               self.scaler)
        state.step += 1
        state.batch += len(group)
        self.window.add(loss, nll, total)
        if state.step % t_cfg.log_every == 0:  # collective under DDP: every rank's losses are summed
            self._log_training(lr)
        if state.batch >= len(batches):
            state.epoch += 1
            state.batch = 0
            log.info("epoch %d done at step %d", state.epoch, state.step)

    def _log_training(self, lr: float) -> None:
        """Loss and perplexity per target token of the updates since the last log (all ranks)."""
        (loss, nll, tokens, seconds), last_step = self.window.sums(), self.window.step
        self.window = LossWindow(self.progress.step)
        if self.env.world > 1:
            t = torch.tensor([loss, nll], dtype=torch.float64,
                             device=self.env.device if self.env.device.type == "cuda" else "cpu")
            dist.all_reduce(t)
            loss, nll = t.tolist()
        if not self.env.is_main:
            return
        tok = max(tokens, 1)
        rec = {"step": self.progress.step, "epoch": self.progress.epoch, "lr": lr, "loss": loss / tok,
               "nll": nll / tok, "ppl": math.exp(min(nll / tok, 50)), "tgt_tok_s": tokens / seconds,
               "elapsed_s": self.progress.elapsed,
               "tgt_tokens_per_update": tokens / max(1, self.progress.step - last_step)}
        self.run.metrics(rec)
        progress_log.info("step %d epoch %d loss %.4f ppl %.2f lr %.3g %.0f target tok/s %.0f target tokens/update",
                          rec["step"], rec["epoch"] + 1, rec["loss"], rec["ppl"], lr, rec["tgt_tok_s"],
                          rec["tgt_tokens_per_update"])
        if self.tb:
            for key in ("lr", "loss", "ppl", "tgt_tok_s"):
                self.tb.add_scalar(f"train/{key}", rec[key], rec["step"])
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{rec['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{rec['tgt_tok_s']:.0f}",
                                 refresh=False)  # shown at the bar's next redraw, by time

    # -- validation --------------------------------------------------------------------------
    def validate(self) -> bool:
        """Validation loss/perplexity (and greedy BLEU); True when it is the best so far. Collective:
        every rank validates its share and holds the same result; rank 0 records it."""
        state, began = self.progress, time.perf_counter()
        metrics = validate(self.model, self.valid_data, self.cfg, self.env.device, self.env)
        if any(src for src, _ in self.v_sets.values()):
            scores = {d: valid_bleu(self.model, self.tokenizer, src, ref, self.cfg, self.env.device, self.env)
                      for d, (src, ref) in self.v_sets.items()}
            if len(scores) > 1 or "" not in scores:  # many directions: each, and their mean decides
                metrics.update({f"valid_bleu_{d}": v for d, v in scores.items()})
            metrics["valid_bleu"] = sum(scores.values()) / len(scores)
            better = metrics["valid_bleu"] > state.best_bleu
        else:
            better = metrics["valid_loss"] < state.best_loss
        state.best_bleu = max(state.best_bleu, metrics.get("valid_bleu", -1))
        state.best_loss = min(state.best_loss, metrics["valid_loss"])
        state.stale = 0 if better else state.stale + 1  # validations without improvement
        state.validated_at = state.step
        self.window.pause(time.perf_counter() - began)
        if not self.env.is_main:
            return better
        self.run.metrics({"step": state.step, "epoch": state.epoch, **metrics})
        log.info("validation step %d: %s", state.step, " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        if self.tb:
            for key, v in metrics.items():
                self.tb.add_scalar(key, v, state.step)
        return better

    # -- saving ------------------------------------------------------------------------------
    def save(self, best: bool = False) -> None:
        """Collective: every rank hands its RNG state to rank 0, which writes the checkpoint."""
        self.progress.saved_at = self.progress.step
        mine = (rng_state(self.env.device), self.window.sums())
        if self.env.world > 1:
            ranks: list | None = [None] * self.env.world if self.env.is_main else None
            dist.gather_object(mine, ranks, dst=0)
        else:
            ranks = [mine]
        if not self.env.is_main:
            return
        rngs = [r[0] for r in ranks]
        window = {"step": self.window.step, "ranks": [r[1] for r in ranks]}
        state, run = self.progress, self.run
        name = f"step-{state.step:08d}"
        tensors = model_tensors(self.model)
        save_weights(run.ckpt_dir / f"{name}.safetensors", tensors, self.cfg, self.tokenizer, state.step,
                     self.task)
        save_state(run.ckpt_dir / f"{name}.state.pt",
                   {"optimizer": self.optimizer.state_dict(), "progress": state.to_dict(), "rng": rngs,
                    "window": window, "scaler": self.scaler.state_dict()})
        if best:
            save_weights(run.ckpt_dir / "best.safetensors", tensors, self.cfg, self.tokenizer, state.step,
                         self.task)
        link_last(run.ckpt_dir / f"{name}.safetensors")
        for old in list_checkpoints(run.path)[:-self.cfg.train.keep_last]:
            old.unlink(missing_ok=True)
            old.with_name(old.name.replace(".safetensors", ".state.pt")).unlink(missing_ok=True)
        log.info("saved %s", name)

    def save_best(self) -> None:
        """best.safetensors alone (rank 0; weights are the same on every rank)."""
        if self.env.is_main:
            save_weights(self.run.ckpt_dir / "best.safetensors", model_tensors(self.model), self.cfg,
                         self.tokenizer, self.progress.step, self.task)
            log.info("saved best.safetensors (step %d)", self.progress.step)

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
        self.progress.elapsed = elapsed
        stop = signalled > 0
        return save_wish or stop or early_stop, stop, early_stop

    def made(self, what: str) -> bool:
        """Whether this step's validation ("validated_at") or checkpoint ("saved_at") is made."""
        return getattr(self.progress, what) == self.progress.step

    def stopped_early(self) -> bool:
        p = self.cfg.train.patience
        return bool(p and self.progress.stale >= p)

    def finished(self) -> bool:
        t_cfg, state = self.cfg.train, self.progress
        limit_s = t_cfg.max_minutes * 60
        return bool(state.step >= t_cfg.max_steps or (t_cfg.max_epochs and state.epoch >= t_cfg.max_epochs)
                    or (limit_s and state.elapsed >= limit_s) or self.stopped_early())

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
        t_cfg, state, env = self.cfg.train, self.progress, self.env
        limit_s = t_cfg.max_minutes * 60
        self.bar = bar(int(limit_s) if limit_s else t_cfg.max_steps, "s" if limit_s else "update", "training",
                       env.is_main, int(state.elapsed) if limit_s else state.step)
        self.start = time.perf_counter() - state.elapsed
        self.tb = self.run.tensorboard() if env.is_main else None
        last_save = time.perf_counter()
        handlers = {}
        if main_thread():
            handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not self.finished():
                self.update()
                better = False
                if t_cfg.valid_every and state.step % t_cfg.valid_every == 0:  # collective
                    better = self.validate()
                now = time.perf_counter()
                # Interval checkpoints (§6.1) keep their spacing: a better validation score writes
                # best.safetensors only, never a step checkpoint that would push one out of the rotation.
                wish = bool(t_cfg.save_every and state.step % t_cfg.save_every == 0) or bool(
                    t_cfg.save_every_minutes and now - last_save >= t_cfg.save_every_minutes * 60)
                early = bool(self.made("validated_at") and t_cfg.patience and state.stale >= t_cfg.patience)
                save, stop, early = self.agree(wish, early)
                if save:
                    self.save(best=better)
                    last_save = now
                elif better:
                    self.save_best()
                if stop:
                    log.warning("stopped by a signal at step %d; checkpoint written", state.step)
                    raise KeyboardInterrupt
                if early:
                    log.info("early stopping at step %d: %d validations without improvement (train.patience)",
                             state.step, state.stale)
                    break
                self.bar.update((int(state.elapsed) if limit_s else state.step) - self.bar.n)  # redrawn by time
            # the last step's validation and checkpoint, unless made already: by this process, or by the one
            # that wrote the checkpoint a finished run resumes from (such a resume then changes nothing)
            better = self.validate() if not self.made("validated_at") and not self.stopped_early() else False
            if self.agree(not self.made("saved_at"))[0]:
                self.save(best=better)
            elif better:
                self.save_best()
            log.info("finished at step %d (%d full pass%s over the training data), %.1f minutes", state.step,
                     state.epoch, "es" * (state.epoch != 1), state.elapsed / 60)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            self.bar.close()
            if self.tb:
                self.tb.close()
        if env.world > 1:
            dist.barrier()
        return state.to_dict()
