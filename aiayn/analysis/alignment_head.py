"""Which encoder-decoder head aligns words (§3.2.3; the paper's Figures 3-5 show heads that seem to):
every head and every layer's mean, scored by alignment error rate against reference alignments of
the validation pairs (IBM Model 2 with a diagonal prior, trained here on the prepared training and
validation text: data/ibm.py), teacher-forced on the reference translations. `aiayn align` writes
the best into a copy of the checkpoint, where `translate --alignments` and the server find it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..checkpoint import load_checkpoint, meta_extra, read_weights, save_weights
from ..data.batches import TokenData
from ..data.ibm import align as ibm_align
from ..data.prepare import check_vocabulary, load_manifest, read_text
from ..decode.align import Head, candidates, cross_attention, head_name, links_of, word_links
from ..score import Links, aer

log = logging.getLogger("aiayn")


def training_words(data_dir: Path, tokenizer, limit: int) -> tuple[list[list[str]], list[list[str]]]:
    """The prepared training pairs as words (decoded from their subword ids), at most `limit`."""
    data = TokenData(data_dir, "train")
    n = min(len(data), limit)
    src = tokenizer.decode([data.src(i).tolist() for i in range(n)])
    tgt = tokenizer.decode([data.tgt(i).tolist() for i in range(n)])
    return [s.split() for s in src], [t.split() for t in tgt]


def reference(data_dir: Path, tokenizer, pairs: int, train_limit: int = 100_000
              ) -> tuple[list[str], list[str], list[Links]]:
    """The first `pairs` validation pairs and their reference word alignments (the aligner learns
    on them together with up to `train_limit` training pairs)."""
    manifest = load_manifest(data_dir)
    src = read_text(data_dir, "valid", "src", manifest)[:pairs]
    tgt = read_text(data_dir, "valid", "tgt", manifest)[:pairs]
    t_src, t_tgt = training_words(data_dir, tokenizer, train_limit)
    links = ibm_align([s.split() for s in src] + t_src, [t.split() for t in tgt] + t_tgt)
    return src, tgt, links[:len(src)]


def score_heads(model, tokenizer, src: list[str], tgt: list[str], gold: list[Links]) -> dict[Head, float]:
    """AER of every head and every layer's mean against `gold` (sure = possible)."""
    cfg = model.cfg
    heads = candidates(cfg.n_dec, cfg.h)
    s_ids, t_ids = tokenizer.encode(src), tokenizer.encode_target(tgt)
    found: dict[Head, list[Links]] = {h: [set() for _ in src] for h in heads}
    for k, weights in cross_attention(model, s_ids, t_ids):
        s_p, t_p = tokenizer.id_to_piece(s_ids[k]), tokenizer.id_to_piece(t_ids[k])
        for h in heads:
            found[h][k] = word_links(links_of(weights, h), s_p, t_p)
    return {h: aer(found[h], gold, gold) for h in heads}


def report(scores: dict[Head, float]) -> str:
    """The table `aiayn align` prints, best first."""
    rows = sorted(scores.items(), key=lambda kv: kv[1])
    return "\n".join(f"{head_name(h):<22}AER {a:.3f}" for h, a in rows)


def choose_head(checkpoint: Path, data_dir: Path, out: Path, pairs: int = 500) -> tuple[Head, dict[Head, float]]:
    """`aiayn align`: score every head, write a copy of the checkpoint naming the best (metadata
    "alignment": layer, head, AER against the reference, pairs, reference method)."""
    model, cfg, tokenizer, step = load_checkpoint(checkpoint)
    check_vocabulary(tokenizer.proto, data_dir)
    src, tgt, gold = reference(data_dir, tokenizer, pairs)
    scores = score_heads(model, tokenizer, src, tgt, gold)
    best = min(scores, key=scores.get)
    tensors, meta = read_weights(checkpoint)
    extra = meta_extra(meta, checkpoint)
    extra["alignment"] = {"layer": best[0], "head": best[1], "aer": scores[best], "pairs": len(src),
                          "reference": "IBM Model 2, diagonal prior, grow-diag-final-and (data/ibm.py)",
                          "scores": {head_name(h): round(a, 4) for h, a in scores.items()}}
    save_weights(out, tensors, cfg, tokenizer, step, extra)
    return best, scores
