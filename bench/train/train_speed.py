"""Training throughput: aiayn vs Hugging Face MarianMTModel, same data, batches and sizes.

Each measurement runs in its own process (so peak memory is its own), on the first batches of
the prepared Multi30k EN-DE data (same vocabulary, same token-count batches for both), after a
few warm-up updates. Systems alternate (A B C A B C ...); the table gives medians of target
tokens/s, the ratio to HF Marian, and peak resident memory.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/train/train_speed.py [--data work/multi30k-en-de] [--configs small,base] [--reps 3]
    .venv/bin/python bench/train/train_speed.py --systems aiayn-bf16,aiayn-bf16-logits --out
        bench/train/2026-11-22_fp32_logits.json

The default data directory is prepared with `aiayn prepare` when missing (bench/benchdata.py).

The HF side is a minimal loop: MarianMTModel forward with labels-shifted decoder inputs,
F.cross_entropy with label smoothing 0.1, Adam, fp32 (as measured for the issue's reference).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import DATA, ROOT, cpu_meta, meaningful, prepared_data, switches  # noqa: E402

SIZES = {"small": dict(d_model=256, d_ff=1024, h=4, N=3), "base": dict(d_model=512, d_ff=2048, h=8, N=6)}
STEPS = {"small": (5, 25), "base": (3, 8)}  # (warm-up, measured) updates
# suffix -logits16 / -logits32: force the output layer's precision; hf-fp32-thp: HF with huge pages too
SYSTEMS = ["aiayn-bf16", "aiayn-fp32", "hf-fp32"]
# The bf16 rows' output layer as in the preset each size stands for: small is `multi30k` (bf16 logits,
# bench/train/2026-11-22_fp32_logits.json), base is `base` (fp32 logits, the default).
FP32_LOGITS = {"small": False, "base": True}


def build(system: str, size: str, data_dir: Path, n_batches: int):
    """(model, optimizer, config, batches) for an aiayn system, as `aiayn train` builds them; the bf16
    rows keep the fp32-logits setting of the preset the size stands for (FP32_LOGITS)."""
    import torch

    from aiayn.config import Config
    from aiayn.data.batches import TokenData, collate, make_batches
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.models.transformer import Transformer
    from aiayn.training.optim import make_optimizer

    with contextlib.suppress(ImportError):  # the kernel cache `aiayn train` asks for (runs.setup)
        from aiayn.models.linear import kernel_cache

        kernel_cache(16)
    with contextlib.suppress(ImportError):  # and its huge pages (device.huge_pages)
        from aiayn.device import huge_pages

        huge_pages()
    torch.manual_seed(0)
    tok = Tokenizer.load(str(Path(data_dir) / "spm.model"))
    data = TokenData(Path(data_dir), "train")
    batches = [collate(data, b) for b in make_batches(data.src_lens, data.tgt_lens, 4096, 1, 0)[:n_batches]]
    cfg = Config()
    cfg.model.vocab_size, cfg.model.p_drop = len(tok), 0.1
    for k, v in SIZES[size].items():
        setattr(cfg.model, k, v)
    cfg.train.precision = "bf16" if "bf16" in system else "fp32"
    cfg.model.fp32_logits = FP32_LOGITS[size]
    if system.endswith("-logits16"):
        cfg.model.fp32_logits = False
    elif system.endswith("-logits32"):
        cfg.model.fp32_logits = True
    model = Transformer(cfg.model)
    return model, make_optimizer(model, cfg.train), cfg, batches


def worker(system: str, size: str, data_dir: str, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    warm, steps = STEPS[size]
    if system.startswith("aiayn"):
        from aiayn.training.step import train_step

        model, opt, cfg, batches = build(system.split("@")[0], size, Path(data_dir), warm + steps)

        def step(b):
            train_step(model, opt, [(b, 1.0)], b.n_tokens, cfg, 1e-4, 1, torch.device("cpu"))
    else:
        from transformers import MarianConfig, MarianMTModel

        from aiayn.data.batches import TokenData, collate, make_batches
        from aiayn.data.tokenizer import Tokenizer

        torch.manual_seed(0)
        tok = Tokenizer.load(str(Path(data_dir) / "spm.model"))
        data = TokenData(Path(data_dir), "train")
        batches = [collate(data, b) for b in make_batches(data.src_lens, data.tgt_lens, 4096, 1, 0)[:warm + steps]]
        dims = SIZES[size]
        hf_cfg = MarianConfig(vocab_size=len(tok), decoder_vocab_size=len(tok), d_model=dims["d_model"],
                              encoder_layers=dims["N"], decoder_layers=dims["N"], encoder_attention_heads=dims["h"],
                              decoder_attention_heads=dims["h"], encoder_ffn_dim=dims["d_ff"],
                              decoder_ffn_dim=dims["d_ff"], activation_function="relu", dropout=0.1,
                              pad_token_id=0, eos_token_id=3, decoder_start_token_id=2, scale_embedding=True,
                              max_position_embeddings=256, share_encoder_decoder_embeddings=True)
        model = MarianMTModel(hf_cfg).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

        def step(b):
            logits = model(input_ids=b.src, attention_mask=b.src != 0, decoder_input_ids=b.tgt_in).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), b.tgt_out.view(-1), ignore_index=0,
                                   label_smoothing=0.1, reduction="sum")
            (loss / b.n_tokens).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    for b in batches[:warm]:
        step(b)
    start = time.perf_counter()
    for b in batches[warm:]:
        step(b)
    seconds = time.perf_counter() - start
    tokens = sum(b.n_tokens for b in batches[warm:])
    return {"system": system, "size": size, "tgt_tok_s": tokens / seconds, "steps": steps,
            "switches": switches(cfg=cfg) if system.startswith("aiayn") else {},
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def code_env(system: str) -> dict:
    """The environment of a worker: `SYSTEM@COMMIT` imports aiayn from a checkout of COMMIT (a git
    worktree under work/, made once), so the same run compares the code with an earlier version."""
    env = dict(os.environ)
    if system.startswith("hf") and system.endswith("-thp"):  # the peer with aiayn's allocator setting
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    if "@" in system:
        commit = system.split("@")[1]
        tree = ROOT / "work" / f"aiayn-{commit}"
        if not (tree / "aiayn").is_dir():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), commit],
                           check=True, capture_output=True)
        env["PYTHONPATH"] = str(tree)
    return env


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--configs", default="small,base")
    p.add_argument("--systems", default=",".join(meaningful(SYSTEMS)),
                   help="SYSTEM@COMMIT runs an earlier version (default: those native here; bf16 needs native bf16)")
    p.add_argument("--baseline", help="also run aiayn-bf16 as of this commit (e.g. 1ebaef9)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--measure", type=int, help="measured updates per run (default: 25 small, 8 base)")
    p.add_argument("--out", default="bench/train/2026-11-21_train_speed.json")
    p.add_argument("--worker", nargs=2, metavar=("SYSTEM", "SIZE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        if args.measure:
            STEPS[args.worker[1]] = (STEPS[args.worker[1]][0], args.measure)
        print(json.dumps(worker(args.worker[0], args.worker[1], args.data, args.threads)))
        return
    if Path(args.data).resolve() == DATA:
        prepared_data(DATA)
    print(f"CPU: {cpu_meta()['label']}; systems: {args.systems}", flush=True)
    if args.baseline:
        args.systems += f",aiayn-bf16@{args.baseline}"
    runs: list[dict] = []
    for size in args.configs.split(","):
        for rep in range(args.reps):
            for system in args.systems.split(","):  # alternate: A B C A B C ...
                out = subprocess.run([sys.executable, __file__, "--worker", system, size, "--data", args.data,
                                      "--threads", str(args.threads), *(["--measure", str(args.measure)]
                                                                         if args.measure else [])],
                                     capture_output=True, text=True,
                                     env=code_env(system))
                if out.returncode:
                    sys.exit(f"{system} {size} failed:\n{out.stderr[-2000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"  rep {rep + 1} {size:<6}{system:<22}{r['tgt_tok_s']:>8.0f} tok/s {r['peak_rss_mb']:>7.0f} MB",
                      flush=True)
                runs.append(r)
    rows = []
    for size in args.configs.split(","):
        ref = statistics.median(r["tgt_tok_s"] for r in runs if r["size"] == size and r["system"] == "hf-fp32") \
            if "hf-fp32" in args.systems else None
        for system in args.systems.split(","):
            mine = [r for r in runs if r["size"] == size and r["system"] == system]
            tok_s = statistics.median(r["tgt_tok_s"] for r in mine)
            rows.append({"size": size, "system": system, "tgt_tok_s": tok_s,
                         "vs_hf": tok_s / ref if ref else None,
                         "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in mine)})
    print(f"\n{'size':<7}{'system':<22}{'tok/s':>8}{'x HF':>7}{'peak MB':>9}")
    for r in rows:
        ratio = f"{r['vs_hf']:.2f}" if r["vs_hf"] else ""
        print(f"{r['size']:<7}{r['system']:<22}{r['tgt_tok_s']:>8.0f}{ratio:>7}{r['peak_rss_mb']:>9.0f}")
    import torch

    meta = {"torch": torch.__version__, "threads": args.threads, "machine": platform.processor() or platform.machine(),
            "cpu": cpu_meta(), "reps": args.reps, "date": time.strftime("%Y-%m-%d")}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
