"""Beam-4 decoding speed: aiayn (fp32, bf16, int8) vs Hugging Face `generate` and CTranslate2
(float32, int8) on the same weights (through `aiayn export hf` / `aiayn export ct2`).
Runs alternate (A B C A B C ...); medians of sentences/s and target tokens/s, sacreBLEU of
each, the ratio to HF, and single-sentence latency (p50/p95, 1 and 2 threads).

    .venv/bin/pip install -e '.[bench]'      # scripts/setup.sh does this
    .venv/bin/python bench/decode_speed.py   # [--checkpoint FILE --src FILE --ref FILE]

Defaults: the main job's averaged checkpoint and test2016 (bench/benchdata.py makes them when
missing: data preparation, then the main job's 30 minutes of training).

HF gets the same beam (4), the same maximum length (source + 50) and α = 0.6 in its own length
penalty form (score / length^α; GNMT's ((5+|Y|)/6)^α is not available there), batches of 32
sentences sorted by length; CTranslate2 the same beam, α and maximum length, batches of 64.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch
from benchdata import CHECKPOINT, DATA, prepared_data, trained_checkpoint

from aiayn.export import export_ct2, export_hf
from aiayn.translate import Translator


def hf_translate(model, tok, src: list[str], beam: int, alpha: float, batch: int = 32) -> tuple[list[str], int]:
    order = sorted(range(len(src)), key=lambda i: len(src[i]))
    out: list[str] = [""] * len(src)
    n_tok = 0
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        enc = tok([src[i] for i in idx], return_tensors="pt", padding=True)
        with torch.no_grad():
            gen = model.generate(**enc, num_beams=beam, length_penalty=alpha,
                                 max_new_tokens=int(enc.attention_mask.sum(1).max()) + 50)
        # Finished rows are padded with EOS: count up to and including the first EOS.
        out_ids = gen[:, 1:]
        is_eos = out_ids == tok.eos_token_id
        n_tok += int(torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, (out_ids != tok.pad_token_id).sum(1)).sum())
        for i, text in zip(idx, tok.batch_decode(gen, skip_special_tokens=True)):
            out[i] = text
    return out, n_tok


def ct2_translate(translator, sp, src: list[str], beam: int, alpha: float) -> tuple[list[str], int]:
    pieces = [sp.encode(s, out_type=str) + ["</s>"] for s in src]
    res = translator.translate_batch(pieces, beam_size=beam, length_penalty=alpha, max_batch_size=64,
                                     batch_type="examples", max_decoding_length=max(map(len, pieces)) + 50)
    hyps = [r.hypotheses[0] for r in res]
    return [sp.decode(h) for h in hyps], sum(len(h) + 1 for h in hyps)


def measure_latency(fns: dict, src: list[str], threads_after: int) -> list[dict]:
    """p50/p95 of translating one sentence at a time (beam 4), with 1 and 2 threads; systems
    alternate sentence by sentence, so a busy moment of the machine hits all of them alike."""
    rows: list[dict] = []
    if not src:
        return rows
    for threads in (1, 2):
        torch.set_num_threads(threads)
        names = [n for n in fns if "@" not in n or n.endswith(f"@{threads}")]
        for name in names:  # warm-up
            fns[name](src[0])
        times: dict[str, list[float]] = {n: [] for n in names}
        for s in src:
            for name in names:
                start = time.perf_counter()
                fns[name](s)
                times[name].append(1000 * (time.perf_counter() - start))
        for name in names:
            t = sorted(times[name])
            rows.append({"system": name.split("@")[0], "threads": threads, "p50_ms": statistics.median(t),
                         "p95_ms": t[min(len(t) - 1, int(0.95 * len(t)))]})
    torch.set_num_threads(threads_after)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    p.add_argument("--src", type=Path, default=DATA / "test_2016_flickr.en.txt")
    p.add_argument("--ref", type=Path, default=DATA / "test_2016_flickr.de.txt")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--unbatched", type=int, default=200,
                   help="compare the first N batched translations with one-sentence-at-a-time decoding")
    p.add_argument("--latency", type=int, default=200, help="sentences for the single-sentence latency (0: skip)")
    p.add_argument("--out", default="bench/decode_speed.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.src.parent == DATA:
        prepared_data(DATA)
    args.checkpoint = trained_checkpoint(args.checkpoint)
    from transformers import MarianMTModel, MarianTokenizer

    src = Path(args.src).read_text(encoding="utf-8").splitlines()
    ref = Path(args.ref).read_text(encoding="utf-8").splitlines()
    hf_dir = Path(tempfile.mkdtemp()) / "hf"
    export_hf(Path(args.checkpoint), hf_dir)
    hf_model = MarianMTModel.from_pretrained(hf_dir).eval()
    hf_tok = MarianTokenizer.from_pretrained(hf_dir)
    ours = {prec: Translator.load(args.checkpoint, precision=prec) for prec in ("fp32", "bf16", "int8")}

    def run_ours(prec: str) -> tuple[list[str], int]:
        t = ours[prec]
        hyps = t.translate_ids(t.encode_sources(src), beam=4, alpha=0.6, nbest=1)
        return t.tokenizer.decode([h[0].tokens if h else [] for h in hyps]), sum(len(h[0].tokens) + 1 for h in hyps)

    systems = {"aiayn-fp32": lambda: run_ours("fp32"), "aiayn-bf16": lambda: run_ours("bf16"),
               "aiayn-int8": lambda: run_ours("int8"),
               "hf-generate-fp32": lambda: hf_translate(hf_model, hf_tok, src, 4, 0.6)}
    one_sentence = {f"aiayn-{prec}": (lambda s, t=t: t.translate([s], beam=4, alpha=0.6)) for prec, t in ours.items()}
    try:
        import ctranslate2
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(hf_dir / "source.spm"))
        for quant in ("float32", "int8"):
            ct2_dir = hf_dir.parent / f"ct2-{quant}"
            export_ct2(Path(args.checkpoint), ct2_dir, quant)
            tr = ctranslate2.Translator(str(ct2_dir), device="cpu", inter_threads=1, intra_threads=args.threads)
            systems[f"ct2-{quant}"] = lambda tr=tr: ct2_translate(tr, sp, src, 4, 0.6)
            for threads in (1, 2):  # latency is measured at both thread counts
                tr_t = ctranslate2.Translator(str(ct2_dir), device="cpu", inter_threads=1, intra_threads=threads)
                one_sentence[f"ct2-{quant}@{threads}"] = lambda s, tr=tr_t: ct2_translate(tr, sp, [s], 4, 0.6)
    except ImportError:
        print("ctranslate2 not installed: skipping CTranslate2")
    times: dict[str, list[float]] = {k: [] for k in systems}
    outputs: dict[str, tuple[list[str], int]] = {}
    for rep in range(args.reps):
        for name, fn in systems.items():
            start = time.perf_counter()
            outputs[name] = fn()
            times[name].append(time.perf_counter() - start)
            print(f"  rep {rep + 1} {name:<18}{len(src) / times[name][-1]:>8.1f} sent/s", flush=True)
    ref_speed = len(src) / statistics.median(times["hf-generate-fp32"])
    rows = []
    for name in systems:
        sec = statistics.median(times[name])
        text, n_tok = outputs[name]
        rows.append({"system": name, "sent_per_s": len(src) / sec, "tgt_tok_per_s": n_tok / sec,
                     "vs_hf": len(src) / sec / ref_speed, "bleu": sacrebleu.corpus_bleu(text, [ref]).score})
    same = sum(a == b for a, b in zip(outputs["aiayn-fp32"][0], outputs["hf-generate-fp32"][0]))
    # The unbatched reference: the same search, one sentence per batch, no padding, no drops.
    alone = {}
    for prec, t in ours.items():
        ids = t.encode_sources(src[:args.unbatched])
        hyps = [t.translate_ids([x], beam=4, alpha=0.6, nbest=1)[0] for x in ids]
        text = t.tokenizer.decode([h[0].tokens if h else [] for h in hyps])
        alone[prec] = sum(a == b for a, b in zip(text, outputs[f"aiayn-{prec}"][0]))
        print(f"aiayn {prec}: batched = unbatched for {alone[prec]} of {len(ids)} sentences")
    print(f"\n{'system':<18}{'sent/s':>8}{'tok/s':>8}{'x HF':>7}{'BLEU':>7}")
    for r in rows:
        print(f"{r['system']:<18}{r['sent_per_s']:>8.1f}{r['tgt_tok_per_s']:>8.0f}{r['vs_hf']:>7.2f}{r['bleu']:>7.2f}")
    print(f"aiayn fp32 and HF give the same translation for {same} of {len(src)} sentences")
    latency = measure_latency(one_sentence, src[:args.latency], args.threads)
    print(f"\nsingle-sentence latency over {min(args.latency, len(src))} sentences, beam 4 (ms):")
    print(f"{'system':<18}{'threads':>8}{'p50':>8}{'p95':>8}")
    for r in latency:
        print(f"{r['system']:<18}{r['threads']:>8}{r['p50_ms']:>8.1f}{r['p95_ms']:>8.1f}")
    meta = {"torch": torch.__version__, "threads": args.threads, "machine": platform.processor() or platform.machine(),
            "sentences": len(src), "reps": args.reps, "date": time.strftime("%Y-%m-%d"), "identical_to_hf": same,
            "unbatched_checked": args.unbatched, "identical_to_unbatched": alone}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "latency": latency}, indent=1))


if __name__ == "__main__":
    main()
