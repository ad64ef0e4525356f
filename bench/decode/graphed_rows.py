"""How much decoder work the graphed beam search spends on sentences that are done.

A CUDA graph computes every row it was recorded with, so `graphed_beam_search` runs a batch's done
sentences on until it shrinks (`graphed.SHRINK`: once at most half the batch is open, the open ones go
on alone, recorded again). On a GPU whose decoding is no longer launch-bound, those rows are the cost.
This counts, for a trained model's beam-4 search of real test sentences in the GPU's batches (16,384
source tokens, sorted by length as the translator makes them), the decoder rows computed summed over
steps ("row-steps"): eager `beam_search` (done sentences dropped at each look), the graphed search kept
whole (`shrink=0`) and shrinking at half; with the steps, the recordings and whether the hypotheses
equal the eager search's. The counts come from the search itself, so a CPU gives a GPU's (emulated
replay); the CPU seconds printed beside them are the emulation's, not a GPU's. Writes JSON.

    .venv/bin/python bench/decode/graphed_rows.py --checkpoint RUN/averaged.safetensors \
        --source DATA/test_2016_flickr.en.txt [--reference DATA/test_2016_flickr.de.txt] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiayn.decode.fast import FusedDecoder, StepOptions, fast_decoder, graphed  # noqa: E402
from aiayn.decode.search import beam_search  # noqa: E402
from aiayn.decode.translator import Translator  # noqa: E402
from aiayn.device import cpu_class  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402


def _batches(tr: Translator, ids: list[list[int]], max_tokens: int) -> list[tuple[list[int], torch.Tensor]]:
    out = []
    for batch in tr._batches(ids, max_tokens):
        src = torch.zeros(len(batch), max(len(ids[i]) for i in batch), dtype=torch.long)
        for b, i in enumerate(batch):
            src[b, :len(ids[i])] = torch.tensor(ids[i])
        out.append((batch, src))
    return out


def _search(fd, batches, mode: str, beam: int) -> list[list[int]]:
    """Every batch searched in `mode` (eager, whole, shrink): each sentence's best hypothesis, in order."""
    hyps: dict[int, list[int]] = {}
    for batch, src in batches:
        if mode == "eager":
            got = beam_search(fd, src, beam, 0.6, 1.0, 50, 1)
        else:
            got = graphed.graphed_beam_search(fd, src, beam, 0.6, 1.0, 50, 1, shrink=0.0 if mode == "whole" else 0.5)
        hyps.update({i: h[0].tokens for i, h in zip(batch, got)})
    return [hyps[i] for i in sorted(hyps)]


def _counting(fd, counts: dict):
    """Count the decoder rows of every step: the eager step's tokens, the graphed search step's beams."""
    real_step, real_search, real_rec = fd.decode_step, graphed._search_step, graphed.Recorded

    def step(tokens, state):
        counts["row_steps"] += tokens.numel()
        counts["steps"] += 1
        return real_step(tokens, state)

    def search_step(dec, b, state, k, alpha):
        counts["row_steps"] += b.tokens.numel()
        counts["steps"] += 1
        return real_search(dec, b, state, k, alpha)

    class Counted(real_rec):
        def __init__(self, fn, device):
            counts["recordings"] += 1
            super().__init__(fn, device)

    fd.decode_step, graphed._search_step, graphed.Recorded = step, search_step, Counted
    return lambda: (delattr(fd, "decode_step"), setattr(graphed, "_search_step", real_search),
                    setattr(graphed, "Recorded", real_rec))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--reference")
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).with_name("graphed_rows.json")))
    a = ap.parse_args()
    if a.max_tokens < 1 or a.beam < 1:
        ap.error(f"--max-tokens and --beam must be >= 1, got {a.max_tokens} and {a.beam}")
    torch.manual_seed(0)
    try:  # a checkpoint or text that cannot be read: one line, no traceback
        tr = Translator.load(a.checkpoint, device="cpu", precision="fp32")
        lines = Path(a.source).read_text(encoding="utf-8").splitlines()
        refs = Path(a.reference).read_text(encoding="utf-8").splitlines() if a.reference else None
    except (AiaynError, OSError, UnicodeDecodeError) as e:
        ap.error(str(e))
    if refs is not None and len(refs) != len(lines):
        ap.error(f"--reference {a.reference}: {len(refs)} lines, --source {a.source}: {len(lines)}")
    if not isinstance(tr.search_model, FusedDecoder):
        ap.error(f"--checkpoint {a.checkpoint}: not a Transformer the fused step takes (no graphed search)")
    # a GPU's attention, which the graphed step takes; the eager search and the graphed one
    eager_fd = fast_decoder(tr.model, tr.precision, options=StepOptions(sdpa=True), check=False)
    graphed_fd = fast_decoder(tr.model, tr.precision, options=StepOptions(sdpa=True, graphs=True), check=False)
    batches = _batches(tr, tr.encode_sources(lines), a.max_tokens)
    rows, outs = [], {}
    for mode in ("eager", "whole", "shrink"):
        counts = {"row_steps": 0, "steps": 0, "recordings": 0}
        fd = eager_fd if mode == "eager" else graphed_fd
        undo = _counting(fd, counts)
        t0 = time.perf_counter()
        try:
            outs[mode] = _search(fd, batches, mode, a.beam)
        finally:
            undo()
        row = {"search": mode, **counts, "cpu_seconds": round(time.perf_counter() - t0, 1),
               "same_as_eager": sum(x == y for x, y in zip(outs[mode], outs["eager"]))}
        if refs is not None:
            hyp = tr.tokenizer.decode(outs[mode])
            row["bleu"] = round(sacrebleu.corpus_bleu(hyp, [refs]).score, 2)
        rows.append(row)
    eager = rows[0]["row_steps"]
    for r in rows:
        r["row_steps_over_eager"] = round(r["row_steps"] / eager, 3)
    print(f"{len(lines)} sentences in {len(batches)} batches of <= {a.max_tokens} source tokens, beam {a.beam}")
    print(f"{'search':8} {'row-steps':>10} {'× eager':>8} {'steps':>6} {'recordings':>10} {'same':>6} "
          f"{'BLEU':>6} cpu s")
    for r in rows:
        print(f"{r['search']:8} {r['row_steps']:>10} {r['row_steps_over_eager']:>8} {r['steps']:>6} "
              f"{r['recordings']:>10} {r['same_as_eager']:>6} {r.get('bleu', '-'):>6} {r['cpu_seconds']}")
    out = {"command": "bench/decode/graphed_rows.py " + " ".join(sys.argv[1:]), "checkpoint": a.checkpoint,
           "sentences": len(lines), "batches": [len(b) for b, _ in batches], "max_tokens": a.max_tokens,
           "beam": a.beam, "cpu": cpu_class(), "machine": platform.machine(), "torch": torch.__version__, "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
