"""bench/gpu/gpu.py's decoding rows: beam 4 (α 0.6, §6.1) of the test split by aiayn (eager,
CUDA graphs, compiled, two batch sizes) against CTranslate2 on the same device and weights, in
interleaved rounds saved as they end, and a profile of beam search."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
from benchdata import switches
from gpu_training import sync


def decode_bench(args, checkpoint: Path, src: list[str], ref: list[str], deadline: float = float("inf"),
                 save=lambda partial: None) -> dict:
    """Beam 4, α 0.6, of the test sentences: aiayn (bf16 on a GPU) and CTranslate2 on the same
    device (float16 and int8_float16 on a GPU), the same weights; interleaved rounds, median. The
    clock is read where it is spent: fewer sentences (the first ones) where the warm-up's pace says
    all would not fit the time left, the compiled step and the profile only if time remains, and what
    is measured is saved after every round (a run cut short keeps it)."""
    out: dict = {"sentences": 0, "checkpoint": checkpoint.parent.parent.name}
    systems = decode_systems(args, checkpoint, out, deadline)
    began = time.perf_counter()
    for name, run in list(systems.items()):
        try:
            run(src[:64])  # warm-up: kernels, allocator, graphs recorded
        except Exception as e:  # one system failing (a CUDA graph's capture) leaves the others timed
            traceback.print_exc()
            out[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            del systems[name]
    n = fitting(len(src), min(64, len(src)), time.perf_counter() - began, args.decode_rounds, deadline - time.time())
    if n < len(src):
        out["cut"] = (f"{n} of {len(src)} sentences: the warm-up's pace, {args.decode_rounds} rounds, "
                      f"{deadline - time.time():.0f} s left")
        src, ref = src[:n], ref[:n]
    out["sentences"] = len(src)
    timed_decoding(args, systems, src, ref, out, save)
    for key, name in (("profile", next(iter(systems))), ("profile_compiled", "aiayn bf16 compiled")):
        if name not in systems:
            continue
        round_s = min(out[name]["rounds_s"])
        if deadline - time.time() > 3 * round_s * 200 / len(src):
            out[key] = profile_decoding(systems[name], src[:200], torch.device(args.device))
        else:
            out[key] = f"skipped: {deadline - time.time():.0f} s left"
    return out


# Compiling the decoding step on an H200 took 36-56 s a graph, 6 graphs and more (2026-11-28,
# bench/gpu/2026-11-28_h200_compile_probe.json: compile_now had not returned after 213 s), then timing.
COMPILE_DECODING_S = 360


def decode_systems(args, checkpoint: Path, out: dict, deadline: float) -> dict:
    """The systems in the order of the issue's target: aiayn, CTranslate2 float16 (int8_float16), then
    CTranslate2 float16 at aiayn's GPU batch size (16,384 source tokens, device.decode_batch_tokens), aiayn at
    the CPU's 4,096, aiayn's search step as a CUDA graph, and the compiled step (only with COMPILE_DECODING_S
    left)."""
    from aiayn.decode.translator import Translator

    cuda = args.device.startswith("cuda")
    t = Translator.load(checkpoint, device=args.device, precision="bf16" if cuda else "fp32")
    systems = {"aiayn " + t.precision: lambda s: t.translate(s, beam=4, alpha=0.6)}
    for compute in (("float16", "int8_float16") if cuda else ("float32", "int8")):
        try:
            systems[f"CTranslate2 {compute}"] = ct2_system(args, checkpoint, compute)
        except Exception as e:  # absent, or no CUDA libraries it can load: say so, go on
            out[f"CTranslate2 {compute}"] = {"skipped": f"{type(e).__name__}: {e}"[:500]}
    record_switches(out, {"aiayn " + t.precision: t})
    if not cuda:
        return systems
    try:  # the peer at aiayn's GPU batch size too (the row above: CTranslate2's 4,096 of earlier runs)
        systems["CTranslate2 float16, 16k-token batches"] = ct2_system(args, checkpoint, "float16", 16384)
    except Exception as e:
        out["CTranslate2 float16, 16k-token batches"] = {"skipped": f"{type(e).__name__}: {e}"[:500]}
    tb = Translator.load(checkpoint, device=args.device, precision="bf16", max_tokens=4096)
    systems["aiayn bf16, 4k-token batches"] = lambda s: tb.translate(s, beam=4, alpha=0.6)  # the CPU's size
    tg = Translator.load(checkpoint, device=args.device, precision="bf16", step="graphed")  # one graph a step
    systems["aiayn bf16 graphs"] = lambda s: tg.translate(s, beam=4, alpha=0.6)
    record_switches(out, {"aiayn bf16, 4k-token batches": tb, "aiayn bf16 graphs": tg})
    if deadline - time.time() < COMPILE_DECODING_S:
        out["aiayn bf16 compiled"] = {"skipped": f"{deadline - time.time():.0f} s left, "
                                                 f"{COMPILE_DECODING_S} s kept for compiling"}
        return systems
    try:  # the fused step through torch.compile (Translator's `compiled`)
        tc = Translator.load(checkpoint, device=args.device, precision="bf16", compiled=True)
        out["aiayn bf16 compiled"] = {"compile_s": round(tc.compile_now(), 1), "switches": switches(tc)}
        systems["aiayn bf16 compiled"] = lambda s: tc.translate(s, beam=4, alpha=0.6)
    except Exception as e:
        traceback.print_exc()
        out["aiayn bf16 compiled"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return systems


def record_switches(out: dict, translators: dict) -> None:
    """Each aiayn system's decode.step and model.attention beside its figures."""
    for name, t in translators.items():
        out.setdefault(name, {})["switches"] = switches(t)


