"""`aiayn` command line: prepare, train, average, translate, score, plot, serve, export, params."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import torch

from .checkpoint import CheckpointError
from .config import PAPER_PARAMS_M, PRESETS, Config, ConfigError, apply_overrides, load_yaml, preset
from .data import DataError
from .files import FileError, atomic_write, check_output_file, check_output_folder
from .tokenizer import TokenizerError

log = logging.getLogger("aiayn")


class UserError(Exception):
    """An error caused by the user's input; printed as one line, exit status 2."""


# -- helpers -------------------------------------------------------------------------------
def _parse_overrides(extra: list[str]) -> dict[str, str]:
    """`--train.lr_scale 2 --model.N=4` -> {"train.lr_scale": "2", "model.N": "4"}."""
    out: dict[str, str] = {}
    i = 0
    while i < len(extra):
        arg = extra[i]
        if not arg.startswith("--") or "." not in arg:
            raise UserError(f"unrecognized argument {arg!r} (config overrides look like --train.lr_scale 2)")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        else:
            if i + 1 >= len(extra):
                raise UserError(f"override {arg} needs a value")
            i += 1
            value = extra[i]
        out[key] = value
        i += 1
    return out


def build_config(args: argparse.Namespace, extra: list[str]) -> Config:
    cfg = preset(args.preset) if getattr(args, "preset", None) else Config()
    if getattr(args, "config", None):
        cfg = load_yaml(args.config, cfg)
    return apply_overrides(cfg, _parse_overrides(extra)).validate()


def count_parameters(name: str, vocab_size: int) -> int:
    """Exact trainable-parameter count of a preset at a vocabulary size (built on the meta device)."""
    from .models import build_model

    cfg = preset(name).model
    cfg.vocab_size = vocab_size
    with torch.device("meta"):
        model = build_model(cfg)
    return sum(p.numel() for p in model.parameters())


# -- commands ------------------------------------------------------------------------------
def cmd_params(args: argparse.Namespace, extra: list[str]) -> None:
    """Parameter counts of the paper's configurations beside Table 3."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    if args.vocab_size <= 0:
        raise UserError(f"--vocab-size must be positive, got {args.vocab_size}")
    if args.preset:
        n = count_parameters(args.preset, args.vocab_size)
        paper = PAPER_PARAMS_M.get(args.preset)
        if paper:
            print(f"{args.preset}: {n / 1e6:.1f}M (paper {paper}M, {100 * (n / 1e6 - paper) / paper:+.1f}%)")
        print(n)
        return
    names = [n for n in PRESETS if n == "base" or n == "big" or n.startswith("table3")]
    print(f"parameters at a shared vocabulary of {args.vocab_size} (tied embeddings, biased projections)")
    print(f"{'preset':<22}{'params':>14}{'M':>9}{'paper M':>9}{'diff':>8}")
    for name in names:
        n = count_parameters(name, args.vocab_size)
        paper = PAPER_PARAMS_M.get(name)
        diff = f"{100 * (n / 1e6 - paper) / paper:+.1f}%" if paper else ""
        print(f"{name:<22}{n:>14,}{n / 1e6:>9.1f}{paper if paper else '':>9}{diff:>8}")


def _prepare_parse(args: argparse.Namespace, cfg: Config) -> None:
    """§6.3: the treebank's splits as words -> linearized trees, prepared like a corpus."""
    from .data import is_prepared, prepare
    from .parse import TreeError, write_splits

    if not args.treebank:
        raise UserError("prepare --task parse needs --treebank PATH (a folder of .mrg files or treebank.zip)")
    out = check_output_folder(args.out, is_prepared)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".trees", dir=out.parent) as tmp:
        try:
            files = write_splits(Path(args.treebank), Path(tmp))
        except TreeError as e:
            raise UserError(str(e)) from None
        symbols = {"▁" + x for line in files["train"][1].read_text().split("\n") for x in line.split() if x != "XX"}
        manifest = prepare(files, out, "words", "parse", cfg.data.vocab_size, cfg.data.max_len,
                           cfg.data.strict or args.strict, cfg.train.seed, tuple(symbols),
                           dedup=False, max_ratio=0.0, carry=Path(tmp))  # trees outgrow their sentences
    print(json.dumps(manifest["splits"], indent=1))


