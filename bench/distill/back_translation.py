"""Back-translation on Multi30k EN->DE: sampled synthetic sources against beam-searched ones (Edunov et al. 2018).

Multi30k's 29,000 training pairs are cut in two: the first half (A) is the parallel data, the second
half's German (B) stands for monolingual text. A DE->EN model trained on A translates B's German
into synthetic English twice: by beam search (beam 4, α 0.6, §6.1) and by sampling from the 10 most
probable subwords (`translate --sample --top-k 10`, a seed per sentence). Three EN->DE systems then
train on A alone, on A plus the beam-searched B and on A plus the sampled B (the synthetic sources
tagged <BT>, Caswell et al. 2019; each system learns its vocabulary from its own training text, as a
user's `prepare --synthetic` does). Every model is the `quick` preset at 1,200 updates (the DE->EN model
too), its last 5 checkpoints averaged, decoded at beam 4, α 0.6; 2 seeds each for the EN->DE systems.
The comparison is BLEU on validation (where a choice between the two would be made), test2016 and
test2017, each difference the mean of the seeds with a 95 % paired bootstrap interval over the
sentences (bench/benchdata.py's paired_interval).

Resumable: each row of the JSON is written as it finishes and skipped when there; work files in
~/aiayn-work/bt (--work).

    .venv/bin/python bench/distill/back_translation.py [--seeds 1 2] [--work DIR]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchdata import ROOT, cpu_meta, paired_interval  # noqa: E402

STEPS = 1200
SPLITS = ("valid", "test_2016_flickr", "test_2017_flickr")
ARMS = {"parallel": None, "bt-beam": ("--beam", "4"), "bt-sampled": ("--sample", "--top-k", "10", "--seed", "1")}


def aiayn(*args: str, env: dict | None = None) -> None:
    subprocess.run([sys.executable, "-m", "aiayn", *args], check=True, env=env, stdout=subprocess.DEVNULL)


def halves(corpus: Path, text: Path) -> None:
    """text/{trainA,trainB,val,test_*}.{en,de}: the two halves of the training pairs, the held-out sets."""
    text.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = gzip.open(corpus / f"train.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
        half = len(lines) // 2
        (text / f"trainA.{lang}").write_text("".join(x + "\n" for x in lines[:half]), encoding="utf-8")
        (text / f"trainB.{lang}").write_text("".join(x + "\n" for x in lines[half:]), encoding="utf-8")
        for split in ("val", "test_2016_flickr", "test_2017_flickr"):
            (text / f"{split}.{lang}").write_text(gzip.open(corpus / f"{split}.{lang}.gz", "rt", encoding="utf-8")
                                                  .read(), encoding="utf-8")


def prepare(text: Path, out: Path, src: str, tgt: str, synthetic: Path | None = None) -> Path:
    if not (out / "manifest.json").exists():
        extra = ["--synthetic", f"{synthetic},{text / 'trainB.de'}"] if synthetic else []
        aiayn("prepare", "--data-dir", str(text), "--src", src, "--tgt", tgt, "--train", "trainA", "--valid", "val",
              "--test", "test_2016_flickr", "--test", "test_2017_flickr", "-o", str(out), "--preset", "quick",
              *extra)
    return out


def train(data: Path, run: Path, seed: int) -> Path:
    if not (run / "averaged.safetensors").exists():
        if (run / "config.yaml").exists():
            aiayn("train", "--resume", str(run))
        else:
            aiayn("train", "--data", str(data), "--run-dir", str(run), "--preset", "quick", "--train.seed", str(seed),
                  "--train.max_steps", str(STEPS), "--train.save_every", str(STEPS // 20),
                  "--train.valid_every", str(STEPS // 3))
        aiayn("average", str(run), "-o", str(run / "averaged.safetensors"))
    return run / "averaged.safetensors"


def translate(ckpt: Path, src: Path, out: Path, *flags: str) -> list[str]:
    if not out.exists():
        aiayn("translate", "--checkpoint", str(ckpt), "-i", str(src), "-o", str(out), *flags)
    return out.read_text(encoding="utf-8").splitlines()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--work", type=Path, default=Path.home() / "aiayn-work" / "bt")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    out = args.out or ROOT / "bench" / "distill" / f"{datetime.date.today()}_back_translation.json"
    env = dict(os.environ)
    env.setdefault("AIAYN_MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k"))
    corpus, text = Path(env["AIAYN_MULTI30K"]), args.work / "text"
    if not (text / "trainB.de").exists():
        halves(corpus, text)
    result = json.loads(out.read_text()) if out.exists() else {
        "what": __doc__.split("\n")[0], "cpu": cpu_meta(), "preset": "quick", "updates": STEPS,
        "parallel_pairs": len((text / "trainA.en").read_text().splitlines()),
        "monolingual_lines": len((text / "trainB.de").read_text().splitlines()),
        "decode": "beam 4, alpha 0.6, last 5 averaged", "rows": {}}
    reverse = train(prepare(text, args.work / "prep-de-en", "de", "en"), args.work / "run-de-en", 1)
    data = {}
    for arm, flags in ARMS.items():
        synthetic = None if flags is None else args.work / f"trainB.{arm}.en"
        if synthetic is not None:
            translate(reverse, text / "trainB.de", synthetic, *flags)
        data[arm] = prepare(text, args.work / f"prep-{arm}", "en", "de", synthetic)
    refs = {s: (text / f"{'val' if s == 'valid' else s}.de").read_text(encoding="utf-8").splitlines() for s in SPLITS}
    hyps: dict = {}
    for seed in args.seeds:
        for arm in ARMS:
            run = args.work / f"run-{arm}-seed{seed}"
            ckpt = train(data[arm], run, seed)
            row = {}
            for s in SPLITS:
                src = text / f"{'val' if s == 'valid' else s}.en"
                hyps[arm, seed, s] = translate(ckpt, src, run / f"{s}.hyp")
                row[s] = round(sacrebleu.corpus_bleu(hyps[arm, seed, s], [refs[s]]).score, 2)
            if f"{arm}-seed{seed}" not in result["rows"]:
                result["rows"][f"{arm}-seed{seed}"] = row
                out.write_text(json.dumps(result, indent=1) + "\n")
                print(arm, seed, row, flush=True)
    table = {}
    for a, b in (("bt-sampled", "bt-beam"), ("bt-beam", "parallel"), ("bt-sampled", "parallel")):
        for s in SPLITS:
            lo, hi = paired_interval([hyps[a, k, s] for k in args.seeds], [hyps[b, k, s] for k in args.seeds], refs[s])
            diff = np.mean([result["rows"][f"{a}-seed{k}"][s] for k in args.seeds]) - np.mean(
                [result["rows"][f"{b}-seed{k}"][s] for k in args.seeds])
            table[f"{a} - {b}: {s}"] = {"difference": round(float(diff), 2),
                                        "interval_95": [round(lo, 2), round(hi, 2)]}
    result["table"] = table
    out.write_text(json.dumps(result, indent=1) + "\n")
    for k, v in table.items():
        print(f"{k:40} {v['difference']:+.2f} [{v['interval_95'][0]:+.2f}, {v['interval_95'][1]:+.2f}]")


if __name__ == "__main__":
    main()
