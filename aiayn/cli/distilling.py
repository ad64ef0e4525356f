"""`aiayn distill`: sequence-level knowledge distillation (Kim & Rush 2016; not in the paper): a
teacher (a checkpoint, an ensemble, an imported OPUS-MT model) re-translates the training sources
with beam search, its translations are filtered by its own confidence, and the student's data is
prepared in the teacher's vocabulary, with a decoding shortlist built from it.

Everything the teacher wrote goes into a work folder of its own (`--work`, default OUT.teacher):
`teacher.TGT` (one translation per training source), `scores.tsv` (its confidence and whether it was
kept), `train.SRC`/`train.TGT` (the kept pairs) and `shortlist.safetensors`. The translation is kept
chunk by chunk (cli/parts.py), so a killed distillation resumes where it stopped, byte for byte.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
from pathlib import Path

from tqdm import tqdm

from ..files import add_to_marker, atomic_write, check_output_folder, digest, marked, write_marker
from .common import UserError, build_config, preset_flag
from .parts import Parts

log = logging.getLogger("aiayn")
DISTILL = "distill"  # the kind in the work folder's marker: distill writes its files into it by name


def cmd_distill(args: argparse.Namespace, extra: list[str]) -> None:
    """Teacher translations of the training sources -> filtered -> the student's prepared data."""
    from ..data.prepare import check_prepared_output, prepare
    from ..data.text import iter_pairs
    from ..decode.translator import Translator
    from .preparing import languages, pair_splits

    cfg = build_config(args, extra)
    if args.chunk_lines < 1 or args.beam is not None and args.beam < 1:
        raise UserError(f"--chunk-lines and --beam must be at least 1, got {args.chunk_lines}, {args.beam}")
    if args.min_logprob is not None and not math.isfinite(args.min_logprob):
        raise UserError(f"--min-logprob must be a finite number, got {args.min_logprob}")
    out = check_prepared_output(args.out)
    work = Path(args.work) if args.work else out.with_name(out.name + ".teacher")
    work = check_output_folder(work, lambda f: marked(f, DISTILL), "--work")  # written into by name, never cleared
    src, tgt = languages(args)
    splits = pair_splits(args, src, tgt)
    teachers = args.checkpoint
    overrides = {k: v for k, v in {"beam": args.beam, "alpha": args.alpha}.items() if v is not None}
    translator = Translator.load(teachers if len(teachers) > 1 else teachers[0], device=args.device,
                                 precision=args.precision, **overrides)
    counts: dict = {}
    sources = [s for s, _ in iter_pairs(*splits["train"], False, counts)]  # targets checked, not used
    log.info("distilling %s training sources with %s (beam %d, alpha %g, %s)", f"{len(sources):,}",
             " + ".join(teachers), translator.decode_cfg.beam, translator.decode_cfg.alpha, translator.precision)
    work.mkdir(parents=True, exist_ok=True)
    if not marked(work, DISTILL):
        write_marker(work, DISTILL)
    texts, scores = _teacher_translations(translator, sources, work, tgt, teachers, args.chunk_lines)
    kept = [i for i, (t, q) in enumerate(zip(texts, scores)) if t and (args.min_logprob is None
                                                                          or q[0] >= args.min_logprob)]
    names = [f"teacher.{tgt}", "scores.tsv", f"train.{src}", f"train.{tgt}"]
    add_to_marker(work, DISTILL, names)
    atomic_write(work / names[0], "".join(t + "\n" for t in texts).encode())
    keep = set(kept)
    rows = [f"{q[0]:.4f}\t{q[1]:.4f}\t{int(i in keep)}" for i, q in enumerate(scores)]
    atomic_write(work / names[1], "".join(x + "\n" for x in ["mean_logprob\tlength_ratio\tkept", *rows]).encode())
    atomic_write(work / names[2], "".join(sources[i] + "\n" for i in kept).encode())
    atomic_write(work / names[3], "".join(texts[i] + "\n" for i in kept).encode())
    log.info("kept %s of %s teacher translations (%s)", f"{len(kept):,}", f"{len(texts):,}",
             f"mean log-probability >= {args.min_logprob}" if args.min_logprob is not None else "every non-empty one")
    splits["train"] = (work / names[2], work / names[3])
    manifest = prepare(splits, out, src, tgt, max_len=cfg.data.max_len, strict=cfg.data.strict, seed=cfg.train.seed,
                       dedup=cfg.data.dedup, max_ratio=cfg.data.max_ratio, vocabulary=translator.tokenizer.proto)
    shortlist = _shortlist(out, work, args.no_shortlist)
    print(f"distilled {out}: {manifest['splits']['train']['pairs']:,} training pairs from the teacher, in its "
          f"vocabulary of {manifest['vocab_size']:,}; the teacher's output in {work}")
    print(f"next: aiayn train --data {out} --run RUN --preset student"
          + (f"; aiayn translate ... --shortlist {shortlist}" if shortlist else ""))


