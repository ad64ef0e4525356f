"""bench/gpu/gpu.py's learning runs: `aiayn train` (the CLI) on Multi30k side by side on the one
GPU (bf16 and fp16, 2 seeds each, and a base-sized model for decoding), their validations and test BLEU;
and a `torchrun` run SIGKILLed after a checkpoint and resumed in a new process, against one run straight."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from gpu_training import ROOT, TINY


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
        t = Translator.load(last_checkpoint(run), device=args.device)
        out[run.name] = round(sacrebleu.corpus_bleu(t.translate(src, beam=4, alpha=0.6), [ref]).score, 2)
    return {"split": args.test, "bleu": out}


def last_checkpoint(run: Path) -> Path:
    from aiayn.checkpoint import list_checkpoints

    found = list_checkpoints(run)
    if not found:
        raise FileNotFoundError(f"{run}: no checkpoint (see {run}.log)")
    return found[-1]


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
