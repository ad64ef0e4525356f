"""Word alignment against human judgement: AER on 100 hand-aligned Multi30k test2016 EN-DE pairs.

The gold links (bench/data/gold_test2016_en-de.align, described in bench/data/README.md) are
scored against, each teacher-forced on the reference German of the same pairs:
- every encoder-decoder head of the checkpoint and every layer's mean (decode/align.py);
- the head `aiayn align` chooses (scored on validation pairs against the reference aligner, never
  on these test pairs: analysis/alignment_head.py);
- the reference aligner itself (data/ibm.py: IBM Model 2 with a diagonal prior, both directions,
  grow-diag-final-and), trained on the 100 pairs together with the Multi30k training corpus.
The corpus: $AIAYN_MULTI30K, else ../shared/data/multi30k beside the repository.
Prints a table (AER, precision against possible links, recall of sure links) and writes JSON.
Then markup (decode/markup.py): 1,000 random tags over 1-3 source words of the 100 pairs, each put
back onto the reference German by a method's links (`markup.place`, as `translate --markup` does);
a tag counts as right when its target words overlap the words the gold links give its source words
(tags over words the gold leaves unlinked are left out).

    .venv/bin/python bench/align/alignment_aer.py [--checkpoint runs/multi30k-en-de/averaged.safetensors]
        [--data work/multi30k-en-de] [--out bench/align/2026-11-26_alignment_aer.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import CHECKPOINT, DATA, ROOT, cpu_meta, prepared_data, trained_checkpoint  # noqa: E402

GOLD = ROOT / "bench" / "data" / "gold_test2016_en-de.align"
CORPUS = Path(os.environ.get("AIAYN_MULTI30K") or ROOT.parent / "shared" / "data" / "multi30k")


def lines(name: str, n: int | None = None) -> list[str]:
    with gzip.open(CORPUS / name, "rt", encoding="utf-8") as f:
        out = f.read().splitlines()
    return out[:n] if n else out


def scores(found: list[set], sure: list[set], possible: list[set]) -> dict[str, float]:
    """AER (Och & Ney 2003), precision (links in P) and recall (S found)."""
    from aiayn.score import aer

    n_a = sum(len(a) for a in found)
    in_p = sum(len(a & (s | p)) for a, s, p in zip(found, sure, possible))
    in_s = sum(len(a & s) for a, s in zip(found, sure))
    return {"aer": aer(found, sure, possible), "precision": in_p / max(n_a, 1),
            "recall": in_s / max(sum(len(s) for s in sure), 1), "links": n_a}


def tag_overlap(found: list[set], sure: list[set], possible: list[set], src: list[str], tgt: list[str],
                n: int = 1000, seed: int = 0) -> dict[str, float]:
    """Share of random tags (1-3 source words) whose placed target words overlap the gold span."""
    import random

    from aiayn.decode.markup import Node, place

    rng, hits, asked = random.Random(seed), 0, 0
    while asked < n:
        k = rng.randrange(len(src))
        n_src, width = len(src[k].split()), rng.randint(1, 3)
        i = rng.randrange(max(n_src - width + 1, 1))
        tag = Node("<b>", "</b>", i, min(i + width, n_src))
        gold = {j for a, j in sure[k] | possible[k] if tag.start <= a < tag.end}
        if not gold:
            continue
        place(Node("", "", children=[tag]), found[k], len(tgt[k].split()))
        asked += 1
        hits += bool(gold & set(range(tag.start, tag.end)))
    return {"tags": asked, "overlap": hits / asked}


def model_links(checkpoint: Path, src: list[str], tgt: list[str]) -> tuple[dict, object]:
    """Word links of every head and layer mean, teacher-forced on the reference translations."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.decode.align import candidates, cross_attention, links_of, word_links

    model, _, tok, _ = load_checkpoint(checkpoint)
    model.eval()
    heads = candidates(model.cfg.n_dec, model.cfg.h)
    s_ids, t_ids = tok.encode(src), tok.encode_target(tgt)
    found = {h: [set() for _ in src] for h in heads}
    for k, weights in cross_attention(model, s_ids, t_ids):
        for h in heads:
            found[h][k] = word_links(links_of(weights, h), tok.id_to_piece(s_ids[k]), tok.id_to_piece(t_ids[k]))
    return found, (model, tok)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", default=str(CHECKPOINT))
    p.add_argument("--data", default=str(DATA), help="prepared data: the validation pairs `aiayn align` chooses on")
    p.add_argument("--pairs", type=int, default=500, help="validation pairs the head is chosen on")
    p.add_argument("--out", default="bench/align/2026-11-26_alignment_aer.json")
    args = p.parse_args()
    from aiayn.analysis.alignment_head import reference, score_heads
    from aiayn.data.ibm import align as ibm_align
    from aiayn.decode.align import head_name
    from aiayn.score import read_pharaoh

    checkpoint = trained_checkpoint(Path(args.checkpoint))
    data = prepared_data(Path(args.data)) if Path(args.data).resolve() == DATA else Path(args.data)
    gold = [read_pharaoh(line) for line in GOLD.read_text().splitlines()]
    sure, possible = [s for s, _ in gold], [p for _, p in gold]
    src, tgt = lines("test_2016_flickr.en.gz", len(gold)), lines("test_2016_flickr.de.gz", len(gold))
    rows = {}
    found, (model, tok) = model_links(checkpoint, src, tgt)
    for h, links in found.items():
        rows[head_name(h)] = scores(links, sure, possible)
    start = time.perf_counter()
    v_src, v_tgt, v_ref = reference(data, tok, args.pairs)  # the choice: validation vs the IBM reference
    chosen = min((by := score_heads(model, tok, v_src, v_tgt, v_ref)), key=by.get)
    train_src, train_tgt = lines("train.en.gz"), lines("train.de.gz")
    ibm = ibm_align([s.split() for s in src + train_src], [t.split() for t in tgt + train_tgt])[:len(src)]
    rows["IBM Model 2 (reference aligner)"] = scores(ibm, sure, possible)
    tags = {head_name(chosen) + " (aiayn align's choice)": tag_overlap(found[chosen], sure, possible, src, tgt),
            "IBM Model 2 (reference aligner)": tag_overlap(ibm, sure, possible, src, tgt),
            "gold links themselves (check)": tag_overlap([s | p for s, p in gold], sure, possible, src, tgt)}
    print(f"(head chosen on {len(v_src)} validation pairs and the IBM aligner: {time.perf_counter() - start:.0f} s)")
    print(f"\n{'method':<36}{'AER':>7}{'prec.':>7}{'recall':>7}{'links':>7}")
    best = min(rows, key=lambda k: rows[k]["aer"])
    for name, r in sorted(rows.items(), key=lambda kv: kv[1]["aer"]):
        mark = " <- aiayn align's choice" if name == head_name(chosen) else (" <- best" if name == best else "")
        print(f"{name:<36}{r['aer']:>7.3f}{r['precision']:>7.3f}{r['recall']:>7.3f}{r['links']:>7}{mark}")
    print("\nmarkup: random tags put back onto the reference, overlapping the gold span")
    for name, r in tags.items():
        print(f"{name:<48}{100 * r['overlap']:>6.1f} % of {r['tags']}")
    meta = {"checkpoint": str(checkpoint), "gold": GOLD.name, "pairs": len(gold), "sure": sum(map(len, sure)),
            "possible": sum(map(len, possible)), "chosen": head_name(chosen), "chosen_on_valid_pairs": len(v_src),
            "cpu": cpu_meta(), "date": time.strftime("%Y-%m-%d")}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "tags": tags}, indent=1))


if __name__ == "__main__":
    main()
