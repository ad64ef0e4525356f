"""§6.1: beam size and length penalty α, "chosen after experimentation on the development set".

`tune` translates the prepared validation set at every point of a small grid, scores each with
sacreBLEU, and writes a copy of the checkpoint whose decoding settings are the best point's, so
`translate`, `serve` and `Translator` use them by default. Test sets are never read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import sacrebleu

from ..checkpoint import (
    CheckpointError,
    check_safetensors_output,
    meta_extra,
    meta_step,
    read_meta,
    read_weights,
    refuse_folder,
    save_weights,
)
from ..config import ConfigError, DecodeConfig
from ..data.prepare import check_vocabulary, load_manifest, read_text
from ..data.text import DataError
from ..device import pick_device, resolve_precision
from ..files import read_json
from ..progress import bar as progress_bar
from .translator import Translator
from .tuned_precision import MARGIN, TOLERANCE, Measured, candidates, choice_record, choose_precision, measure

log = logging.getLogger("aiayn")
BEAMS = (2, 4, 6)
ALPHAS = (0.0, 0.3, 0.6, 1.0, 1.5, 2.0)


@dataclass
class Point:
    beam: int
    alpha: float
    bleu: float
    bp: float


def run_data_dir(checkpoint: Path) -> Path | None:
    """The prepared data of the run a checkpoint belongs to (run.json beside it or one folder up)."""
    for folder in (checkpoint.parent, checkpoint.parent.parent):
        try:
            return Path(read_json(folder / "run.json")["data_dir"])
        except (KeyError, TypeError, ValueError):  # absent or damaged (FileError is a ValueError)
            continue
    return None


def choose(points: list[Point], default: DecodeConfig) -> Point:
    """The best BLEU; among equals, the point nearest the paper's setting (beam 4, α 0.6)."""
    return max(points, key=lambda p: (round(p.bleu, 2), -abs(p.beam - default.beam), -abs(p.alpha - default.alpha)))


def validation_sets(data_dir: Path, manifest: dict, sentences: int) -> dict[str, tuple[list[str], list[str]]]:
    """The validation sources and references to tune on: the pair's ("" for its one target), or for
    data of several directions each target language's (its directions' sets pooled, sources tagged
    by the translator), `sentences` of each direction at most (0: all)."""
    directions = manifest["settings"].get("directions")
    names = [f"valid.{d}" for d in directions] if isinstance(directions, list) and directions else ["valid"]
    sets: dict[str, tuple[list[str], list[str]]] = {}
    for name in names:
        src, ref = read_text(data_dir, name, "src", manifest), read_text(data_dir, name, "tgt", manifest)
        if sentences:
            src, ref = src[:sentences], ref[:sentences]
        lang = name.rpartition("-")[2] if name != "valid" else ""
        have = sets.setdefault(lang, ([], []))
        have[0].extend(src)
        have[1].extend(ref)
    return sets


def grid(translator: Translator, src: list[str], ref: list[str], beams: tuple[int, ...], alphas: tuple[float, ...],
          lang: str) -> list[Point]:
    """sacreBLEU at every (beam, α) of the grid, into `lang` ("" : the model's one target)."""
    ids = translator.encode_sources(src, tgt_lang=lang or None)
    points = []
    shown = progress_bar(len(beams) * len(alphas), "setting", f"tuning beam and alpha{' into ' + lang if lang else ''}")
    for beam in beams:
        for alpha in alphas:
            hyps = translator.translate_ids(ids, beam, alpha, 1)
            text = translator.tokenizer.decode([h[0].tokens if h else [] for h in hyps])
            score = sacrebleu.BLEU().corpus_score(text, [ref])
            points.append(Point(beam, alpha, round(score.score, 2), round(score.bp, 3)))
            log.info("%sbeam %d alpha %.2f: valid BLEU %.2f (BP %.3f)", f"{lang}: " if lang else "", beam, alpha,
                     score.score, score.bp)
            shown.update(1)
    shown.close()
    return points


