"""What the target-vocabulary shortlist (aiayn/decode/shortlist.py, `translate --shortlist`) costs and gains.

1. Choice on validation (int8, 2 threads): BLEU with and without shortlists of several sizes
   (per-source K, frequent N), and the columns a sentence keeps.
2. Speed with the chosen one on test2016 (same process, systems alternating, medians): batched
   sentences/s at 2 threads (int8 and bf16), and single-sentence p50 at 1 thread (int8 eager and
   int8 compiled), each against the whole vocabulary.
3. Where it pays: one beam-4 decoder step (1 thread) of a base-size model (§3: d_model 512, 6
   layers, d_ff 2048) with the paper's 37,000-subword WMT vocabulary (random weights: time only),
   whole vocabulary against 800 columns.

    .venv/bin/python bench/decode/shortlist.py   # [--checkpoint FILE] [--data DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import CHECKPOINT, DATA, prepared_data, trained_checkpoint  # noqa: E402

from aiayn.decode.fast import FusedDecoder  # noqa: E402
from aiayn.decode.shortlist import ShortlistDecoder, build  # noqa: E402
from aiayn.decode.translator import Translator  # noqa: E402
from aiayn.models.build import build_model  # noqa: E402
from aiayn.models.precision import cast_bf16, quantize_int8  # noqa: E402
from aiayn.overrides import preset  # noqa: E402

GRID = [(20, 100), (50, 100), (50, 200), (100, 200), (100, 500)]


def choose(ckpt: Path, data: Path) -> tuple[list[dict], tuple[int, int]]:
    """BLEU on validation per shortlist size; the smallest within 0.1 BLEU of the whole vocabulary."""
    torch.set_num_threads(2)
    src, ref = [(data / f"valid.{x}.txt").read_text().splitlines() for x in ("en", "de")]
    tr = Translator.load(ckpt, device="cpu", precision="int8")
    base = sacrebleu.corpus_bleu(tr.translate(src), [ref]).score
    rows = [{"per_source": 0, "frequent": 0, "bleu": base, "columns": len(tr.tokenizer)}]
    for k, n in GRID:
        sl = build(data, k, n)
        tr.use_shortlist(sl)
        cols = [sl.columns(torch.tensor([x]))[0].numel() for x in tr.encode_sources(src)]
        rows.append({"per_source": k, "frequent": n, "bleu": sacrebleu.corpus_bleu(tr.translate(src), [ref]).score,
                     "columns": statistics.mean(cols)})
        tr.use_shortlist(None)
        print(f"K {k:>3} N {n:>3}: valid BLEU {rows[-1]['bleu']:.2f} ({rows[-1]['bleu'] - base:+.2f}), "
              f"{rows[-1]['columns']:.0f} columns per sentence", flush=True)
    ok = [r for r in rows[1:] if r["bleu"] >= base - 0.1]
    best = min(ok, key=lambda r: r["columns"]) if ok else rows[-1]
    return rows, (best["per_source"], best["frequent"])


def _alternate(systems: dict, run, reps: int) -> dict[str, float]:
    """Median seconds of run(system) per system, systems alternating within each repetition."""
    times: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(reps):
        for name, tr in systems.items():
            start = time.perf_counter()
            run(tr)
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def speed(ckpt: Path, data: Path, sl, sentences: int, latency: int) -> dict:
    """Batched sentences/s (2 threads) and single-sentence p50 ms (1 thread), whole vocabulary vs shortlist."""
    src = (data / "test_2016_flickr.en.txt").read_text().splitlines()[:sentences]
    out: dict = {}
    for prec in ("int8", "bf16"):
        torch.set_num_threads(2)
        systems = {f"{prec}{s}": Translator.load(ckpt, device="cpu", precision=prec, shortlist=x)
                   for s, x in (("", None), ("-shortlist", sl))}
        for tr in systems.values():
            tr.translate(src[:50])
        for k, sec in _alternate(systems, lambda tr: tr.translate(src), 3).items():
            out[f"{k} sent/s, 2 threads"] = len(src) / sec
    torch.set_num_threads(1)
    for compiled in (False, True):
        systems = {f"int8{'-compiled' if compiled else ''}{s}": Translator.load(
            ckpt, device="cpu", precision="int8", compiled=compiled, shortlist=x) for s, x in (("", None),
                                                                                            ("-shortlist", sl))}
        per: dict[str, list[float]] = {k: [] for k in systems}
        for tr in systems.values():
            tr.compile_now()
            tr.translate(src[:5])
        for s in src[:latency]:
            for k, sec in _alternate(systems, lambda tr, s=s: tr.translate([s]), 1).items():
                per[k].append(sec)
        for k, v in per.items():
            out[f"{k} p50 ms, 1 thread"] = 1000 * statistics.median(v)
    return out


def base_step(vocab: int = 37_000, columns: int = 800, reps: int = 200) -> dict:
    """One beam-4 step of a base-size decoder at position 10, whole vocabulary vs `columns` of it."""
    torch.set_num_threads(1)
    cfg = preset("base").model
    cfg.vocab_size = vocab
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    src = torch.randint(4, vocab, (1, 20))
    cols = torch.cat([torch.arange(4), torch.randperm(vocab - 4)[:columns - 4].sort().values + 4])
    out = {}
    for prec, fused in (("int8", FusedDecoder(model, int8=True, encoder=quantize_int8(model))),
                        ("bf16", FusedDecoder(cast_bf16(build_model(cfg).eval()), torch.bfloat16))):
        short = ShortlistDecoder(fused, cols, torch.ones(1, columns, dtype=torch.bool))
        times: dict[str, list[float]] = {"whole": [], "shortlist": []}
        for _ in range(reps // 20):
            for name, dec in (("whole", fused), ("shortlist", short)):
                state = dec.start_decoding(src, 4)
                tok = torch.full((4,), 5)
                for t in range(30):
                    start = time.perf_counter()
                    dec.decode_step(tok, state)
                    if t >= 10:
                        times[name].append(time.perf_counter() - start)
        out[prec] = {k: 1e6 * statistics.median(v) for k, v in times.items()}
        print(f"base-size step, vocabulary {vocab}, {prec}: whole {out[prec]['whole']:.0f} us, "
              f"{columns} columns {out[prec]['shortlist']:.0f} us", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--latency", type=int, default=150)
    p.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    args = p.parse_args()
    data, ckpt = prepared_data(args.data), trained_checkpoint(args.checkpoint)
    grid, (k, n) = choose(ckpt, data)
    print(f"chosen on validation: --per-source {k} --frequent {n}", flush=True)
    fast = speed(ckpt, data, build(data, k, n), args.sentences, args.latency)
    for name, v in fast.items():
        print(f"{name:<40}{v:>9.2f}", flush=True)
    result = {"meta": {"torch": torch.__version__, "checkpoint": str(ckpt), "date": time.strftime("%Y-%m-%d")},
              "validation": grid, "chosen": {"per_source": k, "frequent": n}, "speed": fast, "base_step": base_step()}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
