"""One row of a suite: train (or resume, or skip) it, average its last checkpoints, evaluate it,
write its result file and hypotheses; the paired bootstrap of finished rows against their baselines.
A suite's rows come from one commit (`_check_commit`)."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from ..checkpoint import list_checkpoints, load_checkpoint, write_averaged
from ..config import Config, ConfigError
from ..data.batches import TokenData
from ..data.prepare import load_manifest, read_text, vocabulary_size
from ..data.text import read_lines
from ..decode.translator import Translator
from ..decode.tune import ALPHAS, BEAMS, choose, grid
from ..files import FileError, atomic_write, read_json
from ..models.build import shapes_only
from ..overrides import apply_overrides, load_yaml, preset
from ..parsing.model import build_any
from ..training.run_folder import Run, read_metrics
from ..training.session import resolve_lang_tag, train
from ..training.step import validate
from .machine import code_commit, machine
from .plan import Row
from .stats import paired_bootstrap
from .table1 import flops_per_token

log = logging.getLogger("aiayn")


def row_config(row: Row, common: dict[str, Any]) -> Config:
    cfg = preset(row.preset)
    apply_overrides(cfg, {**common, **row.overrides})
    cfg.train.seed = row.seed
    return cfg.validate()


def trained_config(row: Row, common: dict[str, Any], data_dir: Path) -> Config:
    """The row's config as training resolves it for a new run: the vocabulary size is the prepared
    data's, model.lang_tag auto its choice (a result states the same config whether resumed or not)."""

    cfg = row_config(row, common)
    cfg.model.vocab_size = vocabulary_size(Path(data_dir))
    resolve_lang_tag(cfg, Path(data_dir))
    return cfg


def forced_nll(scores: list) -> float:
    """NLL per target token (EOS counted, as validation counts it) from force-decoded references."""
    return -sum(x.total for x in scores) / sum(x.subwords + 1 for x in scores)


def evaluate(run_dir: Path, data_dir: Path, sentences: int = 0, device: str = "cpu",
             tune_decode: bool = False) -> dict[str, Any]:
    """§6.1: average the last checkpoints (at most 5), then validation perplexity and beam-4 BLEU on
    the validation set and every prepared test set (sentences > 0: only the first ones). `tune_decode`:
    beam and α chosen first on validation (`aiayn tune`'s grid, §6.1's "chosen after experimentation on
    the development set"), `bleu` then at that setting and `bleu_paper` at beam 4, α 0.6."""

    run_dir, data_dir = Path(run_dir), Path(data_dir)
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise ConfigError(f"{run_dir}: no checkpoints to evaluate")
    averaged = run_dir / "averaged.safetensors"
    chosen = ckpts[-5:]
    write_averaged(chosen, averaged)
    model, cfg, tokenizer, step = load_checkpoint(averaged, device, build_any)
    cfg.train.precision = "fp32"  # the same numbers whatever the processor
    out: dict[str, Any] = {"averaged": len(chosen), "step": step}
    out.update(validate(model, TokenData(data_dir, "valid"), cfg, torch.device(device)))

    out["flops_per_token"] = flops_per_token(model, TokenData(data_dir, "valid"), cfg)
    translator = Translator(model, tokenizer, cfg.decode, precision="fp32")
    sets = _scored_sets(data_dir, sentences)
    out["decode"] = {"beam": cfg.decode.beam, "alpha": cfg.decode.alpha, "max_len_b": cfg.decode.max_len_b}
    if tune_decode and "valid" in sets:
        points = grid(translator, *sets["valid"], BEAMS, ALPHAS, "")
        best = choose(points, cfg.decode)
        out["bleu_paper"] = {split: _scores(translator.translate(src), ref)[0] for split, (src, ref) in sets.items()}
        out["decode"].update(beam=best.beam, alpha=best.alpha, tuned={"on": "valid", "points": [
            p.__dict__ for p in points], "paper": {"beam": cfg.decode.beam, "alpha": cfg.decode.alpha}})
    beam, alpha = out["decode"]["beam"], out["decode"]["alpha"]
    bleu: dict[str, dict[str, Any]] = {}
    for split, (src, ref) in sets.items():
        start = time.perf_counter()
        hyps = translator.translate(src, beam, alpha)
        bleu[split], signature = _scores(hyps, ref, time.perf_counter() - start)
        (run_dir / f"{split}.hyp").write_text("".join(h + "\n" for h in hyps))
        if split != "valid":  # the test sets' NLL per token, as validation's (their token arrays are not prepared)
            out.setdefault("test_nll", {})[split] = forced_nll(translator.score(src, ref))
    out["bleu"] = bleu
    out["signature"] = signature if sets else str(sacrebleu.BLEU().get_signature())
    return out


