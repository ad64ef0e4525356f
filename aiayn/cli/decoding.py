"""`aiayn translate`, `tune`, `score`, `parse`: search and scores (§6.1, §6.3)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
import unicodedata
from pathlib import Path

from ..config import ConfigError
from ..files import atomic_write, check_output_file
from ..presets import DECODE_LIMITS
from .common import (
    UserError,
    input_chunks,
    name_the_flag,
    parse_numbers,
    read_input,
    refuse_parser,
    score_lines,
)
from .parts import Parts

log = logging.getLogger("aiayn")


STREAM_LINES = 5000  # sources translated at a time: batches sort within them (bf16 results depend on the batch)
_DECODE_FLAGS = {"decode.beam": "--beam", "decode.constraint_beam": "--constraint-beam", "decode.alpha": "--alpha",
                 "decode.max_len_b": "--max-len-b", "decode.nbest": "--nbest", "decode.max_tokens": "--max-tokens",
                 "decode.temperature": "--temperature", "decode.top_k": "--top-k", "decode.top_p": "--top-p",
                 "decode.sample": "--sample"}


def _interactive(translator, output: str | None) -> None:
    """stdin is a terminal: translate each line as soon as it is typed (n-best as TEXT<TAB>SCORE)."""
    out = open(output, "w") if output else sys.stdout
    print("aiayn: type a sentence and press Enter (Ctrl-D to end)", file=sys.stderr)
    try:
        for raw in sys.stdin:
            line = unicodedata.normalize("NFC", raw.rstrip("\r\n"))
            hyps = translator.hypotheses([line])[0]
            if translator.decode_cfg.nbest == 1:
                out.write((hyps[0].text if hyps else "") + "\n")
            else:
                out.writelines(f"{h.text}\t{h.score:.4f}\n" for h in hyps)
            out.flush()
    finally:
        if output:
            out.close()


def cmd_translate(args: argparse.Namespace, extra: list[str]) -> None:
    """§6.1: beam search (beam 4, alpha 0.6, max length input + 50) over raw text."""
    from ..decode.translator import Translator
    from ..extras import need

    if args.chunk_lines < 1:
        raise UserError(f"--chunk-lines must be at least 1, got {args.chunk_lines}")
    if args.document:
        need("pysbd", "document")  # before the model is loaded
    overrides = {k: v for k, v in {"beam": args.beam, "alpha": args.alpha, "max_len_b": args.max_len_b,
                                   "constraint_beam": args.constraint_beam,
                                   "nbest": args.nbest, "max_tokens": args.max_tokens, "step": args.step,
                                   "sample": args.sample or None, "temperature": args.temperature,
                                   "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed}.items()
                 if v is not None}
    refuse_parser(args.checkpoint, "translate")
    try:
        translator = Translator.load(args.checkpoint, device=args.device, precision=args.precision,
                                     compiled=args.compile, shortlist=args.shortlist, **overrides)
    except ConfigError as e:
        raise UserError(name_the_flag(str(e), _DECODE_FLAGS)) from None
    if args.tgt_lang:
        translator.tagged([], args.tgt_lang)  # a language the model does not know: one line, before any work
        translator.tgt_lang = args.tgt_lang
    if args.glossary:  # a bad line: one line naming it, before any work (decode/glossary.py)
        from ..decode.glossary import Glossary

        translator.glossary = Glossary.load(args.glossary)
    translator.compile_now()
    if args.output:  # before hours of translation, not after
        check_output_file(args.output, inputs=(args.input, args.ref, args.checkpoint, args.shortlist))
    if args.alignments:
        check_output_file(args.alignments, "--alignments", (args.input, args.ref, args.checkpoint, args.output))
    if args.quality:
        if translator.decode_cfg.nbest != 1 or args.document or args.markup:
            raise UserError("--quality reads one translation per line: not with --nbest, --document or --markup")
        check_output_file(args.quality, "--quality", (args.input, args.ref, args.checkpoint, args.output))
    if args.prefix and (args.document or args.markup or (args.input in (None, "-") and sys.stdin.isatty())):
        raise UserError("--prefix gives one prefix per input line: not with --document, --markup or typed input")
    if args.input in (None, "-") and sys.stdin.isatty() and not args.ref:
        _interactive(translator, args.output)
        return
    if args.document or args.markup:
        _document(translator, read_input(args.input), args)
        return
    chunks = input_chunks(args.input, args.chunk_lines)
    refs = read_input(args.ref) if args.ref else None
    args.prefixes = read_input(args.prefix) if args.prefix else None
    for given, name in ((refs, args.ref), (args.prefixes, args.prefix)):
        if given is not None:  # the line counts checked before hours of translation, not after
            lines = [x for c in chunks for x in c]
            if len(given) != len(lines):
                raise UserError(f"{args.input or '<stdin>'} has {len(lines)} lines but {name} has {len(given)}")
            chunks = [lines[i:i + args.chunk_lines] for i in range(0, len(lines), args.chunk_lines)]
    _translate_chunks(translator, chunks, args, refs)


def _translate_chunks(translator, chunks, args: argparse.Namespace, refs: list[str] | None) -> None:
    """A chunk at a time, in input order, each read as its input arrives: stdout gets each as it is done
    (`| head` ends it early, a pipe's output flows while its input does); --output, --alignments and
    --quality are written whole, atomically, at the end, the same text. With --output each finished
    chunk is kept in OUTPUT.parts/ (cli/parts.py): a run killed part-way resumes there."""
    from ..decode.quality import FIELDS

    start, n_lines, n_tok, align_s = time.perf_counter(), 0, 0, 0.0
    out_lines: list[str] = []
    links: list[str] = []
    signals: list[str] = []
    parts = Parts(Path(args.output), _parts_key(translator, args)) if args.output else None
    for k, chunk in enumerate(chunks):
        record = parts.get(k, chunk) if parts else None
        if record is None:
            record = _translate_chunk(translator, chunk, args, n_lines + 1)
            if parts:
                parts.put(k, chunk, record)
        n_lines, n_tok, align_s = n_lines + len(chunk), n_tok + record["tokens"], align_s + record["align_s"]
        if args.output or refs is not None:
            out_lines += record["text"]
        if not args.output:
            sys.stdout.write("".join(x + "\n" for x in record["text"]))
            sys.stdout.flush()
        links += record["links"]
        signals += record["quality"]
    seconds = time.perf_counter() - start - align_s
    if args.quality:
        atomic_write(Path(args.quality), "".join(x + "\n" for x in ["\t".join(FIELDS), *signals]).encode())
        log.info("quality signals of every translation -> %s (the flag's rule: decode/quality.py FLAG_RULES)",
                 args.quality)
    if args.alignments:
        atomic_write(Path(args.alignments), "".join(x + "\n" for x in links).encode())
        log.info("word alignments (Pharaoh i-j, source first) -> %s in %.1fs", args.alignments, align_s)
    if args.output:
        atomic_write(Path(args.output), "".join(x + "\n" for x in out_lines).encode())
        parts.finish()
    log.info("translated %d lines in %.1fs: %.1f sentences/s, %.0f target tokens/s", n_lines, seconds,
             n_lines / max(seconds, 1e-9), n_tok / max(seconds, 1e-9))
    if refs is not None:
        best = out_lines[::translator.decode_cfg.nbest]
        print(score_lines([x.split("\t")[0] for x in best], refs, "translation", args.ref), file=sys.stderr)


def _translate_chunk(translator, chunk: list[str], args: argparse.Namespace, first_line: int) -> dict:
    """One chunk's output lines, target tokens, word links (Pharaoh) and quality rows, as asked."""
    from ..decode.constraints import ConstraintError, check_constraints
    from ..decode.quality import quality
    from ..score import pharaoh

    ids = translator.encode_sources(chunk, first_line=first_line)
    beam, alpha = translator.setting_for(args.beam, args.alpha, None)  # --tgt-lang's tuned setting
    given = getattr(args, "prefixes", None)
    prefixes = None if given is None else translator.tokenizer.encode_target(
        given[first_line - 1:first_line - 1 + len(chunk)])  # decode/prefix.py
    terms = translator.terms(chunk)  # --glossary's (decode/glossary.py)
    if terms is not None:
        d = translator.decode_cfg
        check_constraints(terms, ids, d.max_len_a, d.max_len_b, prefixes, translator.shortlist is not None,
                          d.sample, first_line)
    try:
        hyps = translator.translate_ids(ids, beam, alpha, alignments=bool(args.alignments),
                                        progress=args.input not in (None, "-"), prefixes=prefixes, constraints=terms)
    except ConstraintError:
        raise
    except ValueError as e:  # a prefix too long for its output
        raise UserError(f"{args.prefix}: {e}") from None
    record = {"text": _output_lines(translator, hyps), "tokens": sum(len(h[0].tokens) + 1 for h in hyps if h),
              "links": [], "quality": [], "align_s": 0.0}
    if args.alignments or args.quality:
        began = time.perf_counter()
        here = translator.align(ids, hyps)
        record["align_s"] = time.perf_counter() - began
        record["links"] = [pharaoh(x) for x in here] if args.alignments else []
        if args.quality:  # decode/quality.py: signals and the flag, from the search and the alignment head
            d = translator.decode_cfg
            record["quality"] = [quality(x, h[0] if h else None, len(line.split()), lk, beam or d.beam,
                                         d.alpha if alpha is None else alpha).row()
                                 for x, h, line, lk in zip(ids, hyps, chunk, here)]
    return record


def _parts_key(translator, args: argparse.Namespace) -> dict:
    """What a chunk's translation depends on: the model's files, the decoding settings, the precision
    and step, the target language, the shortlist, what else is written, and the chunk size."""
    import dataclasses

    from ..files import digest

    def files(p: str | None) -> list:
        if not p:
            return []
        path = Path(p)
        found = sorted(path.rglob("*")) if path.is_dir() else [path]
        return [[str(f), digest(f)] for f in found if f.is_file()]

    return {"checkpoint": [files(c) for c in ([args.checkpoint] if isinstance(args.checkpoint, str)
                                               else args.checkpoint)],
            "shortlist": files(args.shortlist), "decode": dataclasses.asdict(translator.decode_cfg),
            "precision": translator.precision, "step": type(translator.search_model).__name__,
            "tgt_lang": args.tgt_lang, "beam": args.beam, "alpha": args.alpha, "alignments": bool(args.alignments),
            "quality": bool(args.quality), "chunk_lines": args.chunk_lines, "prefix": files(args.prefix),
            "glossary": files(args.glossary)}


def _output_lines(translator, hyps: list) -> list[str]:
    """One line per source (nbest 1), or nbest lines of TEXT<TAB>SCORE, padded with empty ones."""
    nbest, out = translator.decode_cfg.nbest, []
    for h in hyps:
        texts = translator.tokenizer.decode([x.tokens for x in h]) if h else []
        if nbest == 1:
            out.append(texts[0] if texts else "")
        else:
            out.extend(f"{t}\t{x.score:.4f}" for t, x in zip(texts, h))
            out.extend("\t" for _ in range(nbest - len(h)))
    return out


def _document(translator, lines: list[str], args: argparse.Namespace) -> None:
    """--document: each line a paragraph, split into sentences, translated, joined back; --markup:
    each line's tags put back around the aligned words."""
    from ..decode.document import translate_paragraphs
    from ..decode.markup import MarkupError, translate_markup

    if args.ref or args.alignments or translator.decode_cfg.nbest != 1 or (args.document and args.markup):
        raise UserError("--document and --markup write text lines: one of them, without --ref, --alignments "
                        "or --nbest")
    start = time.perf_counter()
    try:
        out = (translate_markup(translator, lines) if args.markup
               else translate_paragraphs(translator.translate, lines, args.src_lang))
    except MarkupError as e:
        raise UserError(f"{args.input or '<stdin>'}: {e}") from None
    text = "".join(x + "\n" for x in out)
    if args.output:
        atomic_write(Path(args.output), text.encode())
    else:
        sys.stdout.write(text)
    log.info("translated %d lines in %.1fs", len(lines), time.perf_counter() - start)


def cmd_tune(args: argparse.Namespace, extra: list[str]) -> None:
    """§6.1: choose beam size and alpha on the validation set; write them into a copy of the checkpoint."""
    from ..checkpoint import read_extra
    from ..decode.tune import tune
    from ..decode.tuned_precision import parse_precisions

    beams, alphas = parse_numbers(args.beams, int, "--beams"), parse_numbers(args.alphas, float, "--alphas")
    most_beam, most_alpha = DECODE_LIMITS["beam"], DECODE_LIMITS["alpha"]
    if any(not 1 <= b <= most_beam for b in beams) or any(not 0 <= a <= most_alpha for a in alphas):
        raise UserError(f"--beams must be in [1, {most_beam}] and --alphas in [0, {most_alpha:g}]; "
                        f"got {args.beams}, {args.alphas}")
    refuse_parser(args.checkpoint, "tune")
    precisions = parse_precisions(args.precisions, args.precision_tolerance)
    best, points, out = tune(args.checkpoint, args.data, beams, alphas, args.sentences, args.precision, args.output,
                             args.device, precisions, args.precision_tolerance)
    print(f"{'beam':>4} {'alpha':>5} {'valid BLEU':>10} {'BP':>6}")
    for p in points:
        mark = "  <- chosen" if p is best else ""
        print(f"{p.beam:>4} {p.alpha:>5.2f} {p.bleu:>10.2f} {p.bp:>6.3f}{mark}")
    choice = read_extra(out)["tuned"].get("precision_choice")
    if choice:
        print(f"{'precision':>9} {'valid BLEU':>10} {'sentences/s':>11}")
        for r in choice["measured"]:
            mark = "  <- auto takes it on this processor class" if r["precision"] == choice["chosen"] else ""
            print(f"{r['precision']:>9} {r['bleu']:>10.2f} {r['sentences_per_s']:>11.1f}{mark}")
    print(f"beam {best.beam}, alpha {best.alpha:g} -> {out} (translate, serve and Translator use them by default)")


def cmd_parse(args: argparse.Namespace, extra: list[str]) -> None:
    """§6.3: sentences (words separated by spaces) in, one well-formed tree per line out."""
    from ..parsing.trees import TreeError
    from ..parsing.treesearch import Parser

    decode = {k: v for k, v in (("beam", args.beam), ("alpha", args.alpha)) if v is not None}
    try:
        parser = Parser.load(args.checkpoint, device=args.device, free=args.free, **decode)
    except (ConfigError, TreeError) as e:
        raise UserError(str(e)) from None
    lines = read_input(args.input)
    if args.output:
        check_output_file(args.output, inputs=(args.input, args.checkpoint))
    start = time.perf_counter()
    trees = parser.parse(lines, progress=sys.stderr.isatty())
    out = "".join(f"{t}\n" if t is not None else "\n" for t in trees)
    if args.output:
        atomic_write(Path(args.output), out.encode())
    else:
        sys.stdout.write(out)
    d = parser.translator.decode_cfg
    log.info("parsed %d sentences in %.1fs (beam %d, alpha %g)", len(lines), time.perf_counter() - start,
             d.beam, d.alpha)


def add_translate(sub) -> None:
    """`aiayn translate` and its flags."""
    p = sub.add_parser("translate", help="translate raw text with beam search (§6.1)")
    p.add_argument("--checkpoint", required=True, nargs="+",
                   help="a .safetensors model from train or average; several of one vocabulary decode as an "
                        "ensemble (the mean of their log-probabilities at every step)")
    p.add_argument("-i", "--input", help="input file (default: standard input, read as it arrives: "
                   f"{STREAM_LINES:,} lines at a time, or all first with --ref, --document or --markup)")
    p.add_argument("-o", "--output", help="output file, written when all is translated (default: standard output, "
                   f"{STREAM_LINES:,} sentences at a time as they are done)")
    p.add_argument("--ref", help="reference file: print sacreBLEU BLEU and chrF to stderr")
    p.add_argument("--document", action="store_true",
                   help="each input line is a paragraph: split into sentences (pysbd), translated, joined back")
    p.add_argument("--markup", action="store_true", help="lines with inline tags (<b>, <a href=..>, <x id=1/>, "
                   "**, `): translated without them, each put back around the aligned words (see `aiayn align`)")
    p.add_argument("--src-lang", default="en", help="--document: the source language's sentence rules (default en)")
    p.add_argument("--tgt-lang", metavar="LANG", help="the target language of a multilingual model (an imported "
                   "OPUS-MT model's >>LANG<< code, e.g. fra); a language it does not know is refused, naming those "
                   "it does")
    p.add_argument("--alignments", metavar="FILE", help="word alignments of each line with its translation, Pharaoh "
                   "i-j (source word i, target word j), from the head `aiayn align` chose")
    p.add_argument("--chunk-lines", type=int, default=STREAM_LINES, metavar="N",
                   help=f"lines translated at a time (default {STREAM_LINES}): with --output each finished chunk "
                        "is kept in OUTPUT.parts/, so a run killed part-way resumes at its first unfinished one")
    p.add_argument("--prefix", metavar="FILE",
                   help="target text each translation must start with, one line per input line (empty: none); the "
                        "search goes on from it (decode/prefix.py)")
    p.add_argument("--glossary", metavar="FILE", help="TSV lines `source term<TAB>target term`: a line holding a "
                   "source term (whole words, any case) is translated with its target term (constrained beam search)")
    p.add_argument("--quality", metavar="FILE",
                   help="a TSV of each translation's confidence: mean subword log-probability, the search's score, "
                        "length ratio, repeats, source coverage by the alignment head, and a flag for a likely failure "
                        "(its rule: decode/quality.py)")
    p.add_argument("--beam", type=int, help="beam size (default 4; 1 = greedy)")
    p.add_argument("--constraint-beam", type=int, help="beam of the lines holding --glossary terms (default 2 x beam)")
    p.add_argument("--sample", action="store_true",
                   help="draw each next token from the model's distribution instead of searching (back-translation; "
                        "the same sentence gets the same draw alone or in a batch, for one --seed)")
    p.add_argument("--temperature", type=float, help="--sample: log-probabilities divided by T (default 1)")
    p.add_argument("--top-k", type=int, help="--sample: only the k most probable tokens (default 0: all)")
    p.add_argument("--top-p", type=float, help="--sample: only the most probable tokens holding this much of the "
                                               "probability (default 1: all)")
    p.add_argument("--seed", type=int, help="--sample: the seed of the draws (default 1)")
    p.add_argument("--alpha", type=float, help="length penalty alpha (default 0.6)")
    p.add_argument("--max-len-b", type=int, help="max output length = input length + B (default 50)")
    p.add_argument("--nbest", type=int, help="hypotheses per line, written as TEXT<TAB>SCORE")
    p.add_argument("--max-tokens", type=int, help="source tokens per batch (default: 16384 on a GPU, 4096 on a CPU)")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="auto (default): bf16 where the processor computes it natively (AVX-512 BF16, AMX, recent "
                        "GPUs), else fp32; int8: quantized projections, CPU only")
    p.add_argument("--compile", action="store_true",
                   help="run the decoder step under torch.compile: faster on CPU once compiled, which takes "
                        "1-2 minutes at start (bench/decode/decode_speed.py measures both; default: off)")
    p.add_argument("--shortlist", help="a file of `aiayn shortlist`: each sentence's output layer and softmax "
                                       "run over its own likely target subwords (faster; default: all of them)")
    p.add_argument("--step", choices=["auto", "modules", "fused", "compiled", "graphed"],
                   help="decode.step: the decoder step (default: the checkpoint's, auto: fused, compiled with "
                        "--compile); modules: the model's own modules; graphed: one CUDA graph a step")
    p.set_defaults(func=cmd_translate)


