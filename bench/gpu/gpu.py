#!/usr/bin/env python
"""The paper's recipe on one GPU, measured in one run beside its peers.

Writes bench/gpu_<device>.json section by section (what finished survives a timeout) and prints a table:
- training: target tokens/s, peak memory and MFU (evidence/mfu.py's formula: every product forward and
  backward, QKᵀ and AV included) of `base` and `big` on ~25k-token updates, eager and compiled, and
  Hugging Face's MarianMTModel (bf16 autocast, SDPA, fused Adam) on the same batches; the projected
  time of the paper's budgets (§5.2: base 100k updates, big 300k, of ~25k target tokens) on this GPU;
- learning: `aiayn train` (the CLI) on Multi30k with the `multi30k` preset in bf16 and in fp16 (dynamic
  loss scaling), 2 seeds each, and a base-sized model for decoding, all at once on the one GPU; their
  validation NLL and BLEU, and test BLEU (beam 4) of each `multi30k` run;
- decoding: beam 4 (α 0.6) of test2016 by the base-sized model, aiayn bf16 (its GPU's 16k-token
  batches and the CPU's 4k, eager and compiled) against CTranslate2 on the GPU (float16 at 4k and 16k
  tokens, int8_float16), the same weights; sentences/s and BLEU; a profile of beam search;
- resume: `torchrun --nproc_per_node 1` (NCCL), SIGKILL after a checkpoint, resume, final weights
  compared with an uninterrupted run;
- profile: where a base update's GPU time goes (eager and compiled), for the next lever.
The sections live beside this file (gpu_training.py, gpu_learning.py, gpu_decoding.py); this one runs
them in order under one budget. Runs from a working tree with no install: PYTHONPATH is this checkout.
Peers that are not installed are skipped with the reason printed. `--device cpu --tiny` is the CPU dry run that CI runs.

  python bench/gpu/gpu.py --data DIR                       # on a GPU: bench/gpu_<device>.json
  python bench/gpu/gpu.py --device cpu --tiny --data DIR --out /tmp/gpu_cpu.json
On a GPU machine without a registry: bench/gpu/gpu_carry.sh here, bench/gpu/gpu_run.sh there.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1]):  # siblings, benchdata
    if str(_folder) not in sys.path:  # also when loaded from elsewhere
        sys.path.append(str(_folder))
from gpu_decoding import decode_bench  # noqa: E402
from gpu_learning import (  # noqa: E402
    compare_precisions,
    decoding_model,
    finish,
    last_checkpoint,
    learning_runs,
    run_summary,
    start,
    test_bleu,
    torchrun_resume,
)
from gpu_training import (  # noqa: E402
    PAPER_TOKENS,
    ROOT,
    TINY,
    peak_flops,
    profile,
    projection,
    synthetic_batches,
    timed_rows,
    warm_all,
)


class Record:
    """The JSON written after every section, so that a run cut short keeps what it finished."""

    def __init__(self, path: Path, deadline: float):
        self.path, self.deadline, self.data = path, deadline, {}

    def left(self) -> float:
        return self.deadline - time.time()

    def section(self, name: str, fn, *args, need_s: float = 0.0):
        began = time.time()
        if self.left() < need_s:
            self.data[name] = {"skipped": f"{self.left():.0f} s left of the budget, {need_s:.0f} s needed"}
        else:
            try:
                self.data[name] = fn(*args)
            except Exception as e:  # one section's failure must not cost the others, nor what it saved
                traceback.print_exc()
                saved = self.data.get(name) if isinstance(self.data.get(name), dict) else {}
                self.data[name] = {**saved, "error": f"{type(e).__name__}: {e}"[:2000]}
        if isinstance(self.data[name], dict):
            self.data[name]["section_s"] = round(time.time() - began, 1)
        self.write()
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {json.dumps(self.data[name])[:600]}", flush=True)
        return self.data[name]

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)


def env_info(device: torch.device) -> dict:
    out = {"torch": torch.__version__, "device": str(device), "python": sys.version.split()[0]}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out.update(name=p.name, capability=f"{p.major}.{p.minor}", memory_gb=round(p.total_memory / 2**30, 1),
                   sms=p.multi_processor_count, cuda=torch.version.cuda, bf16=torch.cuda.is_bf16_supported(False),
                   peak_bf16_flops=peak_flops(p.name))
    for name in ("transformers", "ctranslate2"):
        try:
            out[name] = __import__(name).__version__
        except ImportError as e:
            out[name] = f"absent ({e})"
    return out


def read_lines(path: Path, n: int) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[:n]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a prepared Multi30k en-de folder (aiayn prepare)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny models and runs: the CPU dry run")
    ap.add_argument("--out", type=Path, help="default bench/gpu_<device name>.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/aiayn-gpu-bench"))
    ap.add_argument("--budget-s", type=float, default=480.0, help="sections that no longer fit are skipped")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--m30k-steps", type=int, default=2750)
    ap.add_argument("--m30k-minutes", type=float, default=4.5)
    ap.add_argument("--decode-rounds", type=int, default=2)
    ap.add_argument("--length", type=int, help="padded length of the timed training batches (default 32; --tiny: 16): "
                    "the rows at other lengths, e.g. --training-only --length 128")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--decode-only", action="store_true", help="train the base-sized model and decode; nothing else")
    only.add_argument("--training-only", action="store_true", help="the timed training rows alone")
    ap.add_argument("--test", default="test_2016_flickr", help="test split: DATA/NAME.{en,de}.txt")
    ap.add_argument("--models", help="the timed training rows' models, comma-separated (default base,big; --tiny: "
                    "base): --training-only --models base times a lever in half a call's time")
    args = ap.parse_args()
    args.models = (("base" if args.tiny else "base,big") if args.models is None else args.models).split(",")
    if not args.models or not set(args.models) <= {"base", "big"} or len(set(args.models)) < len(args.models):
        ap.error(f"--models must name base, big or both once each, comma-separated; got {','.join(args.models)!r}")
    if args.length is not None and not 2 <= args.length <= 512:
        ap.error(f"--length must be in [2, 512] (padded subwords of a timed batch), got {args.length}")
    if not (args.data / "manifest.json").is_file():
        ap.error(f"--data {args.data}: not a prepared folder (no manifest.json; make one with aiayn prepare, "
                 "or bench/gpu/gpu_carry.sh)")
    return args


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    precision = "bf16" if device.type == "cpu" or torch.cuda.is_bf16_supported(False) else "fp16"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = args.out or ROOT / "bench" / "gpu" / f"gpu_{name.replace('NVIDIA ', '').split()[0].lower()}.json"
    rec = Record(out, time.time() + args.budget_s)
    rec.data["command"] = " ".join(sys.argv)
    rec.section("env", env_info, device)
    args.work.mkdir(parents=True, exist_ok=True)
    vocab = TINY["model.vocab_size"] if args.tiny else 37000
    length = args.length or (16 if args.tiny else 32)
    args.batches = synthetic_batches(vocab, 512 if args.tiny else PAPER_TOKENS, length, 4, 1, device)
    if args.training_only:
        return training_only(rec, args, device, precision)
    learn_and_decode(rec, args, device, precision)
    print_table(rec.data)


def learn_and_decode(rec: Record, args, device: torch.device, precision: str) -> None:
    """The learning runs start first (the GPU's idle time), the torchrun resume beside them, the
    training rows warm up meanwhile; then the learning's results, the timed training rows, decoding
    and test BLEU (--decode-only: the base-sized run and decoding alone)."""
    procs = {k: start(v, args.work / f"{k}.log") for k, v in learning_runs(args).items()}
    resume: dict = {}
    resume_thread = threading.Thread(target=lambda: resume.update(rec_safe(torchrun_resume, args)))
    if not args.decode_only:
        resume_thread.start()
        rec.section("training_warmup", lambda: warm_all(args, device, precision))
    returncodes = finish(procs, rec.deadline - 150)  # leave the timed rounds and decoding their time
    rec.section("learning", lambda: {k: run_summary(args.work / k, rc) for k, rc in returncodes.items()})
    if not args.decode_only:
        resume_thread.join(timeout=max(1.0, rec.deadline - 150 - time.time()))
        rec.section("fp16_vs_bf16", lambda: compare_precisions(rec.data["learning"]))
        rec.section("torchrun_resume", lambda: resume or {"error": "did not finish in the budget"})
        timed_training(rec, args, device)  # the targets first: a slow decoding must not cost them
    src = read_lines(args.data / f"{args.test}.en.txt", 40 if args.tiny else 100000)
    ref = read_lines(args.data / f"{args.test}.de.txt", len(src))
    run, why = decoding_model(rec.data["learning"])

    def save(partial: dict) -> None:
        rec.data["decoding"] = {"model_choice": why, **partial, "partial": True}
        rec.write()
    rec.section("decoding", lambda: {"model_choice": why, **decode_bench(
        args, last_checkpoint(args.work / run), src, ref, rec.deadline - 30, save)}, need_s=20)
    if not args.decode_only:
        rec.section("test_bleu", lambda: test_bleu(args, src, ref, rec.deadline), need_s=20)


def training_only(rec, args, device: torch.device, precision: str) -> None:
    """The training rows alone (a short GPU session): warm-up, timed rounds, projection, profile."""
    rec.section("training_warmup", lambda: warm_all(args, device, precision))
    timed_training(rec, args, device)
    print_table(rec.data)


def timed_training(rec, args, device: torch.device) -> None:
    """The warmed runners' timed rounds, the paper budgets at their rate, and a profile."""
    rec.section("training", lambda: timed_rows(args, device), need_s=20)
    rec.section("paper_budget_projection", lambda: projection(rec.data["training"]))
    rec.section("profile", lambda: profile(args, device), need_s=30)


def rec_safe(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as e:
        traceback.print_exc()
        return {"error": f"{type(e).__name__}: {e}"[:2000]}


def print_table(data: dict) -> None:
    print("\n| model | variant | target tok/s | MFU | peak GB | warm-up s |\n|---|---|--:|--:|--:|--:|")
    for name in ("base", "big"):
        for label, r in data.get("training", {}).get(name, {}).items():
            mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") else "—"
            print(f"| {name} | {label} | {r.get('tgt_tok_s', '—')} | {mfu} | {r.get('peak_gb', '—')} | "
                  f"{r.get('warmup_s', '—')} |")
    for name, r in data.get("paper_budget_projection", {}).items():
        if isinstance(r, dict):
            shipped = f"; {r['preset']['hours']} h at {r['preset']['at']}" if "preset" in r else ""
            print(f"paper {name} budget ({r['updates']:,} updates × 25k tokens): {r['hours']} h at {r['at']}{shipped}")
    for name, r in data.get("decoding", {}).items():
        if isinstance(r, dict) and "sent_s" in r:
            print(f"decode {name}: {r['sent_s']} sentences/s, BLEU {r['bleu']}")
    for key in ("profile", "profile_compiled"):
        if isinstance(p := data.get("decoding", {}).get(key), dict):
            print(f"decode {key}: host {p['host_ms']} ms, GPU {p['gpu_ms']} ms, {p['kernel_launches']} kernel launches")
    print("fp16 vs bf16:", json.dumps(data.get("fp16_vs_bf16")))
    print("torchrun resume:", json.dumps(data.get("torchrun_resume")))


if __name__ == "__main__":
    main()
