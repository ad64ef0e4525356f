"""What the benchmarks read: the prepared Multi30k EN-DE data and a trained checkpoint.

Both default to the main job's outputs (scripts/multi30k.sh) and are made with the main job's
own commands when missing, so each benchmark runs from a fresh clone with one command.
Corpus: $AIAYN_MULTI30K, else ../shared/data/multi30k beside the repository, else downloaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "work" / "multi30k-en-de"
CHECKPOINT = ROOT / "runs" / "multi30k-en-de" / "averaged.safetensors"


def prepared_data(path: Path = DATA) -> Path:
    """The prepared data directory; runs `aiayn prepare` (about a minute) if it is not there."""
    if (path / "manifest.json").exists():
        return path
    env = dict(os.environ)
    shared = ROOT.parent / "shared" / "data" / "multi30k"
    if "AIAYN_MULTI30K" not in env and shared.is_dir():
        env["AIAYN_MULTI30K"] = str(shared)
    print(f"{path} is not prepared yet: running aiayn prepare", flush=True)
    subprocess.run([sys.executable, "-m", "aiayn", "prepare", "--corpus", "multi30k", "--src", "en",
                    "--tgt", "de", "--out", str(path), "--preset", "multi30k"], check=True, env=env)
    return path


def trained_checkpoint(path: Path = CHECKPOINT) -> Path:
    """A trained checkpoint; without one, the main job trains it (2,750 updates: ~25 minutes with
    AVX-512 BF16, an hour or more on AVX2)."""
    if path.exists():
        return path
    if path.resolve() != CHECKPOINT:
        raise SystemExit(f"checkpoint not found: {path}")
    print(f"{path} does not exist: running the main job (bash scripts/multi30k.sh, 2,750 updates)", flush=True)
    subprocess.run(["bash", str(ROOT / "scripts" / "multi30k.sh")], check=True)
    return path


def cpu_meta() -> dict:
    """The CPU class every figure is labelled with (aiayn.device.cpu_class), and its one-line label."""
    from aiayn.device import cpu_class, cpu_label

    info = cpu_class()
    return {**info, "label": cpu_label(info)}


def switches(translator=None, cfg=None) -> dict:
    """The config switches a figure ran with, as a run records them: decode.step (what a Translator
    runs, with its StepOptions when a measurement set them), model.attention, train.fused_loss."""
    import dataclasses

    out: dict = {}
    if cfg is not None:
        out |= {"model.attention": cfg.model.attention, "train.fused_loss": cfg.train.fused_loss}
    if translator is not None:
        out["decode.step"] = translator.step
        if translator.step_options is not None:
            out["decode.step_options"] = dataclasses.asdict(translator.step_options)
        model_cfg = getattr(translator.model, "cfg", None)
        if model_cfg is not None and hasattr(model_cfg, "attention"):
            out["model.attention"] = model_cfg.attention
    return out


def meaningful(systems: list[str]) -> list[str]:
    """The default systems less those that would not run natively here: bf16 rows without native
    bf16 (emulated, slower than fp32), int8 rows without VNNI (aiayn refuses int8 there). Asked for
    by name (--systems), they still run."""
    from aiayn.device import int8_kernel, native_bf16

    return [s for s in systems if ("bf16" not in s or native_bf16()) and ("int8" not in s or int8_kernel()
                                                                          or s.startswith("ct2"))]


def paired_interval(multi: list[list[str]], bi: list[list[str]], refs: list[str], n: int = 1000, seed: int = 0
                    ) -> tuple[float, float]:
    """95 % bootstrap interval of mean-over-seeds BLEU(multi) - mean-over-seeds BLEU(bi) (two systems,
    each one hypothesis list per seed), the same resampled sentences for all (sacreBLEU's sufficient
    statistics, summed per sample)."""
    import numpy as np
    import sacrebleu

    bleu = sacrebleu.BLEU()
    stats = {k: np.array([bleu._extract_corpus_statistics([h], [[r]])[0] for h, r in zip(hyps, refs)])
             for k, hyps in [(f"m{i}", h) for i, h in enumerate(multi)] + [(f"b{i}", h) for i, h in enumerate(bi)]}
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(n):
        idx = rng.integers(0, len(refs), len(refs))
        score = {k: bleu._compute_score_from_stats(list(s[idx].sum(0))).score for k, s in stats.items()}
        diffs.append(np.mean([score[f"m{i}"] for i in range(len(multi))])
                     - np.mean([score[f"b{i}"] for i in range(len(bi))]))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return float(lo), float(hi)