def _choose_precision(translator: Translator, sets: dict, grids: dict, precisions: tuple[str, ...] | None,
                      tolerance: float) -> dict | None:
    """Time each precision on the validation sets at each set's chosen (beam, α); the record of the
    choice (tuned_precision.choice_record), or None when there is nothing to choose between."""
    wanted = candidates(translator.device) if precisions is None else list(precisions)
    wanted = [translator.precision] + [p for p in dict.fromkeys(wanted) if p != translator.precision]
    if len(wanted) < 2:
        return None
    each = {p: translator if p == translator.precision else
            Translator(translator.model, translator.tokenizer, translator.decode_cfg, precision=p, quiet=True)
            for p in wanted}
    each = {t.precision: t for t in each.values()}  # what runs (int8 refused on a CPU without AVX2 is fp32)
    if len(each) < 2:
        return None
    totals: dict[str, list[float]] = {p: [0.0, 0.0, 0] for p in each}
    for lang, (src, ref) in sets.items():
        best = choose(grids[lang], DecodeConfig())
        for r in measure(each, src, ref, best.beam, best.alpha, tgt_lang=lang or None):
            totals[r.precision][0] += r.bleu / len(sets)
            totals[r.precision][1] += r.seconds
            totals[r.precision][2] += len(src)
    rows = [Measured(p, round(b, 2), round(s, 3), round(n / max(s, 1e-9), 1)) for p, (b, s, n) in totals.items()]
    chosen = choose_precision(rows, translator.precision, tolerance, MARGIN)
    for r in rows:
        log.info("precision %s at the chosen setting: valid BLEU %.2f, %.1f sentences/s%s", r.precision, r.bleu,
                 r.sentences_per_s, "  <- auto takes it on this processor class" if r.precision == chosen else "")
    return choice_record(rows, translator.precision, chosen, tolerance, MARGIN, translator.device)


def tune(checkpoint: str | Path, data_dir: str | Path | None = None, beams: tuple[int, ...] = BEAMS,
         alphas: tuple[float, ...] = ALPHAS, sentences: int = 0, precision: str = "auto",
         out: str | Path | None = None, device: str | None = None, precisions: tuple[str, ...] | None = None,
         tolerance: float = TOLERANCE) -> tuple[Point, list[Point], Path]:
    """Grid-search beam × α on the validation set; write `out` (default: CHECKPOINT.tuned.safetensors)
    with the chosen settings. With `precision` auto, the precisions to time at the chosen setting
    (`precisions`; None: those the device runs natively; (): none), the fastest within `tolerance`
    BLEU of fp32's recorded for `auto` (tuned_precision.py). Returns (chosen, every point, the file)."""

    checkpoint = Path(checkpoint)
    refuse_folder(checkpoint)
    if not checkpoint.is_file():
        raise CheckpointError(f"checkpoint not found: {checkpoint}")
    out = Path(out) if out else checkpoint.with_name(checkpoint.name.replace(".safetensors", "") + ".tuned.safetensors")
    check_safetensors_output(out, "--output", (checkpoint,))  # before minutes of search
    data_dir = Path(data_dir) if data_dir else run_data_dir(checkpoint)
    if data_dir is None:
        raise DataError(f"{checkpoint}: no readable run.json beside it (or one folder up) to find its data; "
                        "pass --data PREPARED_DIR")
    manifest = load_manifest(data_dir)
    dev = pick_device(device)
    choosing = precision == "auto"
    # the grid runs in the default rule's precision, never an earlier tuning's choice
    precision = resolve_precision(precision, dev)[0] if choosing else precision
    translator = Translator.load(checkpoint, device=dev, precision=precision)
    check_vocabulary(translator.tokenizer.proto, data_dir)
    if max(beams) > len(translator.tokenizer):
        raise ConfigError(f"beam size {max(beams)} (--beams, `beams`) is larger than the model's vocabulary "
                          f"({len(translator.tokenizer)})")
    sets = validation_sets(data_dir, manifest, sentences)
    grids = {lang: grid(translator, src, ref, beams, alphas, lang) for lang, (src, ref) in sets.items()}
    if len(grids) == 1:
        points = next(iter(grids.values()))
    else:  # one setting for lines of no named language: the best mean over the languages
        points = [Point(p.beam, p.alpha, round(sum(g[i].bleu for g in grids.values()) / len(grids), 2),
                        round(sum(g[i].bp for g in grids.values()) / len(grids), 3))
                  for i, p in enumerate(next(iter(grids.values())))]
    best = choose(points, DecodeConfig())
    choice = _choose_precision(translator, sets, grids, precisions, tolerance) if choosing else None
    tensors, meta = read_weights(checkpoint)
    cfg = read_meta(meta, checkpoint)[0]
    step, extra = meta_step(meta, checkpoint), meta_extra(meta, checkpoint)
    cfg.decode.beam, cfg.decode.alpha = best.beam, best.alpha
    single = "src" in manifest["settings"] and "" in sets  # a pair's folder: its validation source file
    valid = data_dir / f"valid.{manifest['settings']['src']}.txt" if single else data_dir
    extra["tuned"] = {"valid": str(valid), "sentences": sum(len(s) for s, _ in sets.values()),
                      "precision": translator.precision, "points": [p.__dict__ for p in points],
                      "chosen": best.__dict__}
    if choice is not None:
        extra["tuned"]["precision_choice"] = choice
    if len(grids) > 1 or "" not in grids:  # many directions: a setting for each target language
        extra["tuned"]["by_language"] = {lang: {"points": [p.__dict__ for p in g],
                                                "chosen": choose(g, DecodeConfig()).__dict__}
                                         for lang, g in grids.items()}
    save_weights(out, tensors, cfg, translator.tokenizer, step, extra)
    return best, points, out