def _teacher_translations(translator, sources: list[str], work: Path, tgt: str, teachers: list[str],
                          chunk_lines: int) -> tuple[list[str], list[tuple[float, float]]]:
    """The teacher's best translation of every source and its (mean log-probability, length ratio),
    a chunk at a time, each kept in work/teacher.TGT.parts/ as it is done (a rerun resumes there)."""
    from ..decode.quality import quality

    d = translator.decode_cfg
    key = {"teachers": [[str(t), digest(Path(t))] for t in teachers], "decode": dataclasses.asdict(d),
           "precision": translator.precision, "step": type(translator.search_model).__name__,
           "chunk_lines": chunk_lines, "what": "distill"}
    add_to_marker(work, DISTILL, [f"teacher.{tgt}.parts/"])
    parts = Parts(work / f"teacher.{tgt}", key)
    chunks = [sources[i:i + chunk_lines] for i in range(0, len(sources), chunk_lines)]
    texts: list[str] = []
    scores: list[tuple[float, float]] = []
    with tqdm(total=len(sources), desc="teacher", unit=" sentences", disable=None) as bar:
        for k, chunk in enumerate(chunks):
            record = parts.get(k, chunk)
            if record is None:
                ids = translator.encode_sources(chunk, first_line=k * chunk_lines + 1)
                hyps = translator.translate_ids(ids, d.beam, d.alpha)
                best = [h[0] if h else None for h in hyps]
                q = [quality(x, h, 0, None, d.beam, d.alpha) for x, h in zip(ids, best)]
                record = {"text": translator.tokenizer.decode([h.tokens if h else [] for h in best]),
                          "scores": [[x.mean_logprob, x.length_ratio] for x in q]}
                parts.put(k, chunk, record)
            texts += record["text"]
            scores += [(float(a), float(b)) for a, b in record["scores"]]
            bar.update(len(chunk))
    if len(texts) != len(sources) or len(scores) != len(sources):
        raise UserError(f"{parts.folder}: its parts do not cover the {len(sources)} sources; move it away and rerun")
    parts.finish()
    return texts, scores


def _shortlist(out: Path, work: Path, skip: bool) -> Path | None:
    """The student's decoding shortlist from its prepared data (decode/shortlist.py), in the work folder."""
    if skip:
        return None
    from ..decode.shortlist import build

    path = work / "shortlist.safetensors"
    add_to_marker(work, DISTILL, [path.name])
    build(out).save(path)
    return path


def add_distill(sub) -> None:
    """`aiayn distill` and its flags."""
    from .preparing import corpus_flags

    p = sub.add_parser("distill", help="sequence-level distillation: a teacher re-translates the training "
                                       "sources, the student's data is prepared from its output")
    p.add_argument("--teacher", action="append", required=True, metavar="CKPT", dest="checkpoint",
                   help="the teacher checkpoint (an averaged or tuned one, or `aiayn import hf`'s); repeat for an "
                        "ensemble of one vocabulary")
    corpus_flags(p)
    p.add_argument("-o", "--output", "--out", dest="out", required=True,
                   help="the student's prepared data (in the teacher's vocabulary)")
    p.add_argument("--work", help="the teacher's translations, scores, kept pairs and shortlist (default OUT.teacher)")
    p.add_argument("--beam", type=int, help="the teacher's beam (default: its checkpoint's, §6.1's 4)")
    p.add_argument("--alpha", type=float, help="the teacher's length penalty (default: its checkpoint's)")
    p.add_argument("--min-logprob", type=float, metavar="X",
                   help="keep a pair only when the teacher's mean log-probability per subword is at least X "
                        "(default: every non-empty translation; prepare's length-ratio filter applies either way)")
    p.add_argument("--chunk-lines", type=int, default=2000,
                   help="sources per resumable chunk (default 2000)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="the teacher's decoding precision (as translate's)")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--no-shortlist", action="store_true", help="do not build the student's decoding shortlist")
    preset_flag(p)
    p.add_argument("--config", help="YAML config (its data section: max_len, max_ratio, dedup)")
    p.set_defaults(func=cmd_distill, overrides=True)
