"""`aiayn prepare`: parallel text (or a treebank, §6.3) in, checked and cached subwords out (§5.1)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
from pathlib import Path

from ..config import Config
from ..data.text import DataError
from .common import (
    UserError,
    build_config,
    parse_overrides,
    preset_flag,
)

log = logging.getLogger("aiayn")


def _prepare_parse(args: argparse.Namespace, cfg: Config) -> None:
    """§6.3: the treebank's splits as words -> linearized trees, prepared like a corpus."""
    from ..parsing.treebank_data import prepare_treebank

    if not args.treebank:
        raise UserError("prepare --task parse needs --treebank PATH (a folder of .mrg files or treebank.zip)")
    manifest = prepare_treebank(Path(args.treebank), Path(args.out), cfg, args.linearization, args.subtrees,
                                args.tags or cfg.model.tag_input, args.strict)  # the preset's model reads tags
    print(json.dumps(manifest["splits"], indent=1))


def cmd_prepare(args: argparse.Namespace, extra: list[str]) -> None:
    """Validate parallel text, learn the joint BPE vocabulary (§5.1), cache every split."""
    from ..data.prepare import check_prepared_output, prepare

    cfg = build_config(args, extra)
    if args.task == "parse":  # §6.3: words -> linearized trees, from a treebank
        _prepare_parse(args, cfg)
        return
    check_prepared_output(args.out)  # before any download or reading
    if args.pairs:  # many directions, one model (data/directions.py)
        if args.synthetic:
            raise UserError("--synthetic adds back-translated pairs to one pair's data: not with --pairs")
        _prepare_directions(args, extra, cfg)
        return
    args.src, args.tgt = languages(args)
    splits = pair_splits(args, args.src, args.tgt)
    manifest = prepare(splits, Path(args.out), args.src, args.tgt, _vocabulary_size(args, extra, cfg),
                       cfg.data.max_len,
                       cfg.data.strict or args.strict, cfg.train.seed, dedup=cfg.data.dedup,
                       max_ratio=cfg.data.max_ratio, vocabulary=_vocabulary_of(args.tokenizer_from),
                       corpora=_synthetic(args), train_weight=args.train_weight)
    print(_summary(manifest, Path(args.out)))


def _prepare_directions(args: argparse.Namespace, extra: list[str], cfg: Config) -> None:
    """`prepare --pairs en-de,en-fr`: every direction's splits found as one pair's are, prepared together."""
    from ..data.directions import parse_directions, prepare_many

    if args.src or args.tgt or args.tokenizer_from:
        raise UserError("--pairs names the languages of every direction: leave out --src, --tgt and --tokenizer-from")
    if args.train and "," in args.train or args.valid and "," in args.valid:
        raise UserError("--pairs finds each language's files by its suffix: give split prefixes (--train train), "
                        "not SRC_FILE,TGT_FILE")
    directions = {(s, t): pair_splits(args, s, t) for s, t in parse_directions(args.pairs)}
    manifest = prepare_many(directions, Path(args.out), _vocabulary_size(args, extra, cfg), cfg.data.max_len,
                            cfg.data.strict or args.strict, cfg.train.seed, cfg.data.dedup, cfg.data.max_ratio,
                            cfg.data.vocab_temperature)
    print(_summary({**manifest, "splits": {k: v for k, v in manifest["splits"].items() if k in ("train", "valid")}},
                   Path(args.out)) + f"; directions {', '.join(manifest['settings']['directions'])}")


def _synthetic(args: argparse.Namespace) -> tuple:
    """--synthetic SRC_FILE,TGT_FILE (repeatable) with --synthetic-weight (one for all, or one each):
    back-translated corpora, their sources tagged <BT> unless --no-bt-tag (data/mixing.py)."""
    from ..data.mixing import TrainingCorpus

    given, weights = args.synthetic or [], args.synthetic_weight or [1.0]
    if len(weights) not in (1, len(given)):
        raise UserError(f"--synthetic-weight: give one weight for every --synthetic corpus or one each; got "
                        f"{len(weights)} for {len(given)}")
    out = []
    for k, value in enumerate(given, 1):
        src, sep, tgt = value.partition(",")
        if not sep:
            raise UserError(f"--synthetic {value}: give SRC_FILE,TGT_FILE (the back-translated source, the genuine "
                            "target)")
        for f in (src, tgt):
            if not Path(f).is_file():
                raise UserError(f"--synthetic: file not found: {f}")
        out.append(TrainingCorpus(f"synthetic{k}", Path(src), Path(tgt), weights[0 if len(weights) == 1 else k - 1],
                                  synthetic=True, tag=not args.no_bt_tag))
    if (args.synthetic_weight or args.no_bt_tag) and not out:
        raise UserError("--synthetic-weight and --no-bt-tag are about --synthetic corpora: there are none")
    return tuple(out)


