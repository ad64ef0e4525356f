"""Beam-4 decoding speed: aiayn (fp32, bf16, int8) vs Hugging Face `generate` and CTranslate2
(float32, int8) on the same weights (through `aiayn export hf` / `aiayn export ct2`).
Every measurement runs in a fresh process of its own, one system at a time, systems alternating
(A B C A B C ...): PyTorch and CTranslate2 each bring their own OpenMP runtime, and in one
process one library's idle threads slowed the other by 10-25 %. Reported: medians of
sentences/s and target tokens/s, sacreBLEU of each, the ratio to HF, and single-sentence
latency (p50/p95 over 200 sentences, 1 and 2 threads). `-modules`: the decoder's modules
instead of the fused step; `-compiled`: the fused step under torch.compile, whose compile time
(paid once per process, before the clock starts) is reported as `compile_s`; `-shortlist`:
`translate --shortlist` with `aiayn shortlist`'s defaults, built from --data's training pairs.

    .venv/bin/pip install -e '.[bench]'      # scripts/setup.sh does this
    .venv/bin/python bench/decode/decode_speed.py   # [--checkpoint FILE --src FILE --ref FILE]

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import CHECKPOINT, DATA, cpu_meta, meaningful, prepared_data, switches, trained_checkpoint  # noqa: E402

from aiayn.decode.shortlist import build  # noqa: E402
from aiayn.decode.translator import Translator  # noqa: E402
from aiayn.export import export_ct2, export_hf  # noqa: E402


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


# -modules: the same precision with the decoder step through the modules, not fusedstep; aiayn-auto: what
# --precision auto runs for this checkpoint here (on a tuned one, tune's choice for this processor class)
SYSTEMS = ("aiayn-auto", "aiayn-fp32", "aiayn-bf16", "aiayn-int8", "hf-generate-fp32", "ct2-float32", "ct2-int8",
           "aiayn-fp32-modules", "aiayn-bf16-modules", "aiayn-int8-modules",
           "aiayn-fp32-compiled", "aiayn-bf16-compiled", "aiayn-int8-compiled",
           "aiayn-int8-shortlist", "aiayn-int8-compiled-shortlist", "aiayn-bf16-shortlist")


def load_system(name: str, checkpoint: Path, export_dir: Path, threads: int):
    """(translate a list of sentences -> (texts, target tokens), the aiayn Translator or None)."""
    torch.set_num_threads(threads)
    if name.startswith("aiayn-"):
        shortlist = export_dir / "shortlist.safetensors" if name.endswith("-shortlist") else None
        step = "modules" if name.endswith("-modules") else "compiled" if "-compiled" in name else "auto"
        t = Translator.load(checkpoint, precision=name.split("-")[1], step=step, shortlist=shortlist)
        t.compile_seconds = t.compile_now()  # the start-up cost of -compiled (0 otherwise)
        def run(src: list[str]) -> tuple[list[str], int]:
            hyps = t.translate_ids(t.encode_sources(src), beam=4, alpha=0.6, nbest=1)
            return t.tokenizer.decode([h[0].tokens if h else [] for h in hyps]), sum(len(h[0].tokens) + 1 for h in hyps)
        return run, t
    if name == "hf-generate-fp32":
        from transformers import MarianMTModel, MarianTokenizer

        model = MarianMTModel.from_pretrained(export_dir / "hf").eval()
        tok = MarianTokenizer.from_pretrained(export_dir / "hf")
        return (lambda src: hf_translate(model, tok, src, 4, 0.6)), None
    import ctranslate2
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(export_dir / "hf" / "source.spm"))
    tr = ctranslate2.Translator(str(export_dir / name), device="cpu", inter_threads=1, intra_threads=threads)
    return (lambda src: ct2_translate(tr, sp, src, 4, 0.6)), None


def worker(args: argparse.Namespace) -> None:
    """One measurement of one system in this process; prints one JSON line."""
    src = Path(args.src).read_text(encoding="utf-8").splitlines()
    run, translator = load_system(args.worker, args.checkpoint, args.export_dir, args.threads)
    run(src[:50])  # warm-up: kernels, caches, allocator
    out: dict = {}
    if args.mode == "throughput":
        start = time.perf_counter()
        text, n_tok = run(src)
        out = {"seconds": time.perf_counter() - start, "text": text, "tokens": n_tok}
        if translator is not None and args.unbatched:
            # The unbatched reference: the same search, one sentence per batch, no padding, no drops.
            alone = [run([s])[0][0] for s in src[:args.unbatched]]
            out["identical_to_unbatched"] = sum(a == b for a, b in zip(alone, text))
    else:
        times = []
        for s in src[:args.latency]:
            start = time.perf_counter()
            run([s])
            times.append(1000 * (time.perf_counter() - start))
        times.sort()
        out = {"p50_ms": statistics.median(times), "p95_ms": times[min(len(times) - 1, int(0.95 * len(times)))]}
    if translator is not None:
        out["compile_s"] = round(translator.compile_seconds, 1)
        out["precision"] = translator.precision  # what ran: int8 asked for without VNNI runs fp32
        out["switches"] = switches(translator)
    print("RESULT " + json.dumps(out))


def measure(name: str, mode: str, threads: int, args: argparse.Namespace, export_dir: Path, unbatched: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, "--mode", mode, "--threads", str(threads),
           "--checkpoint", str(args.checkpoint), "--src", str(args.src), "--export-dir", str(export_dir),
           "--latency", str(args.latency), "--unbatched", str(unbatched)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
    if res.returncode or line is None:
        raise SystemExit(f"{name} {mode} failed:\n{res.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    p.add_argument("--src", type=Path, default=DATA / "test_2016_flickr.en.txt")
    p.add_argument("--ref", type=Path, default=DATA / "test_2016_flickr.de.txt")
    p.add_argument("--data", type=Path, default=DATA, help="prepared data whose training pairs make the -shortlist")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--unbatched", type=int, default=200,
                   help="compare the first N batched translations with one-sentence-at-a-time decoding")
    p.add_argument("--latency", type=int, default=200, help="sentences for the single-sentence latency (0: skip)")
    p.add_argument("--systems", default=",".join(meaningful(list(SYSTEMS))),
                   help=f"comma-separated, from {', '.join(SYSTEMS)} (default: those native on this CPU)")
    p.add_argument("--out", default="bench/decode/2026-11-21_decode_speed.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="throughput", help=argparse.SUPPRESS)
    p.add_argument("--export-dir", type=Path, help=argparse.SUPPRESS)
    return p.parse_args()


def exports(args: argparse.Namespace, systems: list[str]) -> Path:
    """The checkpoint exported for the peers (HF, CTranslate2) and the shortlist, in a new folder;
    a CTranslate2 system whose library is absent leaves `systems`."""
    export_dir = Path(tempfile.mkdtemp())
    export_hf(Path(args.checkpoint), export_dir / "hf")
    if any(s.endswith("-shortlist") for s in systems):
        build(prepared_data(args.data)).save(export_dir / "shortlist.safetensors")
    for quant in ("float32", "int8"):
        if f"ct2-{quant}" in systems:
            try:
                export_ct2(Path(args.checkpoint), export_dir / f"ct2-{quant}", quant)
            except ImportError:
                print("ctranslate2 not installed: skipping CTranslate2")
                systems.remove(f"ct2-{quant}")
    return export_dir


def throughput(args: argparse.Namespace, systems: list[str], src: list[str], ref: list[str],
               export_dir: Path) -> tuple[list[dict], dict]:
    """Alternating repetitions of every system (a process each); the median's rows, and each system's
    first measurement (its translations, tokens, and the unbatched check)."""
    times: dict[str, list[float]] = {k: [] for k in systems}
    outputs: dict[str, dict] = {}
    for rep in range(args.reps):
        for name in systems:
            r = measure(name, "throughput", args.threads, args, export_dir,
                        args.unbatched if rep == 0 and name.startswith("aiayn") else 0)
            outputs.setdefault(name, r)
            times[name].append(r["seconds"])
            print(f"  rep {rep + 1} {name:<18}{len(src) / r['seconds']:>8.1f} sent/s", flush=True)
    hf = "hf-generate-fp32" in systems
    ref_speed = len(src) / statistics.median(times["hf-generate-fp32"]) if hf else float("nan")
    rows = []
    for name in systems:
        sec = statistics.median(times[name])
        rows.append({"system": name, "sent_per_s": len(src) / sec, "tgt_tok_per_s": outputs[name]["tokens"] / sec,
                     "vs_hf": len(src) / sec / ref_speed, "per_rep_sent_per_s": [len(src) / t for t in times[name]],
                     "bleu": sacrebleu.corpus_bleu(outputs[name]["text"], [ref]).score,
                     "compile_s": outputs[name].get("compile_s", 0.0), "ran": outputs[name].get("precision"),
                     "switches": outputs[name].get("switches", {})})
    return rows, outputs


def print_rows(rows: list[dict], outputs: dict, args: argparse.Namespace, n: int) -> int | None:
    """The table; how many aiayn fp32 translations equal HF's (returned; None without both)."""
    for name, o in outputs.items():
        if "identical_to_unbatched" in o:
            k = o["identical_to_unbatched"]
            print(f"{name}: batched = unbatched for {k} of {min(args.unbatched, n)} sentences")
    print(f"\n{'system':<18}{'sent/s':>8}{'tok/s':>8}{'x HF':>7}{'BLEU':>7}")
    for r in rows:
        print(f"{r['system']:<18}{r['sent_per_s']:>8.1f}{r['tgt_tok_per_s']:>8.0f}{r['vs_hf']:>7.2f}{r['bleu']:>7.2f}")
    for r in rows:
        if r["compile_s"]:
            print(f"{r['system']}: compiled in {r['compile_s']:.1f} s before its first measurement")
    if not {"aiayn-fp32", "hf-generate-fp32"} <= outputs.keys():
        return None
    same = sum(a == b for a, b in zip(outputs["aiayn-fp32"]["text"], outputs["hf-generate-fp32"]["text"]))
    print(f"aiayn fp32 and HF give the same translation for {same} of {n} sentences")
    return same


