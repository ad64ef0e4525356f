#!/usr/bin/env python
"""Issue #64: the paper's recipe on one GPU, measured in one run beside its peers.

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
Runs from a working tree with no install: PYTHONPATH is this checkout. Peers that are not installed
are skipped with the reason printed. `--device cpu --tiny` is the CPU dry run that CI runs.

  python bench/gpu.py --data DIR                       # on a GPU: bench/gpu_<device>.json
  python bench/gpu.py --device cpu --tiny --data DIR --out /tmp/gpu_cpu.json
On a GPU machine without a registry: bench/gpu_carry.sh here, bench/gpu_run.sh there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from aiayn.config import Config, preset  # noqa: E402
from aiayn.data.batches import Batch  # noqa: E402
from aiayn.evidence.mfu import model_flops, peak_flops, step_flops  # noqa: E402
from aiayn.models.attention import MultiHeadAttention  # noqa: E402
from aiayn.models.build import build_model  # noqa: E402
from aiayn.training import loss as loss_module  # noqa: E402
from aiayn.training.optim import make_optimizer  # noqa: E402
from aiayn.training.scaling import LossScaler  # noqa: E402
from aiayn.training.step import train_step  # noqa: E402

PAPER_UPDATES = {"base": 100_000, "big": 300_000}  # §5.2
PAPER_TOKENS = 25_000  # §5.1: ~25k target tokens per update
TINY = {"model.d_model": 32, "model.d_ff": 64, "model.h": 4, "model.N": 2, "model.vocab_size": 96}


# -- the record --------------------------------------------------------------------------------
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- training throughput -----------------------------------------------------------------------
def synthetic_batches(vocab: int, tokens: int, length: int, n: int, seed: int, device: torch.device) -> list:
    """n batches of one shape (B, length): lengths uniform in [3/4 length, length] (mean ≈ 7/8 of it;
    WMT's subword sentences average ~28), B chosen so the real target tokens are ≈ `tokens`.
    One shape: a compiled model compiles once (the bucketed batches of issue #64, one bucket)."""
    g = torch.Generator().manual_seed(seed)
    B = max(1, round(tokens / (length * 7 / 8)))
    out = []
    for _ in range(n):
        sl = torch.randint(length * 3 // 4, length + 1, (B,), generator=g)
        tl = torch.randint(length * 3 // 4, length + 1, (B,), generator=g)
        pos = torch.arange(length)
        src = torch.where(pos < sl[:, None], torch.randint(4, vocab, (B, length), generator=g), 0)
        tgt_out = torch.where(pos < tl[:, None], torch.randint(4, vocab, (B, length), generator=g), 0)
        tgt_in = torch.cat([torch.full((B, 1), 1), tgt_out[:, :-1]], 1)  # BOS, then the target
        batch = Batch(src.to(device), tgt_in.to(device), tgt_out.to(device), int(tl.sum()))
        out.append((batch, list(zip(sl.tolist(), tl.tolist()))))
    return out


def aiayn_runner(name: str, cfg: Config, device: torch.device, compiled: bool, precision: str,
                 fused_loss: bool = True, sdpa: bool | None = None):
    """One training step of aiayn's own path (train_step: loss, fused Adam on a GPU, scaler);
    fused_loss False: the loss in 8,192-row chunks on a GPU, as before its fused kernels; sdpa False:
    attention as two batched products and a softmax (Eq. 1 written out) instead of SDPA's kernels."""
    torch.manual_seed(1)
    cfg.train.precision = precision
    model = build_model(cfg.model).to(device)
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.use_sdpa = sdpa
    opt = make_optimizer(model, cfg.train)
    scaler = LossScaler(device, precision)
    fwd = torch.compile(model, dynamic=False) if compiled else model

    def step(b: Batch) -> None:
        loss_module.GPU_FUSED = fused_loss
        try:
            train_step(fwd, opt, [(b, 1.0)], b.n_tokens, cfg, 1e-4, 1, device, scaler)
        finally:
            loss_module.GPU_FUSED = True
    return step


def hf_runner(cfg: Config, device: torch.device, precision: str):
    """The peer: MarianMTModel of the same size (post-norm, sinusoidal positions, tied embeddings),
    SDPA attention, bf16 autocast, label-smoothed cross-entropy, fused Adam on a GPU."""
    from transformers import MarianConfig, MarianMTModel

    m = cfg.model
    hf_cfg = MarianConfig(vocab_size=m.vocab_size, d_model=m.d_model, encoder_layers=m.N, decoder_layers=m.n_dec,
                          encoder_attention_heads=m.h, decoder_attention_heads=m.h, encoder_ffn_dim=m.d_ff,
                          decoder_ffn_dim=m.d_ff, activation_function="relu", dropout=m.p_drop,
                          attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=512,
                          scale_embedding=True, pad_token_id=0, eos_token_id=2, decoder_start_token_id=1,
                          share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    torch.manual_seed(1)
    model = MarianMTModel._from_config(hf_cfg, attn_implementation="sdpa").to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=device.type == "cuda")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    def step(b: Batch) -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=precision == "bf16"):
            logits = model(input_ids=b.src, attention_mask=b.src != 0, decoder_input_ids=b.tgt_in).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), b.tgt_out.view(-1), ignore_index=0,
                                   label_smoothing=cfg.train.label_smoothing, reduction="sum") / b.n_tokens
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def model_cfg(name: str, tiny: bool, fp32_logits: bool) -> Config:
    cfg = preset(name)
    cfg.model.vocab_size = 37000  # §5.1: the shared BPE vocabulary of WMT 2014 English-German
    cfg.model.fp32_logits = fp32_logits
    for key, value in (TINY if tiny else {}).items():
        setattr(cfg.model, key.split(".")[1], value)
    return cfg


def build_runners(args, device: torch.device, precision: str) -> dict:
    """Every training variant of `base` and `big`, each warmed up (compiled ones compile here): its
    step, config, warm-up seconds and the peak memory of its steps beyond what was allocated before."""
    runners = {}
    for name in ("base",) if args.tiny else ("base", "big"):  # tiny: the same code once
        variants = {"aiayn eager (fp32 logits, the preset)": ("aiayn", False, True),
                    "aiayn eager": ("aiayn", False, False), "aiayn compiled": ("aiayn", True, False),
                    "aiayn compiled, chunked loss": ("chunked", True, False),
                    "aiayn compiled, explicit attention": ("explicit", True, False),
                    "HF Marian eager": ("hf", False, False)}
        for label, (who, compiled, fp32_logits) in variants.items():
            if who in ("chunked", "explicit") and device.type != "cuda":
                continue  # the CPU has the chunks only, and explicit attention in bf16 already
            if compiled and args.skip_compile:
                continue
            cfg = model_cfg(name, args.tiny, fp32_logits)
            try:
                step = (hf_runner(cfg, device, precision) if who == "hf"
                        else aiayn_runner(name, cfg, device, compiled, precision, fused_loss=who != "chunked",
                                     sdpa=False if who == "explicit" else None))
            except ImportError as e:
                runners[(name, label)] = {"skipped": f"{e}"}
                print(f"{name} {label}: skipped ({e})", flush=True)
                continue
            try:
                runners[(name, label)] = {"step": step, "cfg": cfg, **warm(step, args.batches, device)}
            except Exception as e:  # this variant's row says why; the others go on
                traceback.print_exc()
                runners[(name, label)] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return runners


def warm(step, batches: list, device: torch.device, n: int = 3) -> dict:
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    for b, _ in batches[:n]:
        step(b)
    sync(device)
    peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else 0
    return {"warmup_s": round(time.perf_counter() - began, 2), "peak_gb": round(peak / 2**30, 2)}


def time_runners(runners: dict, batches: list, device: torch.device, rounds: int, steps: dict) -> dict:
    """Interleaved rounds (drift in the GPU's clocks hits every variant alike); the median round."""
    seconds: dict = {key: [] for key, r in runners.items() if "step" in r}
    for _ in range(rounds):
        for key in [k for k in seconds if "step" in runners[k]]:
            sync(device)
            began = time.perf_counter()
            try:
                for i in range(steps[key[0]]):
                    runners[key]["step"](batches[i % len(batches)][0])
                sync(device)
            except Exception as e:  # out of memory, say: this variant's row says so, the others go on
                traceback.print_exc()
                runners[key] = {"error": f"{type(e).__name__}: {e}"[:500]}
                seconds.pop(key)
                continue
            seconds[key].append(time.perf_counter() - began)
    return seconds


def training_table(runners: dict, seconds: dict, batches: list, steps: dict, peak: float | None) -> dict:
    out: dict = {}
    for (name, label), r in runners.items():
        row = out.setdefault(name, {})
        if (name, label) not in seconds:
            row[label] = {k: v for k, v in r.items() if k in ("skipped", "error")}
            continue
        n, s = steps[name], statistics.median(seconds[(name, label)])
        used = [batches[i % len(batches)] for i in range(n)]
        tokens = sum(b.n_tokens for b, _ in used)
        flops = sum(model_flops(r["cfg"].model, pairs) for _, pairs in used)
        padded = sum(step_flops(r["cfg"].model, b.src.size(0), b.src.size(1), b.tgt_in.size(1)) for b, _ in used)
        row[label] = {"tgt_tok_s": round(tokens / s), "s_per_update": round(s / n, 4),
                      "model_tflops_s": round(flops / s / 1e12, 1), "padded_tflops_s": round(padded / s / 1e12, 1),
                      "mfu": round(flops / s / peak, 4) if peak else None, "peak_gb": r["peak_gb"],
                      "warmup_s": r["warmup_s"], "rounds_s": [round(x, 3) for x in seconds[(name, label)]],
                      "tgt_tokens_per_update": round(tokens / n)}
    return out


def projection(table: dict) -> dict:
    """§5.2's budgets at the fastest aiayn rate measured: updates × 25k target tokens / (tokens/s)."""
    out = {}
    for name, updates in PAPER_UPDATES.items():
        rates = {k: v["tgt_tok_s"] for k, v in table.get(name, {}).items()
                 if k.startswith("aiayn") and "tgt_tok_s" in v}
        if rates:
            best = max(rates, key=rates.get)
            out[name] = {"updates": updates, "tgt_tokens": updates * PAPER_TOKENS, "at": best,
                         "hours": round(updates * PAPER_TOKENS / rates[best] / 3600, 2)}
    return out


# -- learning: aiayn train on Multi30k, several runs at once on the one GPU --------------------
def train_cmd(args, run: Path, preset_name: str, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "aiayn", "train", "--data", str(args.data), "--run-dir", str(run),
           "--preset", preset_name, "--device", args.device, *extra]
    if args.tiny:
        cmd += [x for k, v in TINY.items() if k != "model.vocab_size" for x in (f"--{k}", str(v))]
        cmd += ["--data.max_tokens", "400", "--train.warmup_steps", "20", "--train.threads", "1",
                "--train.valid_bleu_sentences", "0"]
    else:
        cmd += ["--train.threads", "2"]  # several runs share the machine's CPU; the GPU does the work
    return cmd


def learning_runs(args) -> dict[str, list[str]]:
    """bf16 and fp16 (loss scaling) with the `multi30k` preset, 2 seeds each; and a base-sized model
    trained the same way for decoding. train.max_minutes bounds each (the report says where it cut)."""
    steps = "20" if args.tiny else str(args.m30k_steps)
    minutes = str(args.m30k_minutes)
    common = ("--train.max_steps", steps, "--train.max_minutes", minutes, "--train.save_every_minutes", "0")
    runs = {f"multi30k-{p}-s{s}": train_cmd(args, args.work / f"multi30k-{p}-s{s}", "multi30k", *common,
                                            "--train.precision", p, "--train.seed", str(s))
            for p in ("bf16", "fp16") for s in (1, 2)}
    # base's size (§3: d_model 512, d_ff 2048, h 8, N 6) with the multi30k preset's training, at a
    # quarter of its rate scale and clipped at 1: a peak of 3.9e-4 (the H200 runs diverged at 0.8 and
    # at 0.5, peak 7.8e-4: validation NLL 5.1 at 500 updates, 9.1 at 2,750; 4k-token batches are noisier
    # than the paper's 25k). If it still does not learn, decoding_model takes the multi30k run instead.
    base = ("--model.d_model", "512", "--model.d_ff", "2048", "--model.h", "8", "--model.N", "6",
            "--train.lr_scale", "0.25", "--train.clip_norm", "1.0")
    runs["base-multi30k"] = train_cmd(args, args.work / "base-multi30k", "multi30k", *common, *base,
                                      "--train.precision", "bf16", "--train.seed", "1")
    return runs if not args.decode_only else {"base-multi30k": runs["base-multi30k"]}


def child_env() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(procs: dict[str, subprocess.Popen], deadline: float) -> dict:
    out = {}
    for name, p in procs.items():
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        out[name] = p.returncode
    return out


def run_summary(run: Path, returncode: int | None) -> dict:
    """The run's validations (step, NLL, BLEU), its wall time and its tokens/s."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()] if (
        run / "metrics.jsonl").exists() else []
    valid = [{k: r[k] for k in ("step", "valid_nll", "valid_bleu") if k in r} for r in rows if "valid_nll" in r]
    train = [r for r in rows if "tgt_tok_s" in r]
    return {"returncode": returncode, "validations": valid, "last_step": train[-1]["step"] if train else 0,
            "elapsed_s": round(train[-1]["elapsed_s"], 1) if train else None,
            "tgt_tok_s": round(statistics.median(r["tgt_tok_s"] for r in train)) if train else None}


def compare_precisions(runs: dict) -> dict:
    """fp16 against bf16 at the last validation step every run reached: per-seed NLL, the means,
    their difference and the largest gap between two seeds of one precision (the seed noise)."""
    by = {p: [runs[f"multi30k-{p}-s{s}"] for s in (1, 2)] for p in ("bf16", "fp16")}
    common = set.intersection(*(set(v["step"] for v in r["validations"]) for rs in by.values() for r in rs))
    if not common:
        return {"error": "no validation step that every run reached"}
    step = max(common)
    nll = {p: [next(v["valid_nll"] for v in r["validations"] if v["step"] == step) for r in rs]
           for p, rs in by.items()}
    mean = {p: statistics.mean(v) for p, v in nll.items()}
    noise = max(max(v) - min(v) for v in nll.values())
    diff = mean["fp16"] - mean["bf16"]
    return {"step": step, "valid_nll": nll, "mean": mean, "fp16_minus_bf16": diff, "seed_gap": noise,
            "within_seed_noise": abs(diff) <= noise}


# -- resume under torchrun ---------------------------------------------------------------------
def torchrun_resume(args) -> dict:
    """torchrun --nproc_per_node 1 (NCCL on a GPU): an uninterrupted run, and one SIGKILLed once a
    checkpoint is on disk and resumed in a new process; their final weights compared."""
    from aiayn.checkpoint import list_checkpoints, read_weights

    steps, every = (12, 4) if args.tiny else (60, 20)
    extra = ("--train.max_steps", str(steps), "--train.save_every", str(every), "--train.save_every_minutes", "0",
             "--train.valid_every", "0", "--train.valid_bleu_sentences", "0", "--train.log_every", "5")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]

    def cmd(run: Path, *more: str) -> list[str]:
        return launcher + train_cmd(args, run, "multi30k", *extra, *more)[1:]  # [python] -m aiayn ...

    straight, broken = args.work / "torchrun-straight", args.work / "torchrun-broken"
    began = time.time()
    first = start(cmd(straight), args.work / "torchrun-straight.log")  # side by side with the one killed
    p = start(cmd(broken), args.work / "torchrun-broken.log")
    target = broken / "checkpoints" / f"step-{2 * every:08d}.state.pt"
    while not target.exists() and p.poll() is None:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    killed_at = len(list_checkpoints(broken))
    if first.wait(timeout=600):
        return {"error": f"the uninterrupted run failed: see {args.work / 'torchrun-straight.log'}"}
    resumed = subprocess.run(launcher + ["-m", "aiayn", "train", "--resume", str(broken), "--device", args.device],
                             cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    if resumed.returncode:
        return {"error": resumed.stderr[-1500:]}
    a, b = (read_weights(list_checkpoints(r)[-1])[0] for r in (straight, broken))
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    same = all(torch.equal(a[k], b[k]) for k in a)
    return {"steps": steps, "killed_after_checkpoints": killed_at, "bit_identical": same, "max_abs_diff": diff,
            "backend": "nccl" if args.device.startswith("cuda") else "gloo",
            "wall_s": round(time.time() - began, 1)}


# -- decoding ----------------------------------------------------------------------------------
def decode_bench(args, checkpoint: Path, src: list[str], ref: list[str], deadline: float = float("inf"),
                 save=lambda partial: None) -> dict:
    """Beam 4, α 0.6, of the test sentences: aiayn (bf16 on a GPU) and CTranslate2 on the same
    device (float16 and int8_float16 on a GPU), the same weights; interleaved rounds, median. The
    clock is read where it is spent: fewer sentences (the first ones) where the warm-up's pace says
    all would not fit the time left, the compiled step and the profile only if time remains, and what
    is measured is saved after every round (a visit cut short keeps it)."""
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


# Compiling the decoding step on an H200 took 36-56 s a graph, 6 graphs and more (sixth visit,
# bench/gpu_h200_visit6_compile_probe.json: compile_now had not returned after 213 s), then timing.
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
    if not cuda:
        return systems
    try:  # the peer at aiayn's GPU batch size too (the row above: CTranslate2's 4,096 of earlier visits)
        systems["CTranslate2 float16, 16k-token batches"] = ct2_system(args, checkpoint, "float16", 16384)
    except Exception as e:
        out["CTranslate2 float16, 16k-token batches"] = {"skipped": f"{type(e).__name__}: {e}"[:500]}
    tb = Translator.load(checkpoint, device=args.device, precision="bf16", max_tokens=4096)
    systems["aiayn bf16, 4k-token batches"] = lambda s: tb.translate(s, beam=4, alpha=0.6)  # the CPU's size
    tg = Translator.load(checkpoint, device=args.device, precision="bf16")
    tg.search_model.graphs = True  # decode/graphed.py: each search step one CUDA graph replay
    systems["aiayn bf16 graphs"] = lambda s: tg.translate(s, beam=4, alpha=0.6)
    if deadline - time.time() < COMPILE_DECODING_S:
        out["aiayn bf16 compiled"] = {"skipped": f"{deadline - time.time():.0f} s left, "
                                                 f"{COMPILE_DECODING_S} s kept for compiling"}
        return systems
    try:  # the fused step through torch.compile (Translator's `compiled`)
        tc = Translator.load(checkpoint, device=args.device, precision="bf16", compiled=True)
        out["aiayn bf16 compiled"] = {"compile_s": round(tc.compile_now(), 1)}
        systems["aiayn bf16 compiled"] = lambda s: tc.translate(s, beam=4, alpha=0.6)
    except Exception as e:
        traceback.print_exc()
        out["aiayn bf16 compiled"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return systems


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
    GPU's (the fifth visit's: 911 ms against 64 ms, launch-bound), the kernel launches, and the table
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


# -- the run -----------------------------------------------------------------------------------
def read_lines(path: Path, n: int) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[:n]


def main() -> None:
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
                    "SDPA against explicit attention at other lengths, e.g. --training-only --length 128")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--decode-only", action="store_true", help="train the base-sized model and decode; nothing else")
    only.add_argument("--training-only", action="store_true", help="the timed training rows alone")
    ap.add_argument("--test", default="test_2016_flickr", help="test split: DATA/NAME.{en,de}.txt")
    args = ap.parse_args()
    if args.length is not None and not 2 <= args.length <= 512:
        ap.error(f"--length must be in [2, 512] (padded subwords of a timed batch), got {args.length}")
    if not (args.data / "manifest.json").is_file():
        ap.error(f"--data {args.data}: not a prepared folder (no manifest.json; make one with aiayn prepare, "
                 "or bench/gpu_carry.sh)")
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    precision = "bf16" if device.type == "cpu" or torch.cuda.is_bf16_supported(False) else "fp16"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = args.out or ROOT / "bench" / f"gpu_{name.replace('NVIDIA ', '').split()[0].lower()}.json"
    rec = Record(out, time.time() + args.budget_s)
    rec.data["command"] = " ".join(sys.argv)
    rec.section("env", env_info, device)
    args.work.mkdir(parents=True, exist_ok=True)
    vocab = TINY["model.vocab_size"] if args.tiny else 37000
    length = args.length or (16 if args.tiny else 32)
    args.batches = synthetic_batches(vocab, 512 if args.tiny else PAPER_TOKENS, length, 4, 1, device)

    if args.training_only:
        return training_only(rec, args, device, precision)
    procs = {k: start(v, args.work / f"{k}.log") for k, v in learning_runs(args).items()}  # the GPU's idle time
    resume: dict = {}
    resume_thread = threading.Thread(target=lambda: resume.update(rec_safe(torchrun_resume, args)))
    if not args.decode_only:
        resume_thread.start()
        rec.section("training_warmup", lambda: _warm_all(args, device, precision))
    returncodes = finish(procs, rec.deadline - 150)  # leave the timed rounds and decoding their time
    rec.section("learning", lambda: {k: run_summary(args.work / k, rc) for k, rc in returncodes.items()})
    if not args.decode_only:
        resume_thread.join(timeout=max(1.0, rec.deadline - 150 - time.time()))
        rec.section("fp16_vs_bf16", lambda: compare_precisions(rec.data["learning"]))
        rec.section("torchrun_resume", lambda: resume or {"error": "did not finish in the budget"})
    if not args.decode_only:  # the targets first: a slow decoding must not cost the training rows
        timed_training(rec, args, device)
    src = read_lines(args.data / f"{args.test}.en.txt", 40 if args.tiny else 100000)
    ref = read_lines(args.data / f"{args.test}.de.txt", len(src))
    run, why = decoding_model(rec.data["learning"])
    def save(partial: dict) -> None:
        rec.data["decoding"] = {"model_choice": why, **partial, "partial": True}
        rec.write()
    rec.section("decoding", lambda: {"model_choice": why, **decode_bench(
        args, _last_checkpoint(args.work / run), src, ref, rec.deadline - 30, save)}, need_s=20)
    if not args.decode_only:
        rec.section("test_bleu", lambda: test_bleu(args, src, ref, rec.deadline), need_s=20)
    print_table(rec.data)


def decoding_model(learning: dict) -> tuple[str, str]:
    """The base-sized run decodes if it learned: its last validation NLL within 1 nat of the `multi30k`
    run's (a model that did not learn writes to the length limit: slow, and unlike any real model);
    otherwise the `multi30k` bf16 run, its weights in both systems all the same, with the reason."""
    def last(name: str) -> float:
        v = learning.get(name, {}).get("validations") or [{}]
        return v[-1].get("valid_nll", float("inf"))

    base, small = last("base-multi30k"), last("multi30k-bf16-s1")
    if base <= small + 1.0 or small == float("inf"):
        return "base-multi30k", f"base-multi30k (valid NLL {base:.3f})"
    return "multi30k-bf16-s1", (f"multi30k-bf16-s1 (valid NLL {small:.3f}): base-multi30k did not learn "
                                f"(valid NLL {base:.3f} at its last validation)")


def training_only(rec, args, device: torch.device, precision: str) -> None:
    """The training rows alone (a short GPU visit): warm-up, timed rounds, projection, profile."""
    rec.section("training_warmup", lambda: _warm_all(args, device, precision))
    timed_training(rec, args, device)
    print_table(rec.data)


def timed_training(rec, args, device: torch.device) -> None:
    """The warmed runners' timed rounds, the paper budgets at their rate, and a profile."""
    rec.section("training", lambda: _timed(args, device), need_s=20)
    rec.section("paper_budget_projection", lambda: projection(rec.data["training"]))
    rec.section("profile", lambda: profile(args, device), need_s=30)


def rec_safe(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as e:
        traceback.print_exc()
        return {"error": f"{type(e).__name__}: {e}"[:2000]}


_RUNNERS: dict = {}


def _warm_all(args, device: torch.device, precision: str) -> dict:
    _RUNNERS.update(build_runners(args, device, precision))
    return {f"{k[0]} / {k[1]}": {x: y for x, y in v.items() if x not in ("step", "cfg")} for k, v in _RUNNERS.items()}


def _timed(args, device: torch.device) -> dict:
    steps = {"base": 2 if args.tiny else 8, "big": 2 if args.tiny else 4}
    seconds = time_runners(_RUNNERS, args.batches, device, 2 if args.tiny else 3, steps)
    peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return {"precision": "bf16 autocast", "rounds": 2 if args.tiny else 3, "updates_per_round": steps,
            "batch": {"sentences": args.batches[0][0].src.size(0), "padded_length": args.batches[0][0].src.size(1)},
            "peak_flops": peak, **training_table(_RUNNERS, seconds, args.batches, steps, peak)}


def test_bleu(args, src: list[str], ref: list[str], deadline: float = float("inf")) -> dict:
    """It learns: each `multi30k` run's last checkpoint translates the test split (beam 4, α 0.6, bf16
    on a GPU), sacreBLEU against the references; the runs that no longer fit the budget are named."""
    import sacrebleu

    from aiayn.decode.translator import Translator

    out: dict = {}
    for run in sorted(p for p in args.work.glob("multi30k-*") if p.is_dir()):
        if time.time() > deadline:
            out[run.name] = "skipped: out of the budget"
            continue
        t = Translator.load(_last_checkpoint(run), device=args.device)
        out[run.name] = round(sacrebleu.corpus_bleu(t.translate(src, beam=4, alpha=0.6), [ref]).score, 2)
    return {"split": args.test, "bleu": out}


def profile(args, device: torch.device) -> dict:
    """Where a base update's time goes (torch.profiler, 2 updates each of eager and compiled): the
    kernels by self time, for the next lever."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    out = {}
    for label in ("aiayn eager", "aiayn compiled"):
        r = _RUNNERS.get(("base", label), {})
        if "step" not in r:
            continue
        with prof(activities=acts) as p:
            for b, _ in args.batches[:2]:
                r["step"](b)
            sync(device)
        out[label] = p.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70)
        print(out[label], flush=True)
    return out


def _last_checkpoint(run: Path) -> Path:
    from aiayn.checkpoint import list_checkpoints

    found = list_checkpoints(run)
    if not found:
        raise FileNotFoundError(f"{run}: no checkpoint (see {run}.log)")
    return found[-1]


def print_table(data: dict) -> None:
    print("\n| model | variant | target tok/s | MFU | peak GB | warm-up s |\n|---|---|--:|--:|--:|--:|")
    for name in ("base", "big"):
        for label, r in data.get("training", {}).get(name, {}).items():
            mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") else "—"
            print(f"| {name} | {label} | {r.get('tgt_tok_s', '—')} | {mfu} | {r.get('peak_gb', '—')} | "
                  f"{r.get('warmup_s', '—')} |")
    for name, r in data.get("paper_budget_projection", {}).items():
        if isinstance(r, dict):
            print(f"paper {name} budget ({r['updates']:,} updates × 25k tokens): {r['hours']} h at {r['at']}")
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