def _scored_sets(data_dir: Path, sentences: int) -> dict[str, tuple[list[str], list[str]]]:
    """Validation and every prepared test set that has both sides: sources and references (sentences > 0:
    the first ones), validation first."""
    manifest = load_manifest(data_dir)
    settings = manifest["settings"]
    out = {}
    for split in ["valid"] + [s for s in manifest["splits"] if s not in ("train", "valid")]:
        if not all((data_dir / f"{split}.{settings[k]}.txt").exists() for k in ("src", "tgt")):
            continue
        src, ref = read_text(data_dir, split, "src"), read_text(data_dir, split, "tgt")
        out[split] = (src[:sentences], ref[:sentences]) if sentences else (src, ref)
    return out


def _scores(hyps: list[str], ref: list[str], seconds: float | None = None) -> tuple[dict[str, Any], str]:
    """sacreBLEU's BLEU, its brevity penalty and chrF of `hyps` (and the seconds they took), and BLEU's
    signature."""
    metric = sacrebleu.BLEU()
    score = metric.corpus_score(hyps, [ref])
    out = {"bleu": round(score.score, 2), "bp": round(score.bp, 3),
           "chrf": round(sacrebleu.CHRF().corpus_score(hyps, [ref]).score, 2), "sentences": len(hyps)}
    return out | ({} if seconds is None else {"seconds": round(seconds, 1)}), str(metric.get_signature())


def run_rows(suite: str, rows: list[Row], common: dict[str, Any], ctx: dict[str, Any], only: list[str] | None,
             render_report) -> list[dict]:
    """run_row for each of `rows` (those `only` names, by name or group), every config checked first;
    the report re-rendered (render_report) after each."""
    chosen = [r for r in rows if r.name in only or r.group in only] if only else rows
    for row in chosen:
        row_config(row, common)  # every config checked before the first run starts
    out = []
    for row in chosen:
        out.append(run_row(row, suite, common, **ctx))
        render_report()
    return out


def run_row(row: Row, suite: str, common: dict[str, Any], data_dir: Path, work: Path, results: Path,
            sentences: int = 0, device: str | None = None, allow_mixed: bool = False,
            tune_decode: bool = False) -> dict[str, Any]:
    """Train (or resume, or skip) one row and write its result.json, hypotheses beside it; returns the result
    (`tune_decode`: evaluate's)."""
    run_dir = Path(work) / suite / row.name
    result_path = run_dir / "result.json"
    copy = Path(results) / suite / f"{row.name}.json"
    if not run_dir.exists() and _same_row(copy, row, common):  # the run folder went, its result stayed
        log.info("%s/%s: result already in %s, skipped", suite, row.name, copy)
        return read_json(copy)
    if result_path.exists():
        log.info("%s/%s: finished earlier, skipped", suite, row.name)
        result = read_json(result_path)
    elif not run_dir.exists() and (twin := _finished_twin(row, common, data_dir, results, sentences, device,
                                                           tune_decode)):
        result = _reuse(twin, row, suite, run_dir)
    else:
        _check_commit(Path(results) / suite, run_dir, allow_mixed)
        result = _train_and_evaluate(row, suite, common, data_dir, run_dir, sentences, device, tune_decode)
        atomic_write(result_path, json.dumps(result, indent=1).encode())
        log.info("%s/%s: valid NLL %.4f, valid BLEU %.2f", suite, row.name, result["valid_nll"],
                 result["bleu"].get("valid", {}).get("bleu", float("nan")))
    _copy_result(result_path, copy)
    for hyp in sorted(run_dir.glob("*.hyp")):  # the hypotheses, so that anyone can re-score
        atomic_write(copy.parent / f"{row.name}.{hyp.stem}.hyp.gz", gzip.compress(hyp.read_bytes(), mtime=0))
    return result