def pair_splits(args: argparse.Namespace, src: str, tgt: str) -> dict[str, tuple[Path, Path]]:
    """The files of one direction's splits: a --corpus's (fetched or checked), or --data-dir's and
    --train/--valid/--test's (prefixes with language suffixes, or SRC_FILE,TGT_FILE)."""
    from ..data.corpora import CORPORA, cache_dir, check_mirror, fetch_multi30k, fetch_wmt14, verify_multi30k
    from ..data.text import find_file

    data_dir = args.data_dir
    names = {"train": args.train, "valid": args.valid}
    tests = args.test
    if args.corpus:
        spec = CORPORA[args.corpus]
        if data_dir is None and os.environ.get(spec["env"]):
            data_dir = Path(os.environ[spec["env"]])
        check_mirror(args.mirror)
        if args.corpus == "wmt14-en-de":  # archives (local or downloaded) -> extracted text in the cache
            data_dir = fetch_wmt14(src, tgt, cache_dir(), data_dir, args.mirror, args.trust_local)
        elif data_dir is None:
            data_dir = fetch_multi30k(src, tgt, cache_dir())
        else:
            verify_multi30k(Path(data_dir), src, tgt, args.trust_local)
        names = {"train": args.train or spec["train"], "valid": args.valid or spec["valid"]}
        tests = tests or list(spec["test"])
    names = {"train": names["train"] or "train", "valid": names["valid"] or "valid"}
    splits: dict[str, tuple[Path, Path]] = {}

    def resolve(value: str) -> tuple[Path, Path]:
        if "," in value:  # explicit files: SRC_FILE,TGT_FILE
            s, t = value.split(",", 1)
            for f in (s, t):
                if not Path(f).is_file():
                    raise UserError(f"file not found: {f}")
            return Path(s), Path(t)
        prefix = Path(value) if data_dir is None else Path(data_dir) / value
        return find_file(prefix, src), find_file(prefix, tgt)

    for key, value in names.items():
        given = args.train if key == "train" else args.valid
        splits[key] = _first_split(resolve, [value] if given or args.corpus else SPLIT_NAMES[key], data_dir)
    for value in tests or []:
        try:
            pair = resolve(value)
        except DataError as e:
            if args.corpus:  # e.g. Multi30k's test_2017 has no Czech side
                log.warning("skipping test set %s: %s", value, e)
                continue
            raise
        splits[_test_name(value, src, splits)] = pair
    return splits


def _summary(manifest: dict, out: Path) -> str:
    """One line on what `prepare` made (the log and manifest.json hold every count)."""
    pairs = ", ".join(f"{name} {s.get('pairs', 0):,}" for name, s in manifest["splits"].items())
    return (f"prepared {out}: {pairs} pairs; a joint vocabulary of {manifest['vocab_size']:,} subwords "
            f"(every count: {out / 'manifest.json'})")


def _vocabulary_size(args: argparse.Namespace, extra: list[str], cfg: Config) -> int:
    """data.vocab_size where a preset, a config, --data.vocab_size or WMT14 (the paper's 37k) gives
    it; else 0: sized to the training text (data/prepare.vocabulary_size_for)."""
    given = args.preset or args.config or "data.vocab_size" in parse_overrides(extra) or args.corpus == "wmt14-en-de"
    return cfg.data.vocab_size if given else 0


SPLIT_NAMES = {"train": ("train",), "valid": ("valid", "val", "dev")}  # tried in order when not given


def _first_split(resolve, names: list[str] | tuple[str, ...], data_dir: str | Path | None) -> tuple[Path, Path]:
    """The first of `names` whose two files exist (Multi30k's `val`, WMT's `dev`: accepted as they
    are); else one line naming the split prefixes the folder holds."""
    for name in names[:-1]:
        try:
            return resolve(name)
        except DataError:
            continue
    try:
        return resolve(names[-1])
    except DataError as e:
        folder = Path(data_dir or ".")
        seen = sorted({f.name.split(".")[0] for f in folder.glob("*.*") if _suffix(str(f))}) if folder.is_dir() else []
        tried = f" (tried {', '.join(names)})" if len(names) > 1 else ""
        raise DataError(f"{e}{tried}" + (f"; {folder} holds the splits {', '.join(seen[:12])}: name them with "
                                         "--train/--valid/--test" if seen else "")) from None


