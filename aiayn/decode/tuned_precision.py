"""The decoding precision chosen on the validation set (§6.1's "development set"), for this CPU class.

int8 and bf16 change a translation's numbers, so `auto` never takes them on its own where the processor
has no native bf16 (device.resolve_precision). `aiayn tune` measures instead: at the beam and α it chose,
it translates the validation set in every precision this device runs natively, timed in alternating
passes, and records the fastest whose validation BLEU is within a tolerance of fp32's and that is faster
by a margin than the path `auto` would take untuned (the grid's precision, or fp32 where that one loses
more than the tolerance). `auto` on the tuned checkpoint takes that choice on a processor of the same
class (its vector class and int8 kernel), and the default rule elsewhere; the log says which and why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import sacrebleu
import torch

from ..config import ConfigError
from ..device import cpu_class, cpu_label, int8_kernel, native_bf16

log = logging.getLogger("aiayn")
TOLERANCE = 0.2  # validation BLEU a faster precision may lose against fp32's
MARGIN = 0.05  # and it must be at least this much faster (a pass's time varies by a few per cent)


@dataclass
class Measured:
    precision: str
    bleu: float
    seconds: float  # the fastest of the alternating passes
    sentences_per_s: float


def candidates(device: torch.device) -> list[str]:
    """The precisions this device runs natively: fp32; bf16 where it computes bf16 natively; int8 on a
    CPU with an int8 kernel (device.int8_kernel)."""
    if device.type == "cuda":
        return ["fp32", "bf16"] if torch.cuda.is_bf16_supported(including_emulation=False) else ["fp32"]
    return ["fp32"] + (["bf16"] if native_bf16() else []) + (["int8"] if int8_kernel() else [])


def parse_precisions(text: str, tolerance: float) -> tuple[str, ...] | None:
    """tune's --precisions (auto: None; none: ()) and --precision-tolerance, checked."""
    precisions = None if text == "auto" else tuple(x for x in text.split(",") if x != "none")
    if precisions is not None and any(p not in ("fp32", "bf16", "int8") for p in precisions):
        raise ConfigError(f"--precisions: auto, none, or a comma-separated list of fp32, bf16, int8; got {text}")
    if not 0 <= tolerance <= 100:
        raise ConfigError(f"--precision-tolerance must be in [0, 100] BLEU, got {tolerance}")
    return precisions


def machine(device: torch.device | None = None) -> dict:
    """What a choice is valid for: the device's class, as `recorded` compares it (a GPU: its name and
    compute capability; a CPU: its vector class and int8 kernel)."""
    if device is not None and device.type == "cuda":
        name, (major, minor) = torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
        return {"class": f"cuda sm_{major}{minor}", "int8_kernel": None, "cpu": name}
    info = cpu_class()
    return {"class": info["class"], "int8_kernel": int8_kernel(), "cpu": cpu_label(info)}


def choose_precision(rows: list[Measured], reference: str, tolerance: float = TOLERANCE,
                     margin: float = MARGIN) -> str:
    """The fastest precision whose BLEU is at least fp32's (the reference's where fp32 was not measured)
    less `tolerance` and whose time is at most (1 - margin) of the base's: the reference (the grid's
    precision) where it is itself within the tolerance, fp32 otherwise; the base where none is."""
    by = {r.precision: r for r in rows}
    floor = by.get("fp32", by[reference]).bleu - tolerance
    base = by[reference] if by[reference].bleu >= floor or "fp32" not in by else by["fp32"]
    fit = [r for r in rows if r is base or (r.bleu >= floor and r.seconds <= (1 - margin) * base.seconds)]
    return min(fit, key=lambda r: (r.seconds, r is not base)).precision


def measure(translators: dict, src: list[str], ref: list[str], beam: int, alpha: float, reps: int = 2,
            tgt_lang: str | None = None) -> list[Measured]:
    """Translate `src` at (beam, α) with each precision's Translator, `reps` alternating passes
    (A B C A B C); BLEU of the first pass, time of the fastest."""
    first = next(iter(translators.values()))
    ids = first.encode_sources(src, tgt_lang=tgt_lang)
    seconds: dict[str, list[float]] = {p: [] for p in translators}
    bleu: dict[str, float] = {}
    for _ in range(reps):
        for p, t in translators.items():
            start = time.perf_counter()
            hyps = t.translate_ids(ids, beam, alpha, 1)
            seconds[p].append(time.perf_counter() - start)
            if p not in bleu:
                text = t.tokenizer.decode([h[0].tokens if h else [] for h in hyps])
                bleu[p] = round(sacrebleu.BLEU().corpus_score(text, [ref]).score, 2)
    return [Measured(p, bleu[p], round(min(s), 3), round(len(src) / max(min(s), 1e-9), 1))
            for p, s in seconds.items()]


def choice_record(rows: list[Measured], reference: str, chosen: str, tolerance: float, margin: float,
                  device: torch.device | None = None) -> dict:
    """What tune writes into the checkpoint's extra["tuned"]["precision_choice"]."""
    return {"chosen": chosen, "reference": reference, "tolerance": tolerance, "margin": margin, **machine(device),
            "measured": [asdict(r) for r in rows]}


def recorded(extra: dict, device: torch.device) -> tuple[str | None, str]:
    """(the precision tune chose for this device's class, or None; why), from a checkpoint's extra."""
    tuned = extra.get("tuned")
    rec = tuned.get("precision_choice") if isinstance(tuned, dict) else None
    if not isinstance(rec, dict) or rec.get("chosen") not in ("fp32", "bf16", "int8"):
        return None, "no precision chosen on validation"
    here = machine(device)
    if (rec.get("class"), rec.get("int8_kernel")) != (here["class"], here["int8_kernel"]):
        return None, (f"tune chose {rec['chosen']} on another processor class ({str(rec.get('cpu'))[:80]}); "
                      f"this one is {here.get('cpu', here['class'])}")
    measured = rec.get("measured") if isinstance(rec.get("measured"), list) else []
    rows = {r.get("precision"): r for r in measured[:8] if isinstance(r, dict)}
    against = "fp32" if "fp32" in rows else rec.get("reference")
    mine, ref = rows.get(rec["chosen"], {}), rows.get(against, {})
    return rec["chosen"], (f"auto: chosen by aiayn tune on validation on this processor class "
                           f"(BLEU {mine.get('bleu')} vs {against} {ref.get('bleu')}, "
                           f"{mine.get('sentences_per_s')} vs {ref.get('sentences_per_s')} sentences/s)")


def tuned_precision(precision: str, extra: dict, device: torch.device) -> str:
    """The precision a Translator loaded with `precision` from a checkpoint of `extra` runs: an
    explicit one as given; `auto`, tune's choice where it holds for this device's class (logged)."""
    if precision != "auto":
        return precision
    chosen, why = recorded(extra, device)
    if chosen is not None or "another processor" in why:
        log.info("precision %s (%s)", chosen or "auto: the default rule", why)
    return chosen or "auto"
