"""Where one model for en->de, en->fr, en->cs reads its target-language tag: in the source (Johnson et al. 2017)
or as the decoder's first input (fairseq's --decoder-langtok; model.lang_tag decoder), on Multi30k.

Both arms are multi_vs_bilingual.py's multilingual model: the `quick` preset, 1,800 updates, on one
folder prepared with `prepare --pairs en-de,en-fr,en-cs`, the last 5 checkpoints averaged, beam 4,
α 0.6; they differ in model.lang_tag alone. 2 seeds each. The choice is made on validation: BLEU
of all three directions' validation sentences pooled, decoder minus source (mean of the seeds), with a
95 % paired bootstrap interval; the decoder's tag becomes the default only if that interval lies
above 0, else the source's (the published recipe) stays. Test BLEU per direction is reported beside it,
never chosen on.

Resumable: each (arm, seed) is a row of the JSON, written as it finishes. Work files go to
~/aiayn-work/multilingual (--work; a multi_vs_bilingual.py run there is reused as the source arm).

    .venv/bin/python bench/multilingual/tag_side.py [--seeds 1 2] [--work DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import ROOT, cpu_meta  # noqa: E402
from multi_vs_bilingual import QUICK_STEPS, TARGETS, aiayn, hypotheses, paired_interval, train  # noqa: E402

SPLITS = {"valid": TARGETS, "test_2016_flickr": TARGETS, "test_2017_flickr": ("de", "fr")}
ARMS = {"source": (), "decoder": ("--model.lang_tag", "decoder")}


def run_arm(arm: str, seed: int, data: Path, work: Path) -> tuple[dict, dict]:
    """One (arm, seed): its BLEU per split and direction, and its hypotheses."""
    run = work / (f"run-multi-seed{seed}" if arm == "source" else f"run-multi-{arm}-seed{seed}")
    start = time.time()
    ckpt = train(data, run, seed, QUICK_STEPS * len(TARGETS), ARMS[arm])
    row, hyps = {"minutes": round((time.time() - start) / 60, 1)}, {}
    for split, targets in SPLITS.items():
        for t in targets:
            h = hypotheses(ckpt, data, split, t, True, run / f"{split}.{t}.hyp")
            ref = (data / f"{split}.en-{t}.{t}.txt").read_text().splitlines()
            hyps[split, t] = h
            row[f"{split}.en-{t}"] = round(sacrebleu.corpus_bleu(h, [ref]).score, 2)
    return row, hyps


def compare(hyps: dict, seeds: list[int], refs: dict) -> dict:
    """Decoder minus source per split and direction, and on the pooled validation set."""
    table = {}
    keys = [(s, t) for s, ts in SPLITS.items() for t in ts] + [("valid", "pooled")]
    for split, t in keys:
        ways = TARGETS if t == "pooled" else (t,)
        ref = [x for d in ways for x in refs[split, d]]
        dec, src = ([[x for d in ways for x in hyps[arm, s, split, d]] for s in seeds] for arm in ("decoder", "source"))
        bleu = {arm: [round(sacrebleu.corpus_bleu(h, [ref]).score, 2) for h in hs] for arm, hs in
                (("decoder", dec), ("source", src))}
        lo, hi = paired_interval(dec, src, ref)
        table[f"{split}.en-{t}" if t != "pooled" else "valid.pooled"] = {
            **bleu, "difference": round(float(np.mean(bleu["decoder"]) - np.mean(bleu["source"])), 2),
            "interval_95": [round(lo, 2), round(hi, 2)]}
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--work", type=Path, default=Path.home() / "aiayn-work" / "multilingual")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "multilingual" /
                   f"{datetime.date.today()}_multi30k_tag_side.json")
    args = p.parse_args()
    env = dict(os.environ)
    env.setdefault("AIAYN_MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k"))
    args.work.mkdir(parents=True, exist_ok=True)
    result = json.loads(args.out.read_text()) if args.out.exists() else {
        "what": __doc__.split("\n")[0], "cpu": cpu_meta(), "preset": "quick", "updates": QUICK_STEPS * len(TARGETS),
        "decode": "beam 4, alpha 0.6, last 5 averaged", "rows": {}}
    data = args.work / "prep-multi"
    if not (data / "manifest.json").exists():
        aiayn("prepare", "--corpus", "multi30k", "--pairs", ",".join(f"en-{t}" for t in TARGETS), "-o", str(data),
              "--preset", "quick", env=env)
    refs = {(s, t): (data / f"{s}.en-{t}.{t}.txt").read_text().splitlines() for s, ts in SPLITS.items() for t in ts}
    hyps: dict = {}
    for seed in args.seeds:
        for arm in ARMS:
            row, h = run_arm(arm, seed, data, args.work)
            hyps.update({(arm, seed, *k): v for k, v in h.items()})
            key = f"{arm}-seed{seed}"
            if key not in result["rows"]:
                result["rows"][key] = row
                args.out.write_text(json.dumps(result, indent=1) + "\n")
                print(key, row, flush=True)
    result["table"] = compare(hyps, args.seeds, refs)
    pooled = result["table"]["valid.pooled"]
    result["chosen"] = "decoder" if pooled["interval_95"][0] > 0 else "source"
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for k, v in result["table"].items():
        print(f"{k:26} decoder {v['decoder']} source {v['source']} diff {v['difference']:+.2f} "
              f"[{v['interval_95'][0]:+.2f}, {v['interval_95'][1]:+.2f}]")
    print("chosen on validation:", result["chosen"])


if __name__ == "__main__":
    main()