_LANG = re.compile(r"[A-Za-z]{2,3}(?:[_-][A-Za-z0-9]{2,4})?")  # en, deu, pt_BR, zh-Hans: a language suffix
_NOT_LANG = {"txt", "tok", "raw", "bpe", "spm", "src", "tgt", "ref", "hyp", "out", "tsv", "csv", "sgm", "xml"}


def _suffix(path: str) -> str | None:
    """The language suffix of a corpus file's name (train.en, train.de.gz), None if it has none."""
    name = Path(path).name.removesuffix(".gz")
    lang = name.rpartition(".")[2] if "." in name else ""
    return lang if _LANG.fullmatch(lang) and lang.lower() not in _NOT_LANG else None


def languages(args: argparse.Namespace) -> tuple[str, str]:
    """--src and --tgt; where either is left out and --train names its two files, their suffixes
    (--train train.en,train.de: en -> de). Else one line naming the suffixes found beside --train."""
    if args.src and args.tgt:
        return args.src, args.tgt
    if not args.corpus and args.train and "," in args.train:
        found = [_suffix(f) for f in args.train.split(",", 1)]
        src, tgt = args.src or found[0], args.tgt or found[1]
        if src and tgt and src != tgt:
            log.info("languages from --train's file names: %s -> %s (--src/--tgt name others)", src, tgt)
            return src, tgt
    prefix = Path(args.data_dir or ".") / (args.train or "train")
    seen = sorted({x for f in prefix.parent.glob(f"{prefix.name}.*") if (x := _suffix(str(f)))}) \
        if not args.corpus and args.train and "," not in args.train else []
    beside = f"; {prefix}.* has {', '.join(seen)}" if seen else ""
    verb = getattr(args, "command", None) or "prepare"
    raise UserError(f"{verb} needs --src and --tgt (language suffixes of the files, e.g. en and de{beside})")


def _vocabulary_of(checkpoint: str | None) -> bytes | None:
    """--tokenizer-from: the vocabulary a checkpoint carries (a trained or an imported model's)."""
    if checkpoint is None:
        return None
    from ..checkpoint import CheckpointError, read_meta, read_metadata, refuse_folder

    refuse_folder(checkpoint)
    if not Path(checkpoint).is_file():
        raise CheckpointError(f"--tokenizer-from {checkpoint}: no such checkpoint")
    return read_meta(read_metadata(Path(checkpoint)), checkpoint)[1].proto  # the header only


def _test_name(value: str, src: str, splits: dict) -> str:
    """A test split's name: its prefix's file name (`newstest2014`, `valid.final`), or for explicit
    files (SRC_FILE,TGT_FILE) the source file's name less `.gz` and its language suffix; one that
    another split has is refused."""
    name = Path(value.split(",", 1)[0]).name
    if "," in value:
        name = name.removesuffix(".gz").removesuffix(f".{src}") or name
    if name in splits:
        what = f"the {name} split" if name in ("train", "valid") else "another test set"
        raise UserError(f"--test {value}: its split would be named {name!r}, as {what}; rename its files")
    return name


def corpus_flags(p: argparse.ArgumentParser) -> None:
    """The flags that name one pair's corpus files (prepare's, distill's): found as pair_splits finds them."""
    p.add_argument("--data-dir", help="folder with {split}.{lang}[.gz] files")
    p.add_argument("--corpus", choices=["multi30k", "wmt14-en-de"],
                   help="a public corpus, downloaded unless --data-dir or its environment variable (AIAYN_MULTI30K, "
                        "AIAYN_WMT14) points to a local copy; wmt14-en-de: a folder of the official .tgz archives")
    p.add_argument("--mirror", help="wmt14-en-de: download the archives from this URL prefix instead of statmt.org")
    p.add_argument("--trust-local", action="store_true",
                   help="--corpus with a local copy: use files whose checksum differs from the published one "
                        "(refused otherwise)")
    p.add_argument("--src", help="source language suffix, e.g. en (default: that of --train SRC_FILE,TGT_FILE's "
                                 "first file)")
    p.add_argument("--tgt", help="target language suffix, e.g. de (default: the second file's)")
    p.add_argument("--train", help="train split name/prefix, or SRC_FILE,TGT_FILE")
    p.add_argument("--valid", help="validation split name/prefix, or SRC_FILE,TGT_FILE")
    p.add_argument("--test", action="append", help="test split (repeatable)")


