"""Clean training throughput of a suite's architectures, measured apart from their runs.

The suites train by updates, so a busy machine cannot change their results; how long an update
takes is measured here instead: the same batches for every model, interleaved rounds (so drift
in the machine's speed hits every model alike), the median round per model.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..data.batches import TokenData, collate
from ..data.prepare import load_manifest
from ..device import TRAIN_PRECISIONS, resolve_precision
from ..parsing.model import build_any
from ..training.optim import make_optimizer
from ..training.processes import setup
from ..training.step import epoch_batches, train_step
from .machine import machine


def measure_throughput(cfgs: dict[str, Config], data_dir: Path, updates: int = 10, rounds: int = 3,
                       device: str | None = None) -> dict[str, Any]:
    """Seconds per update and target tokens per second of each config, on the first `updates`
    batches of the training data (one batch per update, as the suites' protocol trains)."""
    data = TokenData(Path(data_dir), "train")
    vocab = int(load_manifest(Path(data_dir))["vocab_size"])
    first = next(iter(cfgs.values()))
    env = setup(device, first.train.threads)
    batches = [collate(data, idx) for idx in epoch_batches(data, first, 1)[:updates]]
    tokens = sum(b.n_tokens for b in batches)
    models = {}
    for name, cfg in cfgs.items():
        cfg.model.vocab_size = vocab
        cfg.train.precision = resolve_precision(cfg.train.precision, env.device, choices=TRAIN_PRECISIONS)[0]
        torch.manual_seed(cfg.train.seed)
        model = build_any(cfg.model).to(env.device)
        models[name] = (model, make_optimizer(model, cfg.train), cfg)
        _updates(models[name], batches[:2], env.device)  # warm-up: kernels, allocator
    seconds: dict[str, list[float]] = {name: [] for name in cfgs}
    for _ in range(rounds):
        for name, entry in models.items():
            start = time.perf_counter()
            _updates(entry, batches, env.device)
            seconds[name].append(time.perf_counter() - start)
    out = {name: {"s_per_update": statistics.median(s) / updates, "tgt_tok_s": tokens / statistics.median(s),
                  "rounds_s": [round(x, 3) for x in s]} for name, s in seconds.items()}
    return {"updates": updates, "rounds": rounds, "tgt_tokens_per_update": tokens / updates,
            "models": out, "machine": machine(), "device": env.device.type,
            "precision": first.train.precision}


def _updates(entry: tuple, batches: list, device: torch.device) -> None:
    model, optimizer, cfg = entry
    for b in batches:
        train_step(model, optimizer, [(b, 1.0)], b.n_tokens, cfg, 1e-4, 1, device)
