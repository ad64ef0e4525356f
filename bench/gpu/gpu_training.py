"""bench/gpu/gpu.py's training rows: aiayn's train_step and Hugging Face's MarianMTModel on the
same synthetic ~25k-token batches, warmed up, timed in interleaved rounds, with MFU (evidence/mfu.py's
formula), the paper's budgets (§5.2) at the fastest rate, and a profile of a base update."""

from __future__ import annotations

import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # benchdata
from benchdata import switches  # noqa: E402

from aiayn.config import Config  # noqa: E402
from aiayn.data.batches import Batch  # noqa: E402
from aiayn.evidence.mfu import model_flops, peak_flops, step_flops  # noqa: E402
from aiayn.models.build import build_model  # noqa: E402
from aiayn.overrides import preset  # noqa: E402
from aiayn.training.optim import make_optimizer  # noqa: E402
from aiayn.training.scaling import LossScaler  # noqa: E402
from aiayn.training.step import train_step  # noqa: E402

PAPER_UPDATES = {"base": 100_000, "big": 300_000}  # §5.2
PAPER_TOKENS = 25_000  # §5.1: ~25k target tokens per update
TINY = {"model.d_model": 32, "model.d_ff": 64, "model.h": 4, "model.N": 2, "model.vocab_size": 96}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_batches(vocab: int, tokens: int, length: int, n: int, seed: int, device: torch.device) -> list:
    """n batches of one shape (B, length): lengths uniform in [3/4 length, length] (mean ≈ 7/8 of it;
    WMT's subword sentences average ~28), B chosen so the real target tokens are ≈ `tokens`.
    One shape: a compiled model compiles once (`train.compile`'s bucketed batches, one bucket)."""
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
                 fused_loss: bool = True):
    """One training step of aiayn's own path (train_step: loss, fused Adam on a GPU, scaler);
    fused_loss False: the loss in 8,192-row chunks on a GPU, as before its fused kernels."""
    torch.manual_seed(1)
    cfg.train.precision, cfg.train.fused_loss = precision, fused_loss
    model = build_model(cfg.model).to(device)
    opt = make_optimizer(model, cfg.train)
    scaler = LossScaler(device, precision)
    fwd = torch.compile(model, dynamic=False) if compiled else model

    def step(b: Batch) -> None:
        train_step(fwd, opt, [(b, 1.0)], b.n_tokens, cfg, 1e-4, 1, device, scaler)
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
    for name in args.models:  # tiny: base alone, the same code once
        variants = {"aiayn eager (fp32 logits, the preset)": ("aiayn", False, True),
                    "aiayn eager": ("aiayn", False, False),
                    "aiayn compiled (fp32 logits, the preset)": ("aiayn", True, True),
                    "aiayn compiled": ("aiayn", True, False),
                    "aiayn compiled, chunked loss": ("chunked", True, False),
                    "HF Marian eager": ("hf", False, False)}
        for label, (who, compiled, fp32_logits) in variants.items():
            if who == "chunked" and device.type != "cuda":
                continue  # the CPU has the chunks only
            if compiled and args.skip_compile:
                continue
            cfg = model_cfg(name, args.tiny, fp32_logits)
            try:
                step = (hf_runner(cfg, device, precision) if who == "hf"
                        else aiayn_runner(name, cfg, device, compiled, precision, fused_loss=who != "chunked"))
            except ImportError as e:
                runners[(name, label)] = {"skipped": f"{e}"}
                print(f"{name} {label}: skipped ({e})", flush=True)
                continue
            try:
                runners[(name, label)] = {"step": step, "cfg": cfg, **warm(step, args.batches, device),
                                          **({"switches": switches(cfg=cfg)} if who != "hf" else {})}
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
    """§5.2's budgets at the fastest aiayn rate measured, and at the fastest of the preset as shipped
    (fp32 logits): updates × 25k target tokens / (tokens/s)."""
    out = {}
    for name, updates in PAPER_UPDATES.items():
        rates = {k: v["tgt_tok_s"] for k, v in table.get(name, {}).items()
                 if k.startswith("aiayn") and "tgt_tok_s" in v}
        if rates:
            best = max(rates, key=rates.get)
            shipped = max((k for k in rates if "the preset" in k), key=rates.get, default=None)
            out[name] = {"updates": updates, "tgt_tokens": updates * PAPER_TOKENS, "at": best,
                         "hours": round(updates * PAPER_TOKENS / rates[best] / 3600, 2)}
            if shipped:
                out[name]["preset"] = {"at": shipped, "hours": round(updates * PAPER_TOKENS / rates[shipped] / 3600, 2)}
    return out


_RUNNERS: dict = {}  # the warmed runners, shared by the timed rounds and the profile


def warm_all(args, device: torch.device, precision: str) -> dict:
    """Every variant built and warmed up (compiled ones compile here): its warm-up seconds and peak memory."""
    _RUNNERS.update(build_runners(args, device, precision))
    return {f"{k[0]} / {k[1]}": {x: y for x, y in v.items() if x not in ("step", "cfg")} for k, v in _RUNNERS.items()}


def timed_rows(args, device: torch.device) -> dict:
    """The warmed variants' interleaved rounds: the training table, with MFU on a GPU whose peak is known."""
    steps = {"base": 2 if args.tiny else 8, "big": 2 if args.tiny else 4}
    seconds = time_runners(_RUNNERS, args.batches, device, 2 if args.tiny else 3, steps)
    peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return {"precision": "bf16 autocast", "rounds": 2 if args.tiny else 3, "updates_per_round": steps,
            "batch": {"sentences": args.batches[0][0].src.size(0), "padded_length": args.batches[0][0].src.size(1)},
            "peak_flops": peak, **training_table(_RUNNERS, seconds, args.batches, steps, peak)}


def profile(args, device: torch.device) -> dict:
    """Where an update of the first model timed goes (torch.profiler, 2 updates each of eager and
    compiled; base unless --models says otherwise): the kernels by self time, for the next lever."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    out = {}
    for label in ("aiayn eager", "aiayn compiled"):
        r = _RUNNERS.get((args.models[0], label), {})
        if "step" not in r:
            continue
        with prof(activities=acts) as p:
            for b, _ in args.batches[:2]:
                r["step"](b)
            sync(device)
        out[label] = p.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70)
        print(out[label], flush=True)
    return out