def cmd_prepare(args: argparse.Namespace, extra: list[str]) -> None:
    """Validate parallel text, learn the joint BPE vocabulary (§5.1), cache every split."""
    from .corpora import CORPORA, cache_dir, check_mirror, fetch_multi30k, fetch_wmt14, verify_multi30k
    from .data import find_file, is_prepared, prepare

    cfg = build_config(args, extra)
    if args.task == "parse":  # §6.3: words -> linearized trees, from a treebank
        _prepare_parse(args, cfg)
        return
    check_output_folder(args.out, is_prepared)  # before any download or reading
    if not args.src or not args.tgt:
        raise UserError("prepare needs --src and --tgt (language suffixes of the files, e.g. en and de)")
    data_dir = args.data_dir
    names = {"train": args.train, "valid": args.valid}
    tests = args.test
    if args.corpus:
        spec = CORPORA[args.corpus]
        if data_dir is None and os.environ.get(spec["env"]):
            data_dir = Path(os.environ[spec["env"]])
        check_mirror(args.mirror)
        if args.corpus == "wmt14-en-de":  # archives (local or downloaded) -> extracted text in the cache
            data_dir = fetch_wmt14(args.src, args.tgt, cache_dir(), data_dir, args.mirror, args.trust_local)
        elif data_dir is None:
            data_dir = fetch_multi30k(args.src, args.tgt, cache_dir())
        else:
            verify_multi30k(Path(data_dir), args.src, args.tgt, args.trust_local)
        names = {"train": args.train or spec["train"], "valid": args.valid or spec["valid"]}
        tests = tests or list(spec["test"])
    names = {"train": names["train"] or "train", "valid": names["valid"] or "valid"}
    tests = tests or []
    splits: dict[str, tuple[Path, Path]] = {}

    def resolve(value: str) -> tuple[Path, Path]:
        if "," in value:  # explicit files: SRC_FILE,TGT_FILE
            s, t = value.split(",", 1)
            for f in (s, t):
                if not Path(f).is_file():
                    raise UserError(f"file not found: {f}")
            return Path(s), Path(t)
        prefix = Path(value) if data_dir is None else Path(data_dir) / value
        return find_file(prefix, args.src), find_file(prefix, args.tgt)

    for key, value in names.items():
        splits[key] = resolve(value)
    for value in tests:
        try:
            pair = resolve(value)
        except DataError as e:
            if args.corpus:  # e.g. Multi30k's test_2017 has no Czech side
                log.warning("skipping test set %s: %s", value, e)
                continue
            raise
        splits[Path(value.split(",")[0]).name.split(".")[0]] = pair
    manifest = prepare(splits, Path(args.out), args.src, args.tgt, cfg.data.vocab_size, cfg.data.max_len,
                       cfg.data.strict or args.strict, cfg.train.seed, dedup=cfg.data.dedup,
                       max_ratio=cfg.data.max_ratio)
    print(json.dumps(manifest["splits"], indent=1))


def cmd_train(args: argparse.Namespace, extra: list[str]) -> None:
    """Train (§5), or continue a run with --resume RUN_DIR."""
    from .train import train

    if args.resume:
        train(None, Path(args.data) if args.data else None, Path(args.resume), resume=True, device=args.device,
              overrides=_parse_overrides(extra), force_batching=args.force_batching)
        return
    if not args.data or not args.run:
        raise UserError("train needs --data PREPARED_DIR and --run-dir RUN_DIR (or --resume RUN_DIR)")
    train(build_config(args, extra), Path(args.data), Path(args.run), device=args.device)


