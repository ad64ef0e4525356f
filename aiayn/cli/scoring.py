"""`aiayn score`: sacreBLEU and chrF of translations, EVALB F1 of trees (§6.1, §6.3), and a given
translation's log-probability under a model, force-decoded."""

from __future__ import annotations

import argparse
import logging

from ..config import ConfigError
from .common import UserError, read_input, refuse_parser, score_lines

log = logging.getLogger("aiayn")


def cmd_score(args: argparse.Namespace, extra: list[str]) -> None:
    """sacreBLEU BLEU and chrF of detokenized hypotheses against references; with --parse,
    EVALB-style labeled bracketing F1 of trees (§6.3)."""
    if args.parse or args.right_branching or args.pcfg:
        from ..parsing.trees import TreeError, evalb, read_trees, right_branching

        try:
            gold = read_trees("\n".join(read_input(args.ref)), args.ref)
            if args.right_branching:
                test = [right_branching(g.words()) for g in gold]
            elif args.pcfg:
                test = _pcfg(args.pcfg, gold)
            elif args.hyp:
                test = read_trees("\n".join(read_input(args.hyp)), args.hyp)
            else:
                raise UserError("score --parse needs --hyp TREES (or --right-branching for the baseline)")
            print(evalb(gold, test))
            if args.right_branching or args.pcfg:
                print(f"unlabeled: {evalb(gold, test, labeled=False)}")
        except TreeError as e:
            raise UserError(str(e)) from None
        return
    if args.checkpoint:
        _force_scores(args)
        return
    if not args.hyp or not args.ref:
        raise UserError("score needs --hyp FILE and --ref FILE (or --checkpoint CKPT --src FILE --hyp FILE: each "
                        "translation's log-probability under the model)")
    hyps, refs = read_input(args.hyp), read_input(args.ref)
    print(score_lines(hyps, refs, args.hyp, args.ref))
    if args.paper:
        from ..score import paper_score

        print(paper_score(hyps, refs, args.lang))


def _force_scores(args: argparse.Namespace) -> None:
    """`score --checkpoint --src --hyp`: each translation force-decoded (decode/scoring.py), one TSV
    line per line: total log-probability, per subword, length-normalized as beam search ranks it."""
    from ..decode.translator import Translator

    if not args.src or not args.hyp:
        raise UserError("score --checkpoint needs --src FILE (the sources) and --hyp FILE (their translations)")
    src, hyp = read_input(args.src), read_input(args.hyp)
    if len(src) != len(hyp):
        raise UserError(f"{args.src} has {len(src)} lines but {args.hyp} has {len(hyp)}")
    refuse_parser(args.checkpoint, "score")
    translator = Translator.load(args.checkpoint, device=args.device, precision=args.precision)
    try:
        scores = translator.score(src, hyp, args.tgt_lang, args.alpha)
    except (ValueError, ConfigError) as e:
        raise UserError(f"{args.hyp}: {e}") from None
    print("total\tper_subword\tnormalized\tsubwords")
    for x in scores:
        print(f"{x.total:.4f}\t{x.per_subword:.4f}\t{x.normalized:.4f}\t{x.subwords}")


def _pcfg(train_file: str, gold: list) -> list:
    """The treebank-PCFG baseline's trees for `gold`'s sentences (given their gold tags)."""
    from ..parsing.pcfg import pcfg_parses
    from ..parsing.trees import read_trees

    test, failed = pcfg_parses(read_trees("\n".join(read_input(train_file)), train_file), gold)
    log.info("PCFG from %s: %d of %d sentences outside the grammar (parsed right-branching)", train_file, failed,
             len(gold))
    return test


def add_score(sub) -> None:
    """`aiayn score` and its flags."""
    p = sub.add_parser("score", help="sacreBLEU BLEU and chrF; --parse: EVALB bracketing F1 of trees")
    p.add_argument("--hyp", help="hypotheses (one per line)")
    p.add_argument("--ref", help="references (one per line)")
    p.add_argument("--checkpoint", help="with --src and --hyp: each translation's log-probability under this model "
                                        "(force-decoded; TSV: total, per subword, normalized as beam search ranks)")
    p.add_argument("--src", help="with --checkpoint: the sources of --hyp's translations")
    p.add_argument("--tgt-lang", metavar="LANG", help="with --checkpoint: a multilingual model's target language")
    p.add_argument("--alpha", type=float, help="with --checkpoint: the length penalty of `normalized` (default: the "
                                               "checkpoint's decode.alpha)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="fp32",
                   help="with --checkpoint: the precision of the pass (default fp32)")
    p.add_argument("--device", help="with --checkpoint: cpu, cuda (default: cuda if available)")
    p.add_argument("--parse", action="store_true", help="score trees: labeled bracketing F1, EVALB COLLINS.prm")
    p.add_argument("--right-branching", action="store_true",
                   help="with --parse: score the right-branching baseline built from --ref's words")
    p.add_argument("--pcfg", metavar="TRAIN_TREES",
                   help="with --parse: score a treebank PCFG read off TRAIN_TREES (e.g. train.gold.mrg), parsing "
                        "--ref's sentences from their gold part-of-speech tags")
    p.add_argument("--paper", action="store_true",
                   help="also the paper's tokenized BLEU (Moses tokenizer, compound splitting, multi-bleu, as "
                        "tensor2tensor's get_ende_bleu); not comparable to sacreBLEU")
    p.add_argument("--lang", default="de", help="with --paper: the target language for the Moses tokenizer")
    p.set_defaults(func=cmd_score)
