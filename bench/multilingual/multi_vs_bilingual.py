"""One model for en->de, en->fr, en->cs against three bilingual models, at equal compute, on Multi30k.

Each bilingual model is the `quick` preset (600 updates; `--preset multi30k`: that preset, d_model 256,
3 layers, 8,000 pieces, 2,750 updates); the multilingual model is the same preset
with the three budgets added up (1,800 updates; checkpoints saved and validations made as often
relative to its length), on one folder prepared with `prepare --pairs` (the same vocabulary size,
so the same FLOPs per token). Every model: its last 5 checkpoints averaged (§6.1), beam 4, α 0.6
(the paper's decoding, not tuned), sacreBLEU on test2016 (de, fr, cs) and test2017 (de, fr).
2 seeds each. The difference per direction and test set is multilingual minus bilingual, each the
mean of its seeds, with a 95 % paired bootstrap interval over the test sentences (1,000 resamples;
seeds' spread given beside it, as 2 seeds say little about it).

Resumable: each (model, seed) is a row of the JSON, written as it finishes; a finished row is skipped.
Work files (prepared data, runs) go to ~/aiayn-work/multilingual (--work; for multi30k,
~/aiayn-work/multilingual-multi30k).

    .venv/bin/python bench/multilingual/multi_vs_bilingual.py [--seeds 1 2] [--preset quick|multi30k] [--work DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchdata import ROOT, cpu_meta, paired_interval  # noqa: E402

TARGETS = ("de", "fr", "cs")
TESTS = {"test_2016_flickr": TARGETS, "test_2017_flickr": ("de", "fr")}
STEPS = {"quick": 600, "multi30k": 2750}  # each preset's updates (aiayn/presets.py)
QUICK_STEPS = STEPS["quick"]


def aiayn(*args: str, env: dict | None = None) -> None:
    subprocess.run([sys.executable, "-m", "aiayn", *args], check=True, env=env, stdout=subprocess.DEVNULL)


def prepare(work: Path, env: dict, preset: str = "quick") -> dict[str, Path]:
    """The three bilingual folders and the multilingual one (the preset's vocabulary size each)."""
    out = {}
    for t in TARGETS:
        out[t] = work / f"prep-en-{t}"
        aiayn("prepare", "--corpus", "multi30k", "--src", "en", "--tgt", t, "-o", str(out[t]), "--preset", preset,
              env=env)
    out["multi"] = work / "prep-multi"
    aiayn("prepare", "--corpus", "multi30k", "--pairs", ",".join(f"en-{t}" for t in TARGETS), "-o", str(out["multi"]),
          "--preset", preset, env=env)
    return out


def train(data: Path, run: Path, seed: int, steps: int, extra: tuple[str, ...] = (), preset: str = "quick") -> Path:
    """The preset's run (`extra`: more config flags), its last 5 checkpoints averaged."""
    if not (run / "averaged.safetensors").exists():
        common = ["--train.seed", str(seed), "--train.max_steps", str(steps), "--train.save_every", str(steps // 20),
                  "--train.valid_every", str(steps // 3), *extra]
        if (run / "config.yaml").exists():
            aiayn("train", "--resume", str(run))
        else:
            aiayn("train", "--data", str(data), "--run-dir", str(run), "--preset", preset, *common)
        aiayn("average", str(run), "-o", str(run / "averaged.safetensors"))
    return run / "averaged.safetensors"


def hypotheses(ckpt: Path, data: Path, split: str, tgt: str, multi: bool, out: Path) -> list[str]:
    src = data / (f"{split}.en-{tgt}.en.txt" if multi else f"{split}.en.txt")
    if not out.exists():
        aiayn("translate", "--checkpoint", str(ckpt), "-i", str(src), "-o", str(out),
              *(["--tgt-lang", tgt] if multi else []))
    return out.read_text().splitlines()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--preset", choices=sorted(STEPS), default="quick")
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    tail = "" if args.preset == "quick" else f"-{args.preset}"
    args.work = args.work or Path.home() / "aiayn-work" / f"multilingual{tail}"
    name = f"{datetime.date.today()}_multi30k_multi_vs_bilingual{tail}.json"
    args.out = args.out or ROOT / "bench" / "multilingual" / name
    steps = STEPS[args.preset]
    env = dict(os.environ)
    shared = ROOT.parent / "shared" / "data" / "multi30k"
    env.setdefault("AIAYN_MULTI30K", str(shared))
    args.work.mkdir(parents=True, exist_ok=True)
    result = json.loads(args.out.read_text()) if args.out.exists() else {
        "what": __doc__.split("\n")[0], "cpu": cpu_meta(), "preset": args.preset, "bilingual_updates": steps,
        "multilingual_updates": steps * len(TARGETS), "decode": "beam 4, alpha 0.6, last 5 averaged",
        "rows": {}}
    data = prepare(args.work, env, args.preset)
    refs = {(s, t): (data[t] / f"{s}.{t}.txt").read_text().splitlines() for s, ts in TESTS.items() for t in ts}
    hyps: dict = {}
    for seed in args.seeds:
        for model in (*TARGETS, "multi"):
            key = f"{model}-seed{seed}"
            multi = model == "multi"
            run = args.work / f"run-{key}"
            ckpt = train(data[model], run, seed, steps * (len(TARGETS) if multi else 1), preset=args.preset)
            row = {}
            for (split, t), ref in refs.items():
                if multi or t == model:
                    h = hypotheses(ckpt, data[model], split, t, multi, run / f"{split}.{t}.hyp")
                    hyps[model if multi else "bi", seed, split, t] = h
                    row[f"{split}.en-{t}"] = round(sacrebleu.corpus_bleu(h, [ref]).score, 2)
            if key not in result["rows"]:
                result["rows"][key] = row
                args.out.write_text(json.dumps(result, indent=1) + "\n")
                print(key, row, flush=True)
    table = {}
    for (split, t), ref in refs.items():
        m = [hyps["multi", s, split, t] for s in args.seeds if ("multi", s, split, t) in hyps]
        b = [hyps["bi", s, split, t] for s in args.seeds if ("bi", s, split, t) in hyps]
        if len(m) == len(b) == len(args.seeds):
            ms = [result["rows"][f"multi-seed{s}"][f"{split}.en-{t}"] for s in args.seeds]
            bs = [result["rows"][f"{t}-seed{s}"][f"{split}.en-{t}"] for s in args.seeds]
            lo, hi = paired_interval(m, b, ref)
            table[f"{split}.en-{t}"] = {"multilingual": ms, "bilingual": bs,
                                        "difference": round(float(np.mean(ms) - np.mean(bs)), 2),
                                        "interval_95": [round(lo, 2), round(hi, 2)],
                                        "within_1_bleu": bool(np.mean(ms) - np.mean(bs) >= -1.0)}
    result["table"] = table
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for k, v in table.items():
        print(f"{k:26} multi {v['multilingual']} bi {v['bilingual']} diff {v['difference']:+.2f} "
              f"[{v['interval_95'][0]:+.2f}, {v['interval_95'][1]:+.2f}]")


if __name__ == "__main__":
    main()
