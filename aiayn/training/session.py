"""`aiayn train` (§5): start a run or resume one, in one process or under torchrun."""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from ..checkpoint import CheckpointError, DamagedState, list_checkpoints, load_into, read_meta, read_weights
from ..config import Config
from ..data.prepare import check_vocabulary, load_manifest, vocabulary_size
from ..device import TRAIN_PRECISIONS, cpu_label, inductor_cache, resolve_precision
from ..files import hold_data, lock_run, read_json
from ..overrides import apply_overrides, load_yaml
from .processes import Dist, cpu_paths, leave, setup
from .resume import restore
from .run_folder import Run, progress_log, record_start
from .trainer import Trainer

log = logging.getLogger("aiayn")


def _start_run(run: Run, data_dir: Path, resume: bool, locks: list) -> None:
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


def _record_run(run: Run, cfg: Config, data_dir: Path, env: Dist, trainer: Trainer, resume: bool,
                resume_from: Path | None, why: str) -> None:
    """Rank 0, once the weights are in place (a refused resume changes nothing): the metrics after
    the checkpoint dropped (none before the first), then config.yaml and a session in run.json."""
    if resume_from is None:
        run.forget_metrics_after(0)  # rows of a process killed before its first checkpoint
    else:
        old = trainer.progress.saved_at is None  # a checkpoint that does not say whether it was validated
        run.forget_metrics_after(trainer.progress.step, validated=old or trainer.made("validated_at"))
    record_start(run, data_dir, cfg, env, resume is True, trainer.per_update, why)


def _precision(cfg: Config, env: Dist, resumed: Path | None) -> str:
    """The run's precision, chosen once: `auto` resolves by what this device computes natively
    (device.resolve_precision) when the run starts; a resumed run keeps the precision it started
    with (in its config.yaml, `resumed`) so that it continues bit for bit, and says so in one
    line where this device cannot run it natively. Returns the reason, for the log and run.json."""
    asked, saved = cfg.train.precision, None
    if resumed is not None:
        saved = (yaml.safe_load(resumed.read_text()).get("train") or {}).get("precision")
    if saved in ("fp32", "bf16") and asked in ("auto", saved):
        cfg.train.precision = saved
        why = resolve_precision(saved, env.device, choices=TRAIN_PRECISIONS)[1]
        return "kept from the run's start" + ("" if why == "asked for" else why.removeprefix("asked for"))
    cfg.train.precision, why = resolve_precision(asked, env.device, choices=TRAIN_PRECISIONS)
    return why


def _log_setup(trainer: Trainer, cfg: Config, env: Dist, why: str) -> None:
    """The model's size and where it runs, the precision and why; on a CPU, the kernels its flags lead to."""
    n_params = sum(p.numel() for p in trainer.model.parameters())
    log.info("model: %.2fM parameters, vocabulary %d, device %s, world %d, precision %s (%s)",
             n_params / 1e6, cfg.model.vocab_size, env.device, env.world, cfg.train.precision, why)
    if env.device.type == "cpu":
        log.info("CPU: %s; kernels: %s", cpu_label(), cpu_paths(cfg.train.precision))
    if "emulated" in why:
        log.warning("training in %s: %s", cfg.train.precision, why)


def resolve_lang_tag(cfg: Config, data_dir: Path) -> None:
    """model.lang_tag auto, for a new run: the decoder reads the target-language tag when the data
    holds several directions (measured better on validation: bench/multilingual/tag_side.py), the
    source otherwise, and for a fine-tuned model (its weights learned it in the source)."""
    m = cfg.model
    if m.lang_tag != "auto":
        return
    directions = load_manifest(data_dir)["settings"].get("directions")
    many = isinstance(directions, list) and len(directions) > 0
    m.lang_tag = "decoder" if many and m.arch == "transformer" and not m.parser_inputs and not cfg.train.init_from \
        else "source"
    if many:
        log.info("model.lang_tag auto -> %s: %s", m.lang_tag, "the decoder starts from each pair's target-language "
                 "tag" if m.lang_tag == "decoder" else "the tag stays the source's first token")


def _parent(cfg: Config, data_dir: Path) -> dict:
    """Fine-tuning (train.init_from): the checkpoint's weights; its model config becomes the run's,
    and the data must be in its vocabulary (`prepare --tokenizer-from` it)."""
    path = Path(cfg.train.init_from)
    tensors, meta = read_weights(path)
    parent_cfg, tokenizer = read_meta(meta, path)
    check_vocabulary(tokenizer.proto, data_dir)
    cfg.model = parent_cfg.model
    log.info("starting from %s (step %s): its model (%.2fM parameters) and weights", path, meta.get("step", "?"),
             sum(t.numel() for t in tensors.values()) / 1e6)
    return tensors