def add_tune(sub) -> None:
    """`aiayn tune` and its flags."""
    p = sub.add_parser("tune", help="choose beam size and alpha on the validation set (§6.1)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", help="prepared data folder (default: the run's, from run.json beside the checkpoint)")
    p.add_argument("--beams", default="2,4,6", help="beam sizes to try (default 2,4,6)")
    p.add_argument("--alphas", default="0,0.3,0.6,1,1.5,2", help="length penalties to try (default 0,0.3,0.6,1,1.5,2)")
    p.add_argument("--sentences", type=int, default=0, help="only the first N validation sentences (0: all)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="the grid's precision (auto: the default rule, then --precisions are timed)")
    p.add_argument("--precisions", default="auto",
                   help="with --precision auto, precisions timed at the chosen setting, the fastest within "
                        "--precision-tolerance recorded for auto on this processor class (auto: those it runs "
                        "natively; none: no choice)")
    p.add_argument("--precision-tolerance", type=float, default=0.2,
                   help="validation BLEU a faster precision may lose against fp32's (default 0.2)")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("-o", "--output", help="the tuned copy (default: CHECKPOINT.tuned.safetensors)")
    p.set_defaults(func=cmd_tune)


def add_parse(sub) -> None:
    """`aiayn parse` and its flags."""
    p = sub.add_parser("parse", help="constituency parsing with a model trained on --task parse data (§6.3)")
    p.add_argument("--checkpoint", required=True, nargs="+",
                   help="a .safetensors parser; several trained on the same data decode as an ensemble")
    p.add_argument("-i", "--input", help="sentences, words separated by spaces (default: standard input)")
    p.add_argument("-o", "--output", help="trees, one per line (default: standard output)")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--free", action="store_true",
                   help="search without the tree constraint (repair alone makes the output a tree over the words)")
    p.add_argument("--beam", type=int, help="beam size (default: the checkpoint's decode.beam)")
    p.add_argument("--alpha", type=float, help="length penalty alpha (default: the checkpoint's decode.alpha)")
    p.set_defaults(func=cmd_parse)
