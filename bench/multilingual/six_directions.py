"""Six directions in one model (en<->de, en<->fr, en<->cs) against six bilingual models, and zero-shot.

As multi_vs_bilingual.py, with the reverse directions added: the bilingual en->xx models are that
script's (the same work folder), the xx->en ones are trained here with the same `quick` preset;
the multilingual model gets the six budgets added up (3,600 updates). Zero-shot: de->fr and fr->de,
never trained, translated by the six-direction model from test2016's German and French (the same
1,000 captions in every language) and scored against the other side; reported without a target.

The six-direction model's `model.lang_tag` is `--lang-tag` (default auto, which takes the decoder's
tag on several directions; `source` reproduces results measured before that default).

    .venv/bin/python bench/multilingual/six_directions.py [--seeds 1 2] [--work DIR] [--lang-tag source]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np
import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi_vs_bilingual import QUICK_STEPS, ROOT, TARGETS, aiayn, cpu_meta, paired_interval, train  # noqa: E402

TEST = "test_2016_flickr"
DIRECTIONS = [("en", t) for t in TARGETS] + [(t, "en") for t in TARGETS]


def prepare(work: Path, env: dict) -> dict[str, Path]:
    out = {}
    for s, t in DIRECTIONS:
        out[f"{s}-{t}"] = work / f"prep-{s}-{t}"
        aiayn("prepare", "--corpus", "multi30k", "--src", s, "--tgt", t, "-o", str(out[f"{s}-{t}"]), "--preset",
              "quick", env=env)
    out["multi6"] = work / "prep-multi6"
    aiayn("prepare", "--corpus", "multi30k", "--pairs", ",".join(f"{s}-{t}" for s, t in DIRECTIONS), "-o",
          str(out["multi6"]), "--preset", "quick", env=env)
    return out


def hyps(ckpt: Path, src: Path, out: Path, tgt: str | None) -> list[str]:
    if not out.exists():
        aiayn("translate", "--checkpoint", str(ckpt), "-i", str(src), "-o", str(out),
              *(["--tgt-lang", tgt] if tgt else []))
    return out.read_text().splitlines()


def score(data: dict[str, Path], ckpt: Path, run: Path, d: str, got: dict, seed: int) -> dict[str, float]:
    """test2016 BLEU of one run on its directions (all six for the multilingual one, with zero-shot)."""
    row = {}
    for s, t in DIRECTIONS if d == "multi6" else [tuple(d.split("-"))]:
        name = f"{s}-{t}"
        src = data["multi6"] / f"{TEST}.{name}.{s}.txt"
        h = hyps(ckpt, src, run / f"six.{TEST}.{name}.hyp", t if d == "multi6" else None)
        ref = (data["multi6"] / f"{TEST}.{name}.{t}.txt").read_text().splitlines()
        got[d == "multi6", seed, name] = h
        row[name] = round(sacrebleu.corpus_bleu(h, [ref]).score, 2)
    if d == "multi6":  # zero-shot: German <-> French, never trained
        de = data["multi6"] / f"{TEST}.de-en.de.txt"
        fr = data["multi6"] / f"{TEST}.fr-en.fr.txt"
        for (s, src), (t, ref) in (("de", de), ("fr", fr)), (("fr", fr), ("de", de)):
            h = hyps(ckpt, src, run / f"zero.{s}-{t}.hyp", t)
            row[f"zero-shot {s}-{t}"] = round(sacrebleu.corpus_bleu(h, [ref.read_text().splitlines()]).score, 2)
    return row


def summarise(data: dict[str, Path], result: dict, got: dict, seeds: list[int]) -> dict:
    """Multilingual minus bilingual per direction over the seeds, with the paired bootstrap's interval."""
    table = {}
    for s, t in DIRECTIONS:
        name = f"{s}-{t}"
        m = [got[True, x, name] for x in seeds]
        b = [got[False, x, name] for x in seeds]
        ref = (data["multi6"] / f"{TEST}.{name}.{t}.txt").read_text().splitlines()
        ms = [result["rows"][f"multi6-seed{x}"][name] for x in seeds]
        bs = [result["rows"][f"{name}-seed{x}"][name] for x in seeds]
        lo, hi = paired_interval(m, b, ref)
        table[f"{TEST}.{name}"] = {"multilingual": ms, "bilingual": bs, "difference": round(float(np.mean(ms) -
                                   np.mean(bs)), 2), "interval_95": [round(lo, 2), round(hi, 2)],
                                   "within_1_bleu": bool(np.mean(ms) - np.mean(bs) >= -1.0)}
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--work", type=Path, default=Path.home() / "aiayn-work" / "multilingual")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "multilingual" /
                   f"{datetime.date.today()}_multi30k_six_directions.json")
    p.add_argument("--lang-tag", choices=("auto", "source", "decoder"), default="auto",
                   help="the six-direction model's model.lang_tag (a result file holds one)")
    args = p.parse_args()
    env = {**os.environ, "AIAYN_MULTI30K": os.environ.get("AIAYN_MULTI30K", str(ROOT.parent / "shared" / "data" /
                                                                                 "multi30k"))}
    result = json.loads(args.out.read_text()) if args.out.exists() else {
        "what": __doc__.split("\n")[0], "cpu": cpu_meta(), "preset": "quick", "bilingual_updates": QUICK_STEPS,
        "multilingual_updates": QUICK_STEPS * len(DIRECTIONS), "decode": "beam 4, alpha 0.6, last 5 averaged",
        "rows": {}, "lang_tag": args.lang_tag}
    if result.get("lang_tag", "source") != args.lang_tag:  # files from before the option were source-tagged
        sys.exit(f"{args.out} holds model.lang_tag {result.get('lang_tag', 'source')}'s rows; give that "
                 "--lang-tag or another --out")
    data = prepare(args.work, env)
    got: dict = {}
    for seed in args.seeds:
        for d in [f"{s}-{t}" for s, t in DIRECTIONS] + ["multi6"]:
            key = f"{d}-seed{seed}"
            # the en->xx bilingual runs are multi_vs_bilingual.py's (run-de-seed1 ...)
            tag = d == "multi6" and args.lang_tag != "auto"
            run = args.work / (f"run-{d[3:]}-seed{seed}" if d.startswith("en-") else
                               f"run-{d}-{args.lang_tag}-seed{seed}" if tag else f"run-{key}")
            ckpt = train(data[d], run, seed, QUICK_STEPS * (len(DIRECTIONS) if d == "multi6" else 1),
                         ("--model.lang_tag", args.lang_tag) if d == "multi6" else ())
            row = score(data, ckpt, run, d, got, seed)
            result["rows"][key] = row
            args.out.write_text(json.dumps(result, indent=1) + "\n")
            print(key, row, flush=True)
    table = summarise(data, result, got, args.seeds)
    result["table"] = table
    result["zero_shot"] = {k: [result["rows"][f"multi6-seed{x}"][k] for x in args.seeds]
                           for k in ("zero-shot de-fr", "zero-shot fr-de")}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for k, v in table.items():
        print(f"{k:26} multi {v['multilingual']} bi {v['bilingual']} diff {v['difference']:+.2f} "
              f"[{v['interval_95'][0]:+.2f}, {v['interval_95'][1]:+.2f}]")
    print("zero-shot", result["zero_shot"])


if __name__ == "__main__":
    main()
