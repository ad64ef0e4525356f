"""Decoding a model pruned by `aiayn heads`: its removed heads sliced out (what Translator does)
against the same weights with the heads only zeroed, in the same run.

Beam 4 over the first N test2016 sentences, the two alternating, medians of the repetitions;
the translations must be identical. Printed and written to bench/decode/2026-11-23_pruned_decode.json.

    .venv/bin/python bench/decode/pruned_decode.py --checkpoint DIR/pruned.safetensors   # [--sentences 400 --reps 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from pathlib import Path

from aiayn.decode.fast import FusedDecoder
from aiayn.decode.translator import Translator
from aiayn.models.attention import without_dead_heads
from aiayn.models.precision import cast_bf16, quantize_int8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="pruned.safetensors written by `aiayn heads`")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[3] / "shared/data/multi30k"))
    ap.add_argument("--sentences", type=int, default=400)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    a = ap.parse_args()
    lines = gzip.open(Path(a.data) / "test_2016_flickr.en.gz", "rt").read().splitlines()[:a.sentences]
    t = Translator.load(a.checkpoint)
    zeroed = {"bf16": cast_bf16, "int8": quantize_int8}.get(t.precision, lambda m: m)(t.model)
    if isinstance(t.search_model, FusedDecoder):  # the same decoder step for both
        zeroed = (FusedDecoder(t.model, int8=True, encoder=zeroed) if t.precision == "int8"
                  else FusedDecoder(zeroed, t.search_model.dtype))
    models = {"sliced": t.search_model, "zeroed": zeroed}
    times: dict[str, list[float]] = {k: [] for k in models}
    outs = {}
    for _ in range(a.reps):
        for name, m in models.items():
            t.search_model = m
            start = time.perf_counter()
            outs[name] = t.translate(lines, beam=4)
            times[name].append(time.perf_counter() - start)
    rate = {k: len(lines) / statistics.median(v) for k, v in times.items()}
    result = {"checkpoint": Path(a.checkpoint).name, "precision": t.precision,
              "heads_removed": without_dead_heads(t.model)[1],
              "sentences": len(lines), "seconds": times, "sent_per_s": rate,
              "ratio_sliced_over_zeroed": rate["sliced"] / rate["zeroed"],
              "identical": outs["sliced"] == outs["zeroed"]}
    print(json.dumps(result, indent=1))
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
