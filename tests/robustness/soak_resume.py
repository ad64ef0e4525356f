"""Soak test of crash safety: SIGKILL a training run again and again, resume it each time, and
compare the end with an uninterrupted run, bit for bit.

A small model trains on the prepared Multi30k EN-DE data with a checkpoint every few updates.
The run is SIGKILLed at `--kills` moments: half at a random time after the process starts
(during start-up, training or a save), half the instant a checkpoint's temporary file appears
(in the middle of a write). After every kill each checkpoint left in the run is loaded (weights
and training state): a checkpoint that does not load counts as corrupt. Then `aiayn train
--resume` continues in a new process. When the last kill is done the run finishes unharmed and
its final weights are compared, tensor by tensor, byte for byte, with an uninterrupted run of
the same configuration, and so is its training log (metrics.jsonl without its clock readings; a log
every 7 updates and a checkpoint every 10, so that resumes land inside a logging window).

    .venv/bin/python tests/robustness/soak_resume.py [--kills 20] [--steps 400] [--data work/multi30k-en-de]
    .venv/bin/python tests/robustness/soak_resume.py --short --data PREPARED_DIR   # 3 kills, 300 steps (the
        tests' form)

Prints kills survived, kills during a write, corrupt checkpoints (must be 0) and both equalities;
writes results/robustness/2026-11-22_soak_resume.json (not with --short). Work files go to ~/aiayn-work/soak (--work).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/: benchdata, the shared data
from benchdata import DATA, prepared_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["--model.d_model", "64", "--model.d_ff", "128", "--model.h", "4", "--model.N", "2", "--model.p_drop", "0.1",
         "--data.max_tokens", "1024", "--train.warmup_steps", "100", "--train.valid_every", "0",
         "--train.valid_bleu_sentences", "0", "--train.save_every_minutes", "0", "--train.log_every", "7",
         "--train.keep_last", "3", "--train.threads", "1", "--train.tokens_per_update", "0"]


def command(data: Path, run: Path, steps: int, save_every: int) -> list[str]:
    if (run / "config.yaml").exists():
        return [sys.executable, "-m", "aiayn", "train", "--resume", str(run)]
    return [sys.executable, "-m", "aiayn", "train", "--data", str(data), "--run-dir", str(run), *MODEL,
            "--train.max_steps", str(steps), "--train.save_every", str(save_every)]


def final_tensors(run: Path, steps: int) -> dict[str, bytes]:
    from aiayn.checkpoint import read_weights

    last = run / "checkpoints" / f"step-{steps:08d}.safetensors"
    return {k: v.numpy().tobytes() for k, v in read_weights(last)[0].items()}


def training_log(run: Path) -> list[dict]:
    """The run's metrics records without their clock readings (the only fields a resume may change)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tgt_tok_s", "elapsed_s")} for r in rows]


def corrupt_checkpoints(run: Path) -> list[str]:
    """Checkpoints of the run whose weights or training state do not load."""
    from aiayn.checkpoint import CheckpointError, load_state, read_weights

    bad = []
    for w in sorted((run / "checkpoints").glob("step-*.safetensors")):
        try:
            read_weights(w)
        except CheckpointError as e:
            bad.append(str(e))
        state = w.with_name(w.name.replace(".safetensors", ".state.pt"))
        if state.exists():
            try:
                load_state(state)
            except CheckpointError as e:
                bad.append(str(e))
    return bad


def kill_once(cmd: list[str], run: Path, during_write: bool, rng: random.Random, window: float) -> str:
    """Start the command, SIGKILL it; returns how the kill landed ('write', 'random' or 'finished')."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = run / "checkpoints"
    deadline = time.time() + (60 if during_write else rng.uniform(0.5, window))
    how = "random"
    while time.time() < deadline:
        if proc.poll() is not None:
            return "finished"
        if during_write and ckpt.is_dir() and any(p.name.endswith(".tmp") for p in ckpt.iterdir()):
            how = "write"
            break
        time.sleep(0.0005 if during_write else 0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return how


def soak(data: Path, work: Path, kills: int, steps: int, save_every: int, seed: int) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    straight, run = work / "straight", work / "killed"
    t0 = time.perf_counter()
    subprocess.run(command(data, straight, steps, save_every), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    straight_s = time.perf_counter() - t0
    rng = random.Random(seed)
    outcomes, corrupt = [], []
    for i in range(kills):
        # Random kills fall within start-up (~3 s) plus twice the remaining work's share per kill
        # left, so that the kills fit in one run on average.
        done = max([int(p.stem.split("-")[1].split(".")[0]) for p in run.glob("checkpoints/step-*.safetensors")],
                   default=0)
        window = 3.0 + 2 * straight_s * (steps - done) / steps / (kills - i)
        how = kill_once(command(data, run, steps, save_every), run, i % 2 == 1, rng, window)
        outcomes.append(how)
        corrupt += corrupt_checkpoints(run)
        print(f"kill {i + 1}/{kills}: {how}; checkpoints {len(list(run.glob('checkpoints/step-*.safetensors')))}, "
              f"corrupt so far {len(corrupt)}", flush=True)
        if how == "finished":
            break
    res = subprocess.run(command(data, run, steps, save_every), capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"the final resume failed:\n{res.stderr[-3000:]}")
    a, b = final_tensors(straight, steps), final_tensors(run, steps)
    identical = a.keys() == b.keys() and all(a[k] == b[k] for k in a)
    log_a, log_b = training_log(straight), training_log(run)
    return {"kills": kills, "kills_survived": sum(o != "finished" for o in outcomes),
            "kills_during_write": outcomes.count("write"), "kills_at_random": outcomes.count("random"),
            "corrupt_checkpoints": len(corrupt), "corrupt": corrupt[:5], "final_weights_identical": identical,
            "training_log_identical": log_a == log_b and len(log_a) > 0, "log_records": len(log_a),
            "steps": steps, "save_every": save_every, "uninterrupted_s": round(straight_s, 1),
            "total_s": round(time.perf_counter() - t0, 1), "seed": seed, "platform": platform.platform(),
            "python": platform.python_version()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA,
                    help="prepared data (default: Multi30k EN-DE, prepared if missing)")
    ap.add_argument("--work", type=Path, default=Path.home() / "aiayn-work" / "soak")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--short", action="store_true", help="3 kills, 300 steps, checkpoints every 10 (for tests)")
    ap.add_argument("--json", type=Path, default=ROOT / "results" / "robustness" / "soak_resume.json")
    args = ap.parse_args()
    if args.short:
        args.kills, args.steps, args.save_every = 3, 300, 10
    data = args.data if args.data != DATA else prepared_data()
    result = soak(data, args.work, args.kills, args.steps, args.save_every, args.seed)
    print(json.dumps({k: v for k, v in result.items() if k != "corrupt"}, indent=1))
    print(f"kills survived: {result['kills_survived']}/{result['kills']} ({result['kills_during_write']} during a "
          f"checkpoint write); corrupt checkpoints: {result['corrupt_checkpoints']}; final weights identical to the "
          f"uninterrupted run: {result['final_weights_identical']}; training log identical: "
          f"{result['training_log_identical']} ({result['log_records']} records)")
    if not args.short:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    ok = result["corrupt_checkpoints"] == 0 and result["final_weights_identical"] and result["training_log_identical"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
