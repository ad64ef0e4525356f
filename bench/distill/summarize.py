"""Gather a distillation run's figures (bench/distill/distill.sh's WORK folder) into one JSON and a
table: the teacher's and the student's test BLEU, what distill kept, the student's size and training
time, and decoding speed and latency against CTranslate2 on the same student (medians of alternating
repetitions, one process per measurement: bench/decode/decode_speed.py); with several seeds, the mean
difference student minus student-orig (KD's own gain) and student minus teacher, each with a 95 % paired
bootstrap interval over the test sentences (bench/benchdata.py's paired_interval)."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchdata import paired_interval  # noqa: E402

TESTS = (("test_2016_flickr", "test2016"), ("test_2017_flickr", "test2017"))


def models(work: Path) -> dict[str, list[str]]:
    """The work folder's models by kind, seed 1 first: student-orig is the same student on the original
    targets; seed N's folders end in -sN (distill.sh's run_of)."""
    def seeds(kind: str) -> list[str]:
        names = [kind] + sorted((p.name for p in work.glob(f"{kind}-s*") if p.name[len(kind) + 2:].isdigit()),
                                key=lambda n: int(n[len(kind) + 2:]))
        return [n for n in names if (work / n / "averaged.safetensors").is_file()]
    return {"teacher": ["teacher"], "student": seeds("student"), "student-orig": seeds("student-orig")}


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def differences(work: Path, kinds: dict[str, list[str]]) -> dict:
    """Mean-over-seeds BLEU differences, at beam 4, alpha 0.6, fp32 and at each model's tuned setting (the
    keys ending in _tuned), with their paired bootstrap interval over the test sentences; per_seed holds
    each seed's own difference (against the same seed's student-orig, or the one teacher)."""
    out = {}
    for tag in ("", ".tuned"):
        for name, a, b in (("kd_gain", "student", "student-orig"), ("student_minus_teacher", "student", "teacher")):
            for t, short in TESTS:
                row = _difference(work, kinds[a], kinds[b], tag, t)
                if row:
                    out.setdefault(name + tag.replace(".", "_"), {})[short] = row
    return out


def _difference(work: Path, a: list[str], b: list[str], tag: str, test: str) -> dict | None:
    files = [[work / f"{m}{tag}.{test}.de" for m in ms] for ms in (a, b)]
    ref = work / "data" / f"{test}.de.txt"
    bleu = [[_bleu(work / f"{m}{tag}.{test}.score") for m in ms] for ms in (a, b)]
    if not a or not b or not ref.is_file() or not all(f.is_file() for fs in files for f in fs) \
            or None in bleu[0] + bleu[1]:
        return None  # a model not yet translated or scored at this setting
    refs = _lines(ref)
    hyps = [[_lines(f) for f in fs] for fs in files]
    lo, hi = paired_interval(hyps[0], hyps[1], refs)
    per_seed = [x - bleu[1][0] for x in bleu[0]] if len(b) == 1 else [x - y for x, y in zip(bleu[0], bleu[1])]
    return {"seeds": [len(a), len(b)], "delta": statistics.mean(bleu[0]) - statistics.mean(bleu[1]),
            "ci95": [lo, hi], "per_seed": per_seed}


def _bleu(path: Path) -> float | None:
    m = re.search(r"BLEU = ([\d.]+)", path.read_text()) if path.is_file() else None
    return float(m.group(1)) if m else None


def _speed(path: Path) -> dict:
    if not path.is_file():
        return {}
    d = json.loads(path.read_text())
    out = {r["system"]: {"sent_per_s": r["sent_per_s"], "per_rep": r["per_rep_sent_per_s"], "bleu": r["bleu"]}
           for r in d["rows"]}
    for r in d.get("latency", []):
        out.setdefault(r["system"], {})[f"latency_p50_ms_{r['threads']}t"] = r.get("p50_ms")
    return {"cpu": d["meta"]["cpu"], "systems": out}


def _tuned(log: Path) -> dict:
    """What `aiayn tune` chose (beam, alpha, precision) and each precision's validation BLEU and speed."""
    if not log.is_file():
        return {}
    text = log.read_text()
    out: dict = {"precisions": {}}
    for name, bleu, speed in re.findall(r"^\s+(fp32|bf16|int8)\s+([\d.]+)\s+([\d.]+)", text, re.M):
        out["precisions"][name] = {"valid_bleu": float(bleu), "sent_per_s": float(speed)}
    chosen = re.search(r"(\w+)\s+[\d.]+\s+[\d.]+\s+<- auto takes it", text)
    setting = re.search(r"beam (\d+), alpha ([\d.]+) ->", text)
    out["precision"] = chosen.group(1) if chosen else None
    if setting:
        out["beam"], out["alpha"] = int(setting.group(1)), float(setting.group(2))
    return out


def summarize(work: Path) -> dict:
    scores = [line.split("\t") for line in (work / "data.teacher" / "scores.tsv").read_text().splitlines()[1:]]
    train = json.loads((work / "data" / "manifest.json").read_text())["splits"]["train"]
    metrics = [json.loads(x) for x in (work / "student" / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in metrics if "step" in m][-1]
    kinds = models(work)
    names = [m for ms in kinds.values() for m in ms]
    result = {
        "teacher_translations": len(scores), "kept": sum(int(s[2]) for s in scores),
        "teacher_mean_logprob_median": statistics.median(float(s[0]) for s in scores),
        "student_training_pairs": train["pairs"], "student_updates": last.get("step"),
        "bleu": {m: {t: _bleu(work / f"{m}.{t}.score") or _bleu(work / f"{m}.{short}.score") for t, short in TESTS}
                 for m in names + [f"{m}.tuned" for m in names]},
        "tuned": {m: _tuned(work / f"{m}.tune.log") for m in names},
        "differences": differences(work, kinds),
        "student_speed": _speed(work / "student_speed.json"), "teacher_speed": _speed(work / "teacher_speed.json"),
    }
    return result


if __name__ == "__main__":
    work = Path(sys.argv[1]) if len(sys.argv) == 2 else None
    if work is None or not (work / "data.teacher" / "scores.tsv").is_file():
        sys.exit("usage: summarize.py WORK, the folder bench/distill/distill.sh wrote (with data.teacher/scores.tsv)")
    out = summarize(work)
    print(json.dumps(out, indent=1))
