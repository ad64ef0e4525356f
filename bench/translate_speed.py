"""Beam-search translation speed and BLEU of one checkpoint: fp32 vs bf16, greedy vs beam.

Runs the configurations alternately (A B A B ...), reports the median sentences/s and target
tokens/s over repetitions, sacreBLEU of each, and writes JSON.

    .venv/bin/python bench/translate_speed.py --checkpoint runs/multi30k-en-de/averaged.safetensors \
        --src work/multi30k-en-de/test_2016_flickr.en.txt --ref work/multi30k-en-de/test_2016_flickr.de.txt
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import sacrebleu
import torch

from aiayn.translate import Translator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default="bench/translate_speed.json")
    p.add_argument("--configs", default="fp32:4,bf16:4,fp32:1")
    args = p.parse_args()
    src = open(args.src, encoding="utf-8").read().splitlines()
    ref = open(args.ref, encoding="utf-8").read().splitlines()
    configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
    translators = {prec: Translator.load(args.checkpoint, precision=prec) for prec, _ in configs}
    times: dict[tuple, list[float]] = {c: [] for c in configs}
    outputs: dict[tuple, tuple] = {}
    for _ in range(args.reps):
        for prec, beam in configs:
            t = translators[prec]
            ids = t.encode_sources(src)
            start = time.perf_counter()
            hyps = t.translate_ids(ids, beam=beam, nbest=1)
            times[(prec, beam)].append(time.perf_counter() - start)
            outputs[(prec, beam)] = (t.tokenizer.decode([h[0].tokens if h else [] for h in hyps]),
                                     sum(len(h[0].tokens) + 1 for h in hyps if h))
    rows = []
    for (prec, beam), ts in times.items():
        text, n_tok = outputs[(prec, beam)]
        sec = statistics.median(ts)
        rows.append({"precision": prec, "beam": beam, "seconds": sec, "sent_per_s": len(src) / sec,
                     "tgt_tok_per_s": n_tok / sec, "bleu": sacrebleu.corpus_bleu(text, [ref]).score})
    print(f"{'precision':<10}{'beam':>5}{'sec':>8}{'sent/s':>9}{'tok/s':>9}{'BLEU':>7}")
    for r in rows:
        print(f"{r['precision']:<10}{r['beam']:>5}{r['seconds']:>8.2f}{r['sent_per_s']:>9.1f}"
              f"{r['tgt_tok_per_s']:>9.0f}{r['bleu']:>7.2f}")
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.processor(),
            "sentences": len(src), "checkpoint": args.checkpoint, "reps": args.reps}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