def _finished_twin(row: Row, common: dict[str, Any], data_dir: Path, results: Path, sentences: int,
                   device: str | None, tune_decode: bool = False) -> Path | None:
    """A result in results/ (any suite) of this very training and evaluation: the same resolved config,
    suite settings, data, sentences scored, decoding (tuned on validation or not), device and committed code.
    Training is deterministic, so that run is this row's run (arch's Transformer seeds are Table 3's
    reference seeds)."""
    commit = code_commit()
    if commit is None or commit.endswith("+dirty"):
        return None
    want = {"config": json.loads(json.dumps(trained_config(row, common, data_dir).to_dict())), "common": common,
            "data": _data_words(data_dir), "device": device or ("cuda" if torch.cuda.is_available() else "cpu")}
    valid_src = Path(data_dir) / f"valid.{want['data']['src']}.txt"
    if not valid_src.exists():  # nothing scored on validation: nothing to compare, train
        return None

    valid = len(read_lines(valid_src))
    scored = min(sentences, valid) if sentences else valid
    for path in sorted(Path(results).glob("*/*.json")):
        try:
            r = read_json(path)
        except FileError:  # a damaged result is no twin
            continue
        machine = r.get("machine") if isinstance(r, dict) else None  # other results (heads, parse) have their own form
        if isinstance(machine, dict) and machine.get("git") == commit and all(r.get(k) == v for k, v in want.items()) \
                and r.get("bleu", {}).get("valid", {}).get("sentences") == scored \
                and ("tuned" in r.get("decode", {})) == tune_decode:
            return path
    return None


def _reuse(twin: Path, row: Row, suite: str, run_dir: Path) -> dict[str, Any]:
    """The twin's result and hypotheses as this row's (named as this row, `reused` naming the run trained)."""
    r = read_json(twin)
    r.pop("paired_bs", None)
    r.update({"suite": suite, "row": row.name, "change": row.change, "group": row.group, "family": row.family,
              "seed": row.seed, "of": row.of or row.name, "preset": row.preset, "overrides": row.overrides,
              "paper": None if row.paper is None else row.paper.__dict__,
              "reused": r.get("reused") or f"{twin.parent.name}/{twin.stem}"})
    run_dir.mkdir(parents=True)
    for hyp in sorted(twin.parent.glob(f"{twin.stem}.*.hyp.gz")):
        split = hyp.name[len(twin.stem) + 1:-len(".hyp.gz")]
        atomic_write(run_dir / f"{split}.hyp", gzip.decompress(hyp.read_bytes()))
    atomic_write(run_dir / "result.json", json.dumps(r, indent=1).encode())
    log.info("%s/%s: the same training as %s (config, data, commit): its result reused", suite, row.name, r["reused"])
    return r


def _copy_result(result_path: Path, copy: Path) -> None:
    """The run's result into results/, unless the copy there is this result with the paired test that
    pair_with_references added (a resumed suite skips finished rows and must not strip their tests)."""
    copy.parent.mkdir(parents=True, exist_ok=True)
    if copy.exists():
        old, new = read_json(copy), read_json(result_path)
        if "paired_bs" in old and {k: v for k, v in old.items() if k != "paired_bs"} == new:
            return
    shutil.copyfile(result_path, copy)


def _train_and_evaluate(row: Row, suite: str, common: dict[str, Any], data_dir: Path, run_dir: Path,
                        sentences: int, device: str | None, tune_decode: bool = False) -> dict[str, Any]:

    cfg = trained_config(row, common, data_dir)
    start = time.time()
    if (run_dir / "config.yaml").exists():
        log.info("%s/%s: resuming", suite, row.name)
        state = train(None, data_dir, run_dir, resume=True, device=device)
    else:
        log.info("%s/%s: training (%s)", suite, row.name, row.change)
        state = train(cfg, data_dir, run_dir, device=device)
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    metrics = read_metrics(Run(run_dir).path)
    train_rows = [m for m in metrics if "tgt_tok_s" in m]
    result = {
        "suite": suite, "row": row.name, "change": row.change, "group": row.group, "family": row.family,
        "seed": row.seed, "of": row.of or row.name, "preset": row.preset, "overrides": row.overrides, "common": common,
        "paper": None if row.paper is None else row.paper.__dict__, "config": cfg.to_dict(),
        "params": _count_params(cfg.model, data_dir), "updates": state["step"], "epochs": state["epoch"],
        "train_minutes": round(state["elapsed"] / 60, 2),
        "tgt_tok_s": statistics.median(m["tgt_tok_s"] for m in train_rows[1:] or train_rows) if train_rows else 0,
        "curve": sorted({m["step"]: [m["step"], m["valid_ppl"], _minutes_at(m["step"], train_rows)]
                         for m in metrics if "valid_ppl" in m}.values()),
        "train_curve": [[m["step"], m["ppl"]] for m in train_rows],
        "machine": machine(), "device": dev, "precision": load_yaml(run_dir / "config.yaml").train.precision,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "wall_minutes": round((time.time() - start) / 60, 1),
        "trained_on": trained_on(run_dir),
    }
    result["data"] = _data_words(data_dir)
    result.update(evaluate(run_dir, data_dir, sentences, dev, tune_decode))
    return result