def latencies(args: argparse.Namespace, systems: list[str], n: int, export_dir: Path) -> list[dict]:
    """Single-sentence latency (p50, p95) of every system but HF's, on 1 and 2 threads."""
    latency = []
    for threads in (1, 2):
        for name in (s for s in systems if s != "hf-generate-fp32"):
            r = measure(name, "latency", threads, args, export_dir)
            latency.append({"system": name, "threads": threads, **r})
    print(f"\nsingle-sentence latency over {min(args.latency, n)} sentences, beam 4 (ms):")
    print(f"{'system':<18}{'threads':>8}{'p50':>8}{'p95':>8}")
    for r in latency:
        print(f"{r['system']:<18}{r['threads']:>8}{r['p50_ms']:>8.1f}{r['p95_ms']:>8.1f}")
    return latency


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker(args)
    if args.src.parent == DATA:
        prepared_data(DATA)
    print(f"CPU: {cpu_meta()['label']}", flush=True)
    args.checkpoint = trained_checkpoint(args.checkpoint)
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    src = Path(args.src).read_text(encoding="utf-8").splitlines()
    ref = Path(args.ref).read_text(encoding="utf-8").splitlines()
    export_dir = exports(args, systems)
    rows, outputs = throughput(args, systems, src, ref, export_dir)
    same = print_rows(rows, outputs, args, len(src))
    latency = latencies(args, systems, len(src), export_dir) if args.latency else []
    alone = {n: o["identical_to_unbatched"] for n, o in outputs.items() if "identical_to_unbatched" in o}
    meta = {"torch": torch.__version__, "threads": args.threads, "machine": platform.processor() or platform.machine(),
            "cpu": cpu_meta(),
            "sentences": len(src), "reps": args.reps, "date": time.strftime("%Y-%m-%d"), "identical_to_hf": same,
            "unbatched_checked": args.unbatched, "identical_to_unbatched": alone, "process_per_measurement": True}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "latency": latency}, indent=1))


if __name__ == "__main__":
    main()
