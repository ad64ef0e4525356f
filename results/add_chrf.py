"""Add chrF to result files written before evaluation recorded it, from the hypotheses kept beside them.

For every ROW.json under the given suite folders and every split whose ROW.SPLIT.hyp.gz is kept, BLEU is
rescored from the hypotheses against the prepared data's references first: a file whose recorded BLEU
this does not reproduce (to the recorded 2 decimals) is left alone and named. Otherwise chrF (sacreBLEU's
chrF2) is written into that split's entry, and nothing else in the file changes.

    .venv/bin/python results/add_chrf.py --data work/multi30k-en-de results/reproduction/tune results/reproduction/arch
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aiayn.data.prepare import load_manifest, read_text  # noqa: E402
from aiayn.files import atomic_write  # noqa: E402


def add_chrf(result: Path, refs: dict[str, list[str]]) -> str:
    """chrF written into each scored split of `result` (what was done, in words)."""
    r = json.loads(result.read_text())
    changed = []
    for split, b in r.get("bleu", {}).items():
        hyp = result.with_name(f"{result.stem}.{split}.hyp.gz")
        if "chrf" in b or not hyp.exists() or split not in refs:
            continue
        hyps = gzip.decompress(hyp.read_bytes()).decode().splitlines()
        ref = refs[split][:len(hyps)]
        bleu = round(sacrebleu.corpus_bleu(hyps, [ref]).score, 2)
        if len(hyps) != b["sentences"] or bleu != b["bleu"]:
            return f"{result}: {split} BLEU {bleu} from its hypotheses, {b['bleu']} recorded: left alone"
        b["chrf"] = round(sacrebleu.CHRF().corpus_score(hyps, [ref]).score, 2)
        changed.append(f"{split} {b['chrf']}")
    if changed:
        atomic_write(result, json.dumps(r, indent=1).encode())
    return f"{result}: chrF {', '.join(changed) or 'already there or nothing kept'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, type=Path, help="the prepared data the rows were scored on")
    ap.add_argument("suites", nargs="+", type=Path)
    args = ap.parse_args()
    splits = ["valid"] + [s for s in load_manifest(args.data)["splits"] if s not in ("train", "valid")]
    refs = {s: read_text(args.data, s, "tgt") for s in splits if (args.data / f"{s}.de.txt").exists()}
    for folder in args.suites:
        for result in sorted(folder.glob("*.json")):
            print(add_chrf(result, refs))


if __name__ == "__main__":
    main()