def timed_decoding(args, systems: dict, src: list[str], ref: list[str], out: dict, save) -> None:
    """Interleaved rounds (A B C A B C …); the medians, BLEU and aiayn's ratio saved after each round."""
    import sacrebleu

    seconds: dict = {k: [] for k in systems}
    first = next(iter(systems))
    for _ in range(args.decode_rounds):
        for name, run in systems.items():
            sync(torch.device(args.device))
            began = time.perf_counter()
            hyp = run(src)
            seconds[name].append(time.perf_counter() - began)
            out[name] = {**out.get(name, {}), "sent_s": round(len(src) / statistics.median(seconds[name]), 1),
                         "rounds_s": [round(x, 3) for x in seconds[name]],
                         "bleu": round(sacrebleu.corpus_bleu(hyp, [ref]).score, 2)}
            if name != first:
                out[name]["aiayn_over_this"] = round(out[first]["sent_s"] / out[name]["sent_s"], 3)
            save(out)


def fitting(total: int, warmed: int, warm_s: float, rounds: int, left_s: float) -> int:
    """How many sentences fit rounds passes in half of left_s at the warm-up's pace (at least the warm-up's)."""
    per_sentence = warm_s / max(1, warmed)
    if per_sentence <= 0 or 0.5 * left_s >= total * per_sentence * rounds:
        return total
    return max(warmed, int(0.5 * left_s / (per_sentence * rounds)))


_CT2_PROBE = """import sys, ctranslate2
t = ctranslate2.Translator(sys.argv[1], device=sys.argv[2], compute_type=sys.argv[3])
print(t.translate_batch([["▁a", "</s>"]], beam_size=4)[0].hypotheses[0])"""

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaGraphLaunch")


def profile_decoding(run, src: list[str], device: torch.device) -> dict:
    """Where beam search's time goes (torch.profiler over 200 sentences): the host's time against the
    GPU's (2026-11-27's: 911 ms against 64 ms, launch-bound), the kernel launches, and the table
    of operators with the host's waits on the GPU (cudaStreamSynchronize, item) beside them."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as p:
        run(src)
        sync(device)
    events = p.key_averages()
    gpu_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events)
    return {"host_ms": round(sum(e.self_cpu_time_total for e in events) / 1e3, 1),
            "gpu_ms": round(gpu_us / 1e3, 1) if device.type == "cuda" else None,
            "kernel_launches": sum(e.count for e in events if e.key in LAUNCHES),
            "table": events.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60)}


def ct2_system(args, checkpoint: Path, compute: str, tokens: int = 4096):
    import ctranslate2
    import sentencepiece as spm

    from aiayn.export import export_ct2

    folder = args.work / f"ct2-{compute}"
    if not folder.exists():
        export_ct2(checkpoint, folder, "int8" if compute.startswith("int8") else compute)
    # a crash in its CUDA libraries ends the probe, not this run
    probe = subprocess.run([sys.executable, "-c", _CT2_PROBE, str(folder), args.device.split(":")[0], compute],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode:
        raise RuntimeError(f"CTranslate2 failed to load or translate on {args.device} (exit {probe.returncode}): "
                           + (probe.stderr.strip().splitlines() or ["no message"])[-1])
    sp = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
    tr = ctranslate2.Translator(str(folder), device="cuda" if args.device.startswith("cuda") else "cpu",
                                compute_type=compute)

    def run(src: list[str]) -> list[str]:
        pieces = [sp.encode(s, out_type=str) + ["</s>"] for s in src]
        res = tr.translate_batch(pieces, beam_size=4, length_penalty=0.6, max_batch_size=tokens, batch_type="tokens",
                                 max_decoding_length=max(map(len, pieces)) + 50)
        return [sp.decode(r.hypotheses[0]) for r in res]
    return run