def add_prepare(sub) -> None:
    """`aiayn prepare` and its flags."""
    p = sub.add_parser("prepare", help="validate parallel text, learn joint BPE, cache subwords")
    corpus_flags(p)
    p.add_argument("--task", choices=["translate", "parse"], default="translate",
                   help="parse: words -> linearized trees from --treebank (§6.3)")
    p.add_argument("--treebank", help="--task parse: a folder of .mrg files or NLTK's treebank.zip")
    p.add_argument("--linearization", choices=["words", "xx"], default="words",
                   help="--task parse: trees with the words as leaves (default; each leaf copies its word) or "
                        "with XX placeholders as §6.3 and Vinyals et al. (xx)")
    p.add_argument("--subtrees", type=int, default=0, metavar="N",
                   help="--task parse: also train on every distinct constituent of at least N words as a pair of "
                        "its own (ours; 0, the default: off)")
    p.add_argument("--tags", action="store_true",
                   help="--task parse: also tag the words (a perceptron trained on the training trees; training "
                        "tags jackknifed) for models with model.tag_input (ours; on when the preset's model has it)")
    p.add_argument("--pairs", metavar="SRC-TGT,...",
                   help="several directions in one prepared folder, for one multilingual model (e.g. "
                        "en-de,en-fr,de-en): one joint vocabulary, a target-language tag <2xx> before each source "
                        "(Johnson et al. 2017); each direction's files found as --src/--tgt's are")
    p.add_argument("-o", "--output", "--out", dest="out", required=True, help="output folder for the prepared data")
    p.add_argument("--tokenizer-from", metavar="CKPT",
                   help="encode with this checkpoint's vocabulary instead of learning one (to fine-tune it: "
                        "train --init-from CKPT)")
    p.add_argument("--synthetic", action="append", metavar="SRC_FILE,TGT_FILE",
                   help="back-translated pairs (a synthetic source, a genuine target) added to the training split, "
                        "repeatable; their sources start with a <BT> tag (Caswell et al. 2019)")
    p.add_argument("--synthetic-weight", action="append", type=float, metavar="W",
                   help="each synthetic corpus's share of an epoch: W x its pairs (2: every pair twice, 0.5: a "
                        "fresh half each epoch); one for all or one per --synthetic (default 1)")
    p.add_argument("--train-weight", type=float, default=1.0, metavar="W",
                   help="the genuine parallel corpus's weight against --synthetic ones (2: upsampled twice; "
                        "default 1)")
    p.add_argument("--no-bt-tag", action="store_true", help="--synthetic sources untagged (no <BT>)")
    p.add_argument("--strict", action="store_true",
                   help="fail on an empty line (instead of dropping the pair) and on a vocabulary smaller than "
                        "asked (instead of a warning)")
    preset_flag(p)
    p.add_argument("--config", help="YAML config")
    p.set_defaults(func=cmd_prepare, overrides=True)  # --section.key VALUE


def cmd_shortlist(args: argparse.Namespace, extra: list[str]) -> None:
    """A decoding shortlist from prepared data's training pairs (shortlist.py; not in the paper)."""
    from ..checkpoint import check_safetensors_output
    from ..decode.shortlist import MAX_PER_SOURCE, build

    if not 1 <= args.per_source <= MAX_PER_SOURCE or args.frequent < 0 or args.max_pairs < 0:
        raise UserError(f"--per-source must be in [1, {MAX_PER_SOURCE}], --frequent and --max-pairs >= 0; got "
                        f"{args.per_source}, {args.frequent}, {args.max_pairs}")
    check_safetensors_output(args.output, ours=lambda meta: "aiayn_shortlist" in meta, what="an aiayn shortlist")
    shortlist = build(Path(args.data), args.per_source, args.frequent, args.max_pairs)
    shortlist.save(Path(args.output))
    log.info("wrote %s: %d target subwords for every sentence, up to %d more per source subword",
             args.output, len(shortlist.frequent), args.per_source)


def add_shortlist(sub) -> None:
    """`aiayn shortlist` and its flags."""
    p = sub.add_parser("shortlist", help="a target-vocabulary shortlist for faster decoding (translate --shortlist)")
    p.add_argument("--data", required=True, help="prepared data (aiayn prepare): its training pairs and vocabulary")
    p.add_argument("-o", "--output", required=True, help="the shortlist file (.safetensors)")
    p.add_argument("--per-source", type=int, default=100,
                   help="target subwords kept per source subword, by co-occurrence (Dice) (default 100)")
    p.add_argument("--frequent", type=int, default=200,
                   help="most frequent target subwords, kept for every sentence (default 200)")
    p.add_argument("--max-pairs", type=int, default=1_000_000,
                   help="count co-occurrences on at most this many training pairs, spread evenly (default 1M; 0: all)")
    p.set_defaults(func=cmd_shortlist)
