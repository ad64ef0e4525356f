"""Terms the user dictates, measured: term-use rate, BLEU with and without, and the cost in speed.

A lexicon is learned from the training split alone (Dice coefficient of English and German words
over aligned sentences; content words seen 20+ times, Dice ≥ 0.3, the German word's most frequent
spelling). On test2016 and test2017:

- natural terms: for each sentence, the lexicon entries whose English word it holds and whose
  German word its reference holds — the reference's own translation; BLEU of those sentences with
  the terms dictated (Translator.translate(constraints=)) against without (sacreBLEU's paired
  bootstrap, 1,000 resamples);
- unnatural terms: for each sentence holding a lexicon word, a wrong-but-dictated term (another
  entry's German word, or two of them as a phrase), so obedience is tested, not luck;
- the glossary file path: the whole lexicon as a TSV (decode/glossary.py), every sentence
  translated with it; sentences no entry matches must come out as they do without it.

A term is used when it appears in the output as whole words (cased as dictated). Beam 4; sentences
with terms search with decode.constraint_beam (default 8). Speed: sentences/s of the sentences with
natural terms, with and without them, alternating repetitions, medians.

    .venv/bin/python bench/decode/glossary.py [--checkpoint CKPT] [--data PREPARED] [--corpus DIR] [--reps 3]
    .venv/bin/python bench/decode/glossary.py --valid-sweep   # decode.constraint_beam chosen on validation
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchdata import ROOT, cpu_meta, prepared_data, trained_checkpoint  # noqa: E402

from aiayn.decode.glossary import Glossary  # noqa: E402
from aiayn.decode.translator import Translator  # noqa: E402
from aiayn.evidence.stats import paired_bootstrap  # noqa: E402

WORD = re.compile(r"\w+")


def lexicon(src: list[str], tgt: list[str], min_count: int = 20, min_dice: float = 0.3) -> dict[str, str]:
    """English word -> German word by the Dice coefficient over aligned lines (lowercased, whole words)."""
    fe, fg, both = collections.Counter(), collections.Counter(), collections.Counter()
    spelled: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e, g in zip(src, tgt):
        ew = {w.lower() for w in WORD.findall(e) if len(w) >= 4}
        gw = set()
        for w in WORD.findall(g):
            if len(w) >= 4:
                spelled[w.lower()][w] += 1
                gw.add(w.lower())
        fe.update(ew)
        fg.update(gw)
        both.update((a, b) for a in ew for b in gw)
    best: dict[str, tuple[float, str]] = {}
    for (a, b), n in both.items():
        if fe[a] >= min_count and fg[b] >= min_count:
            d = 2 * n / (fe[a] + fg[b])
            if d >= min_dice and d > best.get(a, (0.0, ""))[0]:
                best[a] = (d, b)
    return {a: spelled[b].most_common(1)[0][0] for a, (_, b) in sorted(best.items())}


def holds(text: str, term: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(term)}(?!\w)", text) is not None


def terms_of(src: list[str], ref: list[str], lex: dict[str, str], rng: random.Random
             ) -> tuple[list[list[str]], list[list[str]]]:
    """Per sentence, its natural terms (source word in the line, German word in the reference) and one
    unnatural term (another entry's German word, every third a two-word phrase)."""
    targets = sorted(set(lex.values()))
    natural, unnatural = [], []
    for s, r in zip(src, ref):
        words = [w.lower() for w in WORD.findall(s)]
        found = [w for w in dict.fromkeys(words) if w in lex]
        natural.append([lex[w] for w in found if holds(r, lex[w])])
        if not found:
            unnatural.append([])
            continue
        wrong = [x for x in targets if x != lex[found[0]] and not holds(r, x)]
        term = rng.choice(wrong)
        if rng.random() < 1 / 3:
            term = f"{term} {rng.choice(wrong)}"
        unnatural.append([term])
    return natural, unnatural


def use_rate(outputs: list[str], terms: list[list[str]]) -> tuple[int, int]:
    asked = [(o, t) for o, ts in zip(outputs, terms) for t in ts]
    return sum(holds(o, t) for o, t in asked), len(asked)


def timed(fn) -> tuple[float, list[str]]:
    began = time.perf_counter()
    out = fn()
    return time.perf_counter() - began, out


def measure(t: Translator, src: list[str], ref: list[str], lex: dict[str, str], glossary: Glossary, reps: int,
            seed: int) -> dict:
    natural, unnatural = terms_of(src, ref, lex, random.Random(seed))
    plain = t.translate(src, beam=4, alpha=0.6)
    nat = [i for i, ts in enumerate(natural) if ts]
    sub = [src[i] for i in nat]
    with_terms = t.translate(sub, beam=4, alpha=0.6, constraints=[natural[i] for i in nat])
    refs = [[ref[i] for i in nat]]
    bleu_without = sacrebleu.corpus_bleu([plain[i] for i in nat], refs)
    bleu_with = sacrebleu.corpus_bleu(with_terms, refs)
    unn = [i for i, ts in enumerate(unnatural) if ts]
    dictated = t.translate([src[i] for i in unn], beam=4, alpha=0.6, constraints=[unnatural[i] for i in unn])
    by_file = t.translate(src, beam=4, alpha=0.6, glossary=glossary)
    matched = [[e.target for e in glossary.matches(s)] for s in src]
    unmatched = [i for i, m in enumerate(matched) if not m]
    speed = {"plain": [], "terms": []}
    for _ in range(reps):  # alternating, the same sentences
        speed["plain"].append(len(sub) / timed(lambda: t.translate(sub, beam=4, alpha=0.6))[0])
        speed["terms"].append(len(sub) / timed(lambda: t.translate(sub, beam=4, alpha=0.6, constraints=[
            natural[i] for i in nat]))[0])
    n_used, n_asked = use_rate(with_terms, [natural[i] for i in nat])
    u_used, u_asked = use_rate(dictated, [unnatural[i] for i in unn])
    g_used, g_asked = use_rate(by_file, matched)
    return {
        "sentences": len(src),
        "natural": {"sentences": len(nat), "terms": n_asked, "used": n_used, "rate": round(n_used / n_asked, 4),
                    "used_without_glossary": use_rate([plain[i] for i in nat], [natural[i] for i in nat])[0],
                    "bleu_without": round(bleu_without.score, 2), "bleu_with": round(bleu_with.score, 2),
                    "bleu_paired_bootstrap": paired_bootstrap([plain[i] for i in nat], with_terms, refs[0]),
                    "chrf_without": round(sacrebleu.corpus_chrf([plain[i] for i in nat], refs).score, 2),
                    "chrf_with": round(sacrebleu.corpus_chrf(with_terms, refs).score, 2)},
        "unnatural": {"sentences": len(unn), "terms": u_asked, "used": u_used, "rate": round(u_used / u_asked, 4),
                      "phrases": sum(" " in ts[0] for ts in (unnatural[i] for i in unn))},
        "glossary_file": {"entries": len(glossary.entries), "sentences_matched": len(src) - len(unmatched),
                          "terms": g_asked, "used": g_used, "rate": round(g_used / max(g_asked, 1), 4),
                          "unmatched_sentences": len(unmatched),
                          "unmatched_identical": sum(by_file[i] == plain[i] for i in unmatched)},
        "speed_sentences_per_s": {k: [round(x, 2) for x in v] for k, v in speed.items()},
        "speed_median_ratio": round(statistics.median(speed["terms"]) / statistics.median(speed["plain"]), 3),
        "examples": [{"src": src[i], "terms": natural[i], "without": plain[i], "with": w}
                     for i, w in list(zip(nat, with_terms))[:3]]
        + [{"src": src[i], "terms": unnatural[i], "with": d} for i, d in list(zip(unn, dictated))[:3]],
    }


def valid_sweep(t: Translator, data: Path, lex: dict[str, str], beams=(4, 5, 6, 8, 12, 16)) -> dict:
    """decode.constraint_beam chosen on validation: BLEU, chrF and speed of the sentences with natural
    terms, with the terms at each beam, against beam 4 without them (the paper's beam)."""
    src = (data / "valid.en.txt").read_text().splitlines()
    ref = (data / "valid.de.txt").read_text().splitlines()
    natural, _ = terms_of(src, ref, lex, random.Random(0))
    nat = [i for i, ts in enumerate(natural) if ts]
    sub, refs, cons = [src[i] for i in nat], [[ref[i] for i in nat]], [natural[i] for i in nat]
    seconds, plain = timed(lambda: t.translate(sub, beam=4, alpha=0.6))
    rows = [{"constraint_beam": None, "bleu": round(sacrebleu.corpus_bleu(plain, refs).score, 2),
             "chrf": round(sacrebleu.corpus_chrf(plain, refs).score, 2),
             "sentences_per_s": round(len(sub) / seconds, 1)}]
    for k in beams:
        t.decode_cfg.constraint_beam = k
        seconds, out = timed(lambda: t.translate(sub, beam=4, alpha=0.6, constraints=cons))
        rows.append({"constraint_beam": k, "bleu": round(sacrebleu.corpus_bleu(out, refs).score, 2),
                     "chrf": round(sacrebleu.corpus_chrf(out, refs).score, 2),
                     "sentences_per_s": round(len(sub) / seconds, 1)})
        print(rows[-1], flush=True)
    t.decode_cfg.constraint_beam = 0
    return {"sentences": len(sub), "terms": sum(map(len, cons)), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--data", type=Path)
    p.add_argument("--corpus", type=Path, help="the Multi30k folder whose train.en.gz/train.de.gz the lexicon is "
                   "learned from (default $AIAYN_MULTI30K, else ../shared/data/multi30k)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--precision", default="auto")
    p.add_argument("--valid-sweep", action="store_true",
                   help="only the choice of decode.constraint_beam on the validation set")
    p.add_argument("--out", type=Path,
                   default=ROOT / "bench" / "decode" / f"{datetime.date.today()}_glossary.json")
    args = p.parse_args()
    ckpt = args.checkpoint or trained_checkpoint()
    data = args.data or prepared_data()
    t = Translator.load(ckpt, precision=args.precision)
    corpus = args.corpus or Path(os.environ.get("AIAYN_MULTI30K", ROOT.parent / "shared" / "data" / "multi30k"))
    lex = lexicon(*(gzip.open(corpus / f"train.{x}.gz", "rt", encoding="utf-8").read().splitlines()
                    for x in ("en", "de")))
    glossary = Glossary.from_pairs([[a, b] for a, b in lex.items()], "lexicon entry")
    result = {"what": __doc__.split("\n")[0], "cpu": cpu_meta(), "checkpoint": str(ckpt), "precision": t.precision,
              "step": t.step, "lexicon_entries": len(lex), "sets": {},
              "decode": {"beam": 4, "alpha": 0.6, "constraint_beam": t.decode_cfg.constraint_beam or 8}}
    if args.valid_sweep:
        result = {**{k: v for k, v in result.items() if k != "sets"}, "valid_sweep": valid_sweep(t, data, lex)}
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        return
    for k, split in enumerate(("test_2016_flickr", "test_2017_flickr")):
        src = (data / f"{split}.en.txt").read_text().splitlines()
        ref = (data / f"{split}.de.txt").read_text().splitlines()
        result["sets"][split] = measure(t, src, ref, lex, glossary, args.reps, seed=k + 1)
        print(json.dumps({split: result["sets"][split]}, indent=1, ensure_ascii=False), flush=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