def cmd_average(args: argparse.Namespace, extra: list[str]) -> None:
    """§6.1: average the last N checkpoints of a run into one model file."""
    from .checkpoint import list_checkpoints, write_averaged

    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    if not args.run_dir:
        raise UserError("average needs a run folder: aiayn average RUN_DIR -o OUT (or --run-dir RUN_DIR)")
    paths = list_checkpoints(Path(args.run_dir))
    if not paths:
        raise UserError(f"{args.run_dir}: no checkpoints found (expected checkpoints/step-*.safetensors)")
    if args.last is None:  # the run's own rotation: 5 for base, 20 for big (§6.1)
        try:
            args.last = load_yaml(Path(args.run_dir) / "config.yaml").train.keep_last
        except ConfigError:
            args.last = 5
    if args.last < 1:
        raise UserError(f"--last must be >= 1, got {args.last}")
    if len(paths) < args.last:
        log.warning("only %d checkpoints in %s; averaging them all", len(paths), args.run_dir)
    chosen = paths[-args.last:]
    check_output_file(args.output)
    write_averaged(chosen, Path(args.output))
    print(f"averaged {len(chosen)} checkpoints ({chosen[0].name} .. {chosen[-1].name}) -> {args.output}")


def _read_input(path: str | None) -> list[str]:
    if path in (None, "-"):
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        p = Path(path)
        if not p.exists() or p.is_dir():
            raise UserError(f"input file not found: {path}")
        data, name = p.read_bytes(), path
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UserError(f"{name}:{line}: invalid UTF-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [unicodedata.normalize("NFC", x.rstrip("\r")) for x in lines]


def _score_lines(hyps: list[str], refs: list[str], hyp_name: str, ref_name: str) -> str:
    from .score import score

    if len(hyps) != len(refs):
        raise UserError(f"{hyp_name} has {len(hyps)} lines but {ref_name} has {len(refs)}")
    return score(hyps, refs)


_DECODE_FLAGS = {"decode.beam": "--beam", "decode.alpha": "--alpha", "decode.max_len_b": "--max-len-b",
                 "decode.nbest": "--nbest", "decode.max_tokens": "--max-tokens"}


def _name_the_flag(message: str, flags: dict[str, str]) -> str:
    """Put the flag the user typed in front of an error about the config key behind it."""
    for key, flag in flags.items():
        if message.startswith(key + " ") or message.startswith(key + ":"):
            return f"{flag}: {message}"
    return message


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
    from .translate import Translator

    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    overrides = {k: v for k, v in {"beam": args.beam, "alpha": args.alpha, "max_len_b": args.max_len_b,
                                   "nbest": args.nbest, "max_tokens": args.max_tokens}.items() if v is not None}
    try:
        translator = Translator.load(args.checkpoint, device=args.device, precision=args.precision, **overrides)
    except ConfigError as e:
        raise UserError(_name_the_flag(str(e), _DECODE_FLAGS)) from None
    if args.output:  # before hours of translation, not after
        check_output_file(args.output)
    if args.input in (None, "-") and sys.stdin.isatty() and not args.ref:
        _interactive(translator, args.output)
        return
    lines = _read_input(args.input)
    refs = _read_input(args.ref) if args.ref else None
    if refs is not None and len(refs) != len(lines):  # before hours of translation, not after
        raise UserError(f"{args.input or '<stdin>'} has {len(lines)} lines but {args.ref} has {len(refs)}")
    start = time.perf_counter()
    ids = translator.encode_sources(lines)
    hyps = translator.translate_ids(ids, progress=args.input not in (None, "-") and sys.stderr.isatty())
    seconds = time.perf_counter() - start
    nbest = translator.decode_cfg.nbest
    out_lines = []
    for h in hyps:
        texts = translator.tokenizer.decode([x.tokens for x in h]) if h else []
        if nbest == 1:
            out_lines.append(texts[0] if texts else "")
        else:
            out_lines.extend(f"{t}\t{x.score:.4f}" for t, x in zip(texts, h))
            out_lines.extend("\t" for _ in range(nbest - len(h)))
    out_text = "".join(x + "\n" for x in out_lines)
    if args.output:
        atomic_write(Path(args.output), out_text.encode())
    else:
        sys.stdout.write(out_text)
    n_tok = sum(len(h[0].tokens) + 1 for h in hyps if h)
    log.info("translated %d lines in %.1fs: %.1f sentences/s, %.0f target tokens/s", len(lines), seconds,
             len(lines) / seconds, n_tok / seconds)
    if refs is not None:
        best = out_lines if nbest == 1 else [h for h in out_lines[::nbest]]
        print(_score_lines([x.split("\t")[0] for x in best], refs, "translation", args.ref), file=sys.stderr)


def _numbers(text: str, kind: type, flag: str) -> tuple:
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise UserError(f"{flag}: no values in {text!r}")
    return values


def cmd_tune(args: argparse.Namespace, extra: list[str]) -> None:
    """§6.1: choose beam size and alpha on the validation set; write them into a copy of the checkpoint."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    from .tune import tune

    beams, alphas = _numbers(args.beams, int, "--beams"), _numbers(args.alphas, float, "--alphas")
    if any(b < 1 for b in beams) or any(not (math.isfinite(a) and a >= 0) for a in alphas):
        raise UserError("--beams must be >= 1 and --alphas finite and >= 0")
    best, points, out = tune(args.checkpoint, args.data, beams, alphas, args.sentences, args.precision, args.output,
                             args.device)
    print(f"{'beam':>4} {'alpha':>5} {'valid BLEU':>10} {'BP':>6}")
    for p in points:
        mark = "  <- chosen" if p is best else ""
        print(f"{p.beam:>4} {p.alpha:>5.2f} {p.bleu:>10.2f} {p.bp:>6.3f}{mark}")
    print(f"beam {best.beam}, alpha {best.alpha:g} -> {out} (translate, serve and Translator use them by default)")


def cmd_score(args: argparse.Namespace, extra: list[str]) -> None:
    """sacreBLEU BLEU and chrF of detokenized hypotheses against references; with --parse,
    EVALB-style labeled bracketing F1 of trees (§6.3)."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    if args.parse or args.right_branching:
        from .parse import TreeError, evalb, read_trees, right_branching

        try:
            gold = read_trees("\n".join(_read_input(args.ref)), args.ref)
            if args.right_branching:
                test = [right_branching(g.words()) for g in gold]
            elif args.hyp:
                test = read_trees("\n".join(_read_input(args.hyp)), args.hyp)
            else:
                raise UserError("score --parse needs --hyp TREES (or --right-branching for the baseline)")
            print(evalb(gold, test))
            if args.right_branching:
                print(f"unlabeled: {evalb(gold, test, labeled=False)}")
        except TreeError as e:
            raise UserError(str(e)) from None
        return
    if not args.hyp:
        raise UserError("score needs --hyp FILE")
    hyps, refs = _read_input(args.hyp), _read_input(args.ref)
    print(_score_lines(hyps, refs, args.hyp, args.ref))
    if args.paper:
        from .score import paper_score

        print(paper_score(hyps, refs, args.lang))


def cmd_parse(args: argparse.Namespace, extra: list[str]) -> None:
    """§6.3: sentences (words separated by spaces) in, one well-formed tree per line out."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    from .parse import LeafCounting, TreeError, trees_from_output
    from .translate import Translator

    try:
        translator = Translator.load(args.checkpoint, device=args.device)
        if not args.free:  # one XX leaf per input word, enforced during the search
            translator.model = LeafCounting(translator.model, translator.tokenizer).eval()
    except (ConfigError, TreeError) as e:
        raise UserError(str(e)) from None
    lines = _read_input(args.input)
    if args.output:
        check_output_file(args.output)
    start = time.perf_counter()
    trees = trees_from_output(translator.translate(lines, progress=sys.stderr.isatty()), lines)
    out = "".join(f"{t}\n" if line.split() else "\n" for t, line in zip(trees, lines))
    if args.output:
        atomic_write(Path(args.output), out.encode())
    else:
        sys.stdout.write(out)
    log.info("parsed %d sentences in %.1fs (beam %d, alpha %g)", len(lines), time.perf_counter() - start,
             translator.decode_cfg.beam, translator.decode_cfg.alpha)


def cmd_plot(args: argparse.Namespace, extra: list[str]) -> None:
    """Attention maps (Figures 3-5) or training curves."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    from .apps.plot import plot_attention, plot_curves
    from .translate import attention_data

    if args.what == "curves":
        if not args.run_dir:
            raise UserError("plot curves needs a RUN_DIR")
        check_output_file(args.output)
        try:
            out = plot_curves(Path(args.run_dir), Path(args.output))
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from None
        print(f"wrote {out}")
        return
    if not args.checkpoint or args.src is None:
        raise UserError("plot attention needs --checkpoint FILE and --src SENTENCE")
    if not args.src.strip():
        raise UserError("--src is empty")
    from .apps.plot import is_attention_maps
    from .checkpoint import load_checkpoint

    check_output_folder(args.output, is_attention_maps)  # before the model is loaded and run
    model, cfg, tokenizer, _ = load_checkpoint(Path(args.checkpoint))
    data = attention_data(model, tokenizer, args.src, args.tgt, cfg.decode)
    files = plot_attention(data, Path(args.output))
    print(f"target: {data.translation}")
    print(f"wrote {len(files)} files to {args.output}")


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> None:
    """HTTP API (FastAPI) and a page to try the model."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    from .apps.serve import Limits, serve

    names = ("max_sentences", "max_chars", "max_subwords", "max_queue", "max_work", "max_attention_subwords",
             "timeout", "read_timeout", "limit_concurrency", "keep_alive")
    for name in names:
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)) and not (name == "max_subwords" and value == 0):
            raise UserError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    limits = Limits(max_sentences=args.max_sentences, max_chars=args.max_chars, max_subwords=args.max_subwords,
                    max_queue=args.max_queue, max_work=args.max_work,
                    max_attention_subwords=args.max_attention_subwords, timeout_s=args.timeout,
                    read_timeout_s=args.read_timeout, limit_concurrency=args.limit_concurrency,
                    keep_alive_s=args.keep_alive)
    serve(args.checkpoint, args.host, args.port, args.device, limits, args.precision)


def cmd_export(args: argparse.Namespace, extra: list[str]) -> None:
    """Write a Hugging Face MarianMTModel directory, or a CTranslate2 model made from it."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    from .apps.export import ExportError, export_ct2, export_hf

    if args.quantization and args.format != "ct2":
        raise UserError("--quantization applies to `export ct2` only")
    from .apps.export import is_export

    check_output_folder(args.output, is_export)
    try:
        if args.format == "hf":
            out = export_hf(Path(args.checkpoint), Path(args.output))
            print(f"wrote {out} (load with transformers.MarianMTModel / MarianTokenizer .from_pretrained)")
        else:
            out = export_ct2(Path(args.checkpoint), Path(args.output), args.quantization)
            print(f"wrote {out} (load with ctranslate2.Translator; subwords with {out}/source.spm)")
    except ExportError as e:
        raise UserError(str(e)) from None


def cmd_config(args: argparse.Namespace, extra: list[str]) -> None:
    """Print the resolved config (preset, YAML, overrides) as YAML, usable as --config."""
    import yaml

    cfg = build_config(args, extra)
    sys.stdout.write(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def config_epilog() -> str:
    """Every config key with its default, by section, for `--help`."""
    from .config import config_keys

    lines, section = ["config keys (override with --KEY VALUE, e.g. --train.lr_scale 2; `aiayn config` "
                      "prints a resolved config):"], ""
    for key, value in config_keys().items():
        if key.split(".")[0] != section:
            section = key.split(".")[0]
            lines.append(f"  {section}:")
        lines.append(f"    {key} = {value!r}")
    return "\n".join(lines)


def cmd_reproduce(args: argparse.Namespace, extra: list[str]) -> None:
    """Run a suite of the paper's experiments at small scale and render the report."""
    if extra:
        raise UserError(f"unrecognized arguments: {' '.join(extra)}")
    from .evidence.report import is_report, render
    from .evidence.suites import reproduce

    work = Path(args.work)
    report = Path(args.report) if args.report else (work / "quick-report" if args.suite == "quick"
                                                    else Path("docs/reproduction"))
    command = "aiayn " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("aiayn") else ""
    for name in ("steps", "warmup", "seeds"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not (args.minutes > 0 and math.isfinite(args.minutes)):
        raise UserError(f"--minutes must be a positive number, got {args.minutes}")
    check_output_folder(report, is_report, "--report")
    if args.render_only:
        from .evidence.suites import planned

        out = render(report, command, planned(report))
    else:
        rows = [r for r in args.rows.split(",") if r] if args.rows else None
        out = reproduce(args.suite, Path(args.data) if args.data else None, work, report, rows, args.steps,
                        args.warmup, args.minutes, args.seeds, args.device, command)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="aiayn", description="The Transformer of Attention Is All You Need.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"aiayn {__version__} (torch {torch.__version__})")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("params", help="parameter counts of base, big and every Table 3 row")
    p.add_argument("--preset", choices=list(PRESETS), help="one preset; prints the exact count last")
    p.add_argument("--vocab-size", type=int, default=37000)
    p.set_defaults(func=cmd_params)

    p = sub.add_parser("prepare", help="validate parallel text, learn joint BPE, cache subwords")
    p.add_argument("--data-dir", help="folder with {split}.{lang}[.gz] files")
    p.add_argument("--corpus", choices=["multi30k", "wmt14-en-de"],
                   help="a public corpus, downloaded unless --data-dir or its environment variable (AIAYN_MULTI30K, "
                        "AIAYN_WMT14) points to a local copy; wmt14-en-de: a folder of the official .tgz archives")
    p.add_argument("--mirror", help="wmt14-en-de: download the archives from this URL prefix instead of statmt.org")
    p.add_argument("--trust-local", action="store_true",
                   help="--corpus with a local copy: use files whose checksum differs from the published one "
                        "(refused otherwise)")
    p.add_argument("--task", choices=["translate", "parse"], default="translate",
                   help="parse: words -> linearized trees from --treebank (§6.3)")
    p.add_argument("--treebank", help="--task parse: a folder of .mrg files or NLTK's treebank.zip")
    p.add_argument("--src", help="source language suffix, e.g. en")
    p.add_argument("--tgt", help="target language suffix, e.g. de")
    p.add_argument("--train", help="train split name/prefix, or SRC_FILE,TGT_FILE")
    p.add_argument("--valid", help="validation split name/prefix, or SRC_FILE,TGT_FILE")
    p.add_argument("--test", action="append", help="test split (repeatable)")
    p.add_argument("-o", "--output", "--out", dest="out", required=True, help="output folder for the prepared data")
    p.add_argument("--strict", action="store_true",
                   help="fail on an empty line (instead of dropping the pair) and on a vocabulary smaller than "
                        "asked (instead of a warning)")
    p.add_argument("--preset", choices=list(PRESETS))
    p.add_argument("--config", help="YAML config")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train a model (config overrides: --train.lr_scale 2 ...)",
                       epilog=config_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="prepared data folder (from `aiayn prepare`)")
    p.add_argument("--run-dir", "--run", dest="run",
                   help="run folder for config, logs, metrics and checkpoints (under torchrun, spell it --run-dir)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--preset", choices=list(PRESETS))
    p.add_argument("--config", help="YAML config")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--force-batching", action="store_true",
                   help="with --resume: accept changed data.max_tokens / train.seed / data by continuing from the "
                        "start of the next epoch (otherwise such a resume is refused)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("average", help="average the last checkpoints of a run (§6.1)")
    p.add_argument("run_dir", nargs="?", help="run folder (or --run-dir)")
    p.add_argument("--run-dir", "--run", dest="run_dir_flag", help="run folder")
    p.add_argument("--last", type=int, help="how many of the last checkpoints (default: the run's train.keep_last, "
                   "5 for base and 20 for big, §6.1)")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_average)

    p = sub.add_parser("translate", help="translate raw text with beam search (§6.1)")
    p.add_argument("--checkpoint", required=True, help="a .safetensors model from train or average")
    p.add_argument("-i", "--input", help="input file (default: standard input)")
    p.add_argument("-o", "--output", help="output file (default: standard output)")
    p.add_argument("--ref", help="reference file: print sacreBLEU BLEU and chrF to stderr")
    p.add_argument("--beam", type=int, help="beam size (default 4; 1 = greedy)")
    p.add_argument("--alpha", type=float, help="length penalty alpha (default 0.6)")
    p.add_argument("--max-len-b", type=int, help="max output length = input length + B (default 50)")
    p.add_argument("--nbest", type=int, help="hypotheses per line, written as TEXT<TAB>SCORE")
    p.add_argument("--max-tokens", type=int, help="source tokens per batch")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="auto (default): bf16 where the processor computes it natively (AVX-512 BF16, AMX, recent "
                        "GPUs), else fp32; int8: quantized projections, CPU only")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("tune", help="choose beam size and alpha on the validation set (§6.1)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", help="prepared data folder (default: the run's, from run.json beside the checkpoint)")
    p.add_argument("--beams", default="2,4,6", help="beam sizes to try (default 2,4,6)")
    p.add_argument("--alphas", default="0,0.3,0.6,1,1.5,2", help="length penalties to try (default 0,0.3,0.6,1,1.5,2)")
    p.add_argument("--sentences", type=int, default=0, help="only the first N validation sentences (0: all)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("-o", "--output", help="the tuned copy (default: CHECKPOINT.tuned.safetensors)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("score", help="sacreBLEU BLEU and chrF; --parse: EVALB bracketing F1 of trees")
    p.add_argument("--hyp", help="hypotheses (one per line)")
    p.add_argument("--ref", required=True, help="references (one per line)")
    p.add_argument("--parse", action="store_true", help="score trees: labeled bracketing F1, EVALB COLLINS.prm")
    p.add_argument("--right-branching", action="store_true",
                   help="with --parse: score the right-branching baseline built from --ref's words")
    p.add_argument("--paper", action="store_true",
                   help="also the paper's tokenized BLEU (Moses tokenizer, compound splitting, multi-bleu, as "
                        "tensor2tensor's get_ende_bleu); not comparable to sacreBLEU")
    p.add_argument("--lang", default="de", help="with --paper: the target language for the Moses tokenizer")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("parse", help="constituency parsing with a model trained on --task parse data (§6.3)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("-i", "--input", help="sentences, words separated by spaces (default: standard input)")
    p.add_argument("-o", "--output", help="trees, one per line (default: standard output)")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--free", action="store_true",
                   help="do not make the search output one leaf per input word (repair alone fixes the tree)")
    p.set_defaults(func=cmd_parse)

    p = sub.add_parser("plot", help="attention maps or training curves")
    p.add_argument("what", choices=["attention", "curves"])
    p.add_argument("run_dir", nargs="?", help="run folder (curves; or --run-dir)")
    p.add_argument("--run-dir", "--run", dest="run_dir_flag", help="run folder (curves)")
    p.add_argument("--checkpoint", help="model file (attention)")
    p.add_argument("--src", help="source sentence (attention)")
    p.add_argument("--tgt", help="force this target (teacher forcing); default: the model's translation")
    p.add_argument("-o", "--output", required=True, help="folder (attention) or .png file (curves)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("serve", help="translation server with a web page")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--max-sentences", type=int, default=64, help="per request (413 above)")
    p.add_argument("--max-chars", type=int, default=1000, help="per sentence (413 above)")
    p.add_argument("--max-queue", type=int, default=1024,
                   help="sentences waiting or in translation; above it requests get 503 with Retry-After")
    p.add_argument("--max-subwords", type=int, default=0,
                   help="per sentence (413 above; default 0: the model's training length, data.max_len - 1)")
    p.add_argument("--max-work", type=int, default=1 << 18,
                   help="beam x subwords of the sentences waiting or in translation; above it 503 (one request "
                        "above it alone: 413)")
    p.add_argument("--max-attention-subwords", type=int, default=100, help="/attention: subwords of its sentence")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a request may wait and run (504 past it)")
    p.add_argument("--read-timeout", type=float, default=10.0, help="seconds to receive a request body (408 past it)")
    p.add_argument("--limit-concurrency", type=int, default=256,
                   help="connections and requests at once; 503 above it")
    p.add_argument("--keep-alive", type=float, default=5.0, help="seconds an idle keep-alive connection stays open")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="as for translate (default auto)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("export", help="export a checkpoint to Hugging Face MarianMTModel or CTranslate2")
    p.add_argument("format", choices=["hf", "ct2"])
    p.add_argument("--quantization", help="ct2 only: int8, int8_float32, float16, ... (CTranslate2's names)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("config", help="print a resolved config as YAML (usable as --config)",
                       epilog=config_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS))
    p.add_argument("--config", help="YAML config to start from")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("reproduce", help="the paper's experiments at small scale (Table 3, recurrent baselines, "
                       "Table 1; confirm: Table 3's winners at the main job's budget) and a generated report")
    p.add_argument("--suite", required=True, choices=["table3", "rnn", "confirm", "table1", "quick"])
    p.add_argument("--data", help="prepared data folder (from `aiayn prepare`); table3, rnn, confirm and quick "
                   "train on it")
    p.add_argument("--work", default="runs/reproduce", help="folder for the run directories (default runs/reproduce)")
    p.add_argument("--report", help="folder for REPORT.md, its plots and results/ (default docs/reproduction; "
                   "quick: WORK/quick-report)")
    p.add_argument("--rows", help="comma-separated row names to run (default: all of the suite)")
    p.add_argument("--steps", type=int, default=1000, help="table3: updates per row (default 1000)")
    p.add_argument("--warmup", type=int, default=400, help="table3: warm-up steps, Eq. 3 (default 400)")
    p.add_argument("--minutes", type=float, default=20.0, help="rnn: training minutes per model (default 20)")
    p.add_argument("--seeds", type=int, default=3, help="table3: seeds of the reference row (default 3)")
    p.add_argument("--device", help="cpu, cuda (default: cuda if available)")
    p.add_argument("--render-only", action="store_true", help="only re-render the report from results/")
    p.set_defaults(func=cmd_reproduce)

    args, extra = parser.parse_known_args(argv)
    if getattr(args, "run_dir_flag", None):  # positional and --run-dir spell the same thing
        if args.run_dir and args.run_dir != args.run_dir_flag:
            parser.error(f"two run folders given: {args.run_dir} and --run-dir {args.run_dir_flag}")
        args.run_dir = args.run_dir_flag
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        args.func(args, extra)
    except (UserError, ConfigError, DataError, CheckpointError, TokenizerError, FileError) as e:
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `aiayn score ... | head -1`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