def _resumed(run: Run, data_dir: Path | None, overrides: dict | None) -> tuple[Config, Path | None, Path | None]:
    """A run to resume: its config (with `overrides`), its data (run.json's unless given) and its
    newest training state (None before the first checkpoint)."""
    if not (run.path / "config.yaml").is_file() or not (run.path / "run.json").is_file():
        raise CheckpointError(f"{run.path}: not an aiayn run directory (no config.yaml and run.json)")

    cfg = load_yaml(run.path / "config.yaml")
    written = yaml.safe_load((run.path / "config.yaml").read_text())
    if "tokens_per_update" not in (written.get("train") or {}):
        cfg.train.tokens_per_update = 0  # written before the setting existed: update_freq sized the update
    if "lang_tag" not in (written.get("model") or {}):
        cfg.model.lang_tag = "source"  # written before the setting existed: the tag was read in the source
    cfg = apply_overrides(cfg, overrides or {}).validate()
    try:
        meta = read_json(run.path / "run.json")  # bounded, a JSON object: else a FileError (a ValueError)
        data_dir = Path(meta["data_dir"]) if data_dir is None else data_dir
    except (ValueError, KeyError, TypeError):
        if data_dir is None:
            raise CheckpointError(f"{run.path / 'run.json'}: damaged (no data_dir); resume with --data "
                                  "PREPARED_DIR (the damaged file is then kept aside)") from None
    resume_from = run.latest_state()
    if resume_from is None:
        log.warning("%s has no checkpoint yet; starting from step 0", run.path)
    return cfg, data_dir, resume_from


def train(cfg: Config | None, data_dir: str | Path | None, run_dir: str | Path, resume: bool = False,
          device: str | None = None, overrides: dict | None = None, force_batching: bool = False) -> dict:
    """Train a model on prepared data (§5); with `resume`, continue run_dir from its last checkpoint.
    Returns the final progress (step, epoch, elapsed seconds, best validation scores)."""
    run = Run(run_dir)
    data_dir = None if data_dir is None else Path(data_dir)
    resume_from = None
    if resume:
        cfg, data_dir, resume_from = _resumed(run, data_dir, overrides)
    elif (run.path / "config.yaml").exists() or list_checkpoints(run.path):
        raise CheckpointError(f"{run.path} already holds a run; continue it with --resume {run.path}, "
                              "or choose another run directory")
    if cfg is None or data_dir is None:
        raise ValueError("a config and a prepared data directory (--data) are required")
    parent = _parent(cfg, Path(data_dir)) if cfg.train.init_from and resume_from is None else None
    cfg.model.vocab_size = vocabulary_size(Path(data_dir))  # the model's vocabulary is its data's (§5.1)
    if not resume:
        resolve_lang_tag(cfg, Path(data_dir))
    env = setup(device, cfg.train.threads, cfg.train.dist_timeout_minutes)
    why = _precision(cfg, env, run.path / "config.yaml" if resume else None)
    if cfg.train.compile:
        inductor_cache()
        if env.device.type == "cpu":
            log.warning("train.compile on a CPU: measured slower than eager (0.78x: bench/compile_shapes_*.json)")
    trainer = Trainer(cfg, Path(data_dir), run, env)
    handler, locks = None, []
    try:
        if env.is_main:
            _start_run(run, Path(data_dir), resume, locks)
            handler = logging.FileHandler(run.path / "train.log")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            log.addHandler(handler)
            progress_log.addHandler(handler)
            progress_log.setLevel(logging.INFO)
            if log.getEffectiveLevel() > logging.INFO:
                log.setLevel(logging.INFO)
        if resume_from is not None:
            try:
                restore(trainer, resume_from, force_batching)
            except DamagedState as e:  # what to do: the checkpoint before it has a state of its own
                weights = resume_from.name.replace(".state.pt", ".safetensors")
                raise DamagedState(f"{e}; to resume from the checkpoint before it, move {resume_from.name} and "
                                   f"{weights} out of {resume_from.parent}") from None
        elif parent is not None:  # fine-tuning: the parent's weights, before the first update
            load_into(trainer.model, parent, cfg.train.init_from)
        _log_setup(trainer, cfg, env, why)
        if env.is_main:
            _record_run(run, cfg, Path(data_dir), env, trainer, resume, resume_from, why)
        return trainer.loop()
    finally:
        if handler is not None:
            log.removeHandler(handler)
            progress_log.removeHandler(handler)
            handler.close()
        for lock in locks:
            lock.release()
        trainer.fwd_model = trainer.model  # DDP's wrapper holds the process group: it goes before the group
        leave(env)
