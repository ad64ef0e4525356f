"""Guided alignment on the main job: test2016 BLEU and gold-set AER with and without it, same updates, seeds.

For each seed and weight λ (0: the paper's training) it trains the `multi30k` preset (2,750 updates;
`--train.guided_alignment λ`, the penultimate layer's first head), averages the last 5 checkpoints,
translates test2016 with beam 4 and α 0.6, scores it with sacreBLEU, and runs bench/align/alignment_aer.py
on the 100 hand-aligned pairs. Each step is skipped when its output exists, so a stopped run
continues (`aiayn train --resume`). Writes one JSON row per run, then the table.

    .venv/bin/python bench/align/guided_alignment.py [--runs ~/aiayn-work/ga/runs] [--seeds 1,2] [--weights 0.05,0]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import DATA, ROOT, cpu_meta, prepared_data  # noqa: E402

GUIDED = "layer 2 head 1"  # guided_layer -2, guided_head 0 of the 3-layer preset, as head_name writes it


def aiayn(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "aiayn", *args], check=True)


def one_run(run: Path, data: Path, seed: int, weight: float) -> dict:
    if not (run / "averaged.safetensors").exists():
        if (run / "config.yaml").exists():
            aiayn("train", "--resume", str(run))
        else:
            aiayn("train", "--data", str(data), "--run", str(run), "--preset", "multi30k", "--train.seed", str(seed),
                  "--train.guided_alignment", str(weight))
        aiayn("average", str(run), "--last", "5", "-o", str(run / "averaged.safetensors"))
    if not (run / "bleu.txt").exists():
        aiayn("translate", "--checkpoint", str(run / "averaged.safetensors"), "--input",
              str(data / "test_2016_flickr.en.txt"), "--output", str(run / "test.hyp"), "--beam", "4", "--alpha", "0.6")
        out = subprocess.run([sys.executable, "-m", "aiayn", "score", "--hyp", str(run / "test.hyp"), "--ref",
                              str(data / "test_2016_flickr.de.txt")], check=True, capture_output=True, text=True)
        (run / "bleu.txt").write_text(out.stdout)
    if not (run / "aer.json").exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "align" / "alignment_aer.py"), "--checkpoint",
                        str(run / "averaged.safetensors"), "--data", str(data), "--out", str(run / "aer.json")],
                       check=True)
    aer = json.loads((run / "aer.json").read_text())
    rows, chosen = aer["rows"], aer["meta"]["chosen"]
    bleu = float(re.search(r"BLEU = ([\d.]+)", (run / "bleu.txt").read_text())[1])
    return {"seed": seed, "weight": weight, "bleu": bleu,
            "aer_guided_head": rows[GUIDED]["aer"], "chosen": chosen, "aer_chosen": rows[chosen]["aer"],
            "aer_best": min(r["aer"] for r in rows.values()), "aer_ibm": rows["IBM Model 2 (reference aligner)"]["aer"],
            "tags_chosen": next(v["overlap"] for k, v in aer["tags"].items() if k.startswith(chosen))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default=str(Path.home() / "aiayn-work" / "ga" / "runs"))
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--weights", default="0.05,0")
    p.add_argument("--out", default="bench/align/2026-11-26_guided_alignment.json")
    args = p.parse_args()
    data = prepared_data(Path(args.data)) if Path(args.data).resolve() == DATA else Path(args.data)
    rows = []
    for seed in map(int, args.seeds.split(",")):
        for weight in map(float, args.weights.split(",")):
            rows.append(one_run(Path(args.runs) / f"s{seed}-l{weight:g}", data, seed, weight))
            Path(args.out).write_text(json.dumps({"meta": {"cpu": cpu_meta()}, "rows": rows}, indent=1))
    print(f"{'seed':>4}{'λ':>6}{'BLEU':>7}{'AER ' + GUIDED:>20}{'chosen':>16}{'AER':>7}{'IBM':>7}{'tags':>7}")
    for r in rows:
        print(f"{r['seed']:>4}{r['weight']:>6g}{r['bleu']:>7.2f}{r['aer_guided_head']:>20.3f}{r['chosen']:>16}"
              f"{r['aer_chosen']:>7.3f}{r['aer_ibm']:>7.3f}{100 * r['tags_chosen']:>6.1f}%")


if __name__ == "__main__":
    main()
