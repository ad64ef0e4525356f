"""How well each quality signal (decode/quality.py) tells good translations from bad, on test2016.

Translates test2016 with beam 4, α 0.6 and reads every signal of every translation; reports each
signal's Spearman correlation with sentence chrF against the reference; then makes broken outputs
from the real ones — another sentence's translation, the first half of one, one with its last three
words repeated three times, and an untranslated copy of the source — scores real and broken alike
by force-decoding (decode/scoring.py; coverage from the alignment head, teacher-forced) and reports
each signal's AUROC for telling them apart, and the flag's rate on each.

    .venv/bin/python bench/quality/signals.py [--checkpoint CKPT] [--data PREPARED] [--sentences 1000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import sacrebleu
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchdata import ROOT, cpu_meta, prepared_data, trained_checkpoint  # noqa: E402

from aiayn.decode.beams import Hypothesis  # noqa: E402
from aiayn.decode.quality import FIELDS, quality  # noqa: E402
from aiayn.decode.translator import Translator  # noqa: E402

SIGNALS = ("mean_logprob", "normalized", "length_ratio", "repeated", "coverage")


def forced(t: Translator, src: list[str], hyps: list[str]) -> list:
    """Every signal of given translations, force-decoded as `quality` reads a search's."""
    ids = t.encode_sources(src)
    tok = t.tokenizer.encode_target(hyps)
    scores = t.score(src, hyps, alpha=0.6)
    as_hyps = [[Hypothesis(y, s.normalized)] for y, s in zip(tok, scores)]
    links = t.align(ids, as_hyps)
    return [quality(x, h[0], len(line.split()), lk, 4, 0.6) for x, h, line, lk in zip(ids, as_hyps, src, links)]


def auroc(bad: list[float], good: list[float]) -> float:
    """P(a broken output's value is on the worse side of a real one's), ties half (Mann-Whitney U)."""
    u = stats.mannwhitneyu(bad, good, alternative="two-sided").statistic
    return float(u / (len(bad) * len(good)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--data", type=Path)
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "quality" / f"{datetime.date.today()}_signals.json")
    args = p.parse_args()
    ckpt = args.checkpoint or trained_checkpoint()
    data = args.data or prepared_data()
    t = Translator.load(ckpt, precision="fp32")
    src = (data / "test_2016_flickr.en.txt").read_text().splitlines()[:args.sentences]
    ref = (data / "test_2016_flickr.de.txt").read_text().splitlines()[:args.sentences]
    ids = t.encode_sources(src)
    hyps = t.translate_ids(ids, beam=4, alpha=0.6)
    texts = t.tokenizer.decode([h[0].tokens for h in hyps])
    links = t.align(ids, hyps)
    searched = [quality(x, h[0], len(s.split()), lk, 4, 0.6) for x, h, s, lk in zip(ids, hyps, src, links)]
    chrf = [sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(texts, ref)]
    spearman = {}
    for name in SIGNALS:
        values = [getattr(q, name) for q in searched]
        if name == "length_ratio":  # distance from the usual ratio: both ways are wrong
            mid = sorted(values)[len(values) // 2]
            values = [-abs(math.log(max(v, 1e-3) / mid)) for v in values]
        spearman[name] = round(float(stats.spearmanr(values, chrf).statistic), 3)
    broken = {
        "another sentence's": [texts[(i + 1) % len(texts)] for i in range(len(texts))],
        "truncated": [" ".join(x.split()[:max(1, len(x.split()) // 2)]) for x in texts],
        "repeated": [x + (" " + " ".join(x.split()[-3:])) * 3 for x in texts],
        "untranslated": list(src),
    }
    real = forced(t, src, texts)
    result = {"what": __doc__.split("\n")[0], "cpu": cpu_meta(), "checkpoint": str(ckpt), "sentences": len(src),
              "fields": list(FIELDS), "spearman_with_chrf": spearman, "auroc": {}, "flag_rate": {
                  "real": round(sum(bool(q.flag) for q in real) / len(real), 3)}}
    for kind, outputs in broken.items():
        bad = forced(t, src, outputs)
        result["flag_rate"][kind] = round(sum(bool(q.flag) for q in bad) / len(bad), 3)
        row = {}
        for name in SIGNALS:
            b, g = [getattr(q, name) for q in bad], [getattr(q, name) for q in real]
            if name == "length_ratio":
                b, g = [abs(math.log(max(v, 1e-3))) for v in b], [abs(math.log(max(v, 1e-3))) for v in g]
                a = auroc(b, g)  # broken: farther from 1
            elif name == "repeated":
                a = auroc(b, g)
            else:
                a = 1 - auroc(b, g)  # broken: lower
            row[name] = round(a, 3)
        row["flag"] = round(auroc([float(bool(q.flag)) for q in bad], [float(bool(q.flag)) for q in real]), 3)
        result["auroc"][kind] = row
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