def trained_on(run_dir: Path) -> list[str]:
    """Each processor the run's sessions trained on, in order, a repeat merged (run.json's CPU label,
    else the device): a row resumed on another machine names both, where `machine` is the last."""
    path = Path(run_dir) / "run.json"
    try:
        sessions = read_json(path, limit=1 << 22).get("sessions", [])  # a few kB a session
    except FileError:
        return []
    out: list[str] = []
    for s in sessions if isinstance(sessions, list) else []:
        where = (s.get("cpu") or s.get("device")) if isinstance(s, dict) else None
        if isinstance(where, str) and (not out or out[-1] != where):
            out.append(where)
    return out


def _data_words(data_dir: Path) -> dict[str, Any]:
    """What a row trained on: the prepared folder's name, its languages and training pairs."""

    m = load_manifest(Path(data_dir))
    return {"dir": Path(data_dir).name, "src": m["settings"]["src"], "tgt": m["settings"]["tgt"],
            "train_pairs": m["splits"]["train"]["pairs"]}


def _check_commit(suite_results: Path, run_dir: Path, allow_mixed: bool) -> None:
    """A suite's rows come from one commit: refuse to train a row with other code than its results'."""
    now = code_commit()
    seen = set()
    for f in sorted(suite_results.glob("*.json")):
        try:
            seen.add(read_json(f).get("machine", {}).get("git"))
        except (FileError, AttributeError, TypeError):  # damaged: the rows that read it say so
            continue
    other = sorted(str(c) for c in seen - {now})
    if other and not allow_mixed:
        raise ConfigError(f"{suite_results}: results from commit(s) {', '.join(other)}, this code is {now}; a "
                          "suite's rows come from one commit: move that folder away to rerun the suite, or pass "
                          "--allow-mixed-commits (the report then names the commits)")
    if now is not None and now.endswith("+dirty") and not allow_mixed:
        log.warning("%s: training from uncommitted changes (%s): the result cannot be traced", run_dir, now)


def pair_with_references(suite: str, results: Path, data_dir: Path, baseline_of) -> None:
    """sacreBLEU's paired bootstrap of every row's validation hypotheses against its baseline
    (`baseline_of(result)`: a row name, e.g. the seed-matched reference), once both are there."""

    folder = Path(results) / suite
    refs = read_text(Path(data_dir), "valid", "tgt")
    for path in sorted(folder.glob("*.json")):
        r = read_json(path)
        base = baseline_of(r)
        hyp, base_hyp = folder / f"{r['row']}.valid.hyp.gz", folder / f"{base}.valid.hyp.gz"
        if base is None or "paired_bs" in r or not (hyp.exists() and base_hyp.exists()):
            continue
        hyps, base_hyps = (read_lines(p) for p in (hyp, base_hyp))
        n = min(len(refs), r["bleu"]["valid"]["sentences"])
        r["paired_bs"] = {"baseline": base, "split": "valid", **paired_bootstrap(base_hyps, hyps, refs[:n])}
        atomic_write(path, json.dumps(r, indent=1).encode())


def seed_matched(r: dict) -> str | None:
    """Table 3: a row is paired with the reference seed that saw the same data order."""
    if r["group"] == "ref" or r["family"] == "stability":
        return None
    return f"{'depth-' if r['family'] == 'depth' else ''}ref-s{r['seed']}"


def _same_row(path: Path, row: Row, common: dict[str, Any]) -> bool:
    """A result file written for this very row: same preset, overrides, seed and suite settings."""
    try:
        r = read_json(Path(path))
    except FileError:
        return False
    return (r.get("preset"), r.get("overrides"), r.get("seed"), r.get("common")) == (
        row.preset, row.overrides, row.seed, common)


def _minutes_at(step: int, train_rows: list[dict]) -> float:
    """Training minutes when `step` was reached (from the last training record at or before it)."""
    seen = [m["elapsed_s"] for m in train_rows if m["step"] <= step and "elapsed_s" in m]
    return round(max(seen, default=0.0) / 60, 3)


def _count_params(model_cfg, data_dir: Path) -> int:

    model_cfg.vocab_size = vocabulary_size(data_dir)
    with shapes_only():
        return sum(p.numel() for p in build_any(model_cfg).parameters())
