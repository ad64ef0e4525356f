"""bench/distill/summarize.py on a synthetic work folder: the seeds' folders found in order, and the
mean-over-seeds differences with their paired bootstrap interval (a second implementation: sacreBLEU's
corpus scores, computed here)."""

import importlib.util
import json
from pathlib import Path

import pytest
import sacrebleu

SUMMARIZE = Path(__file__).resolve().parents[1] / "bench" / "distill" / "summarize.py"
REFS = [f"ein Hund Nummer {i} läuft über die Wiese im Park" for i in range(40)]


@pytest.fixture(scope="module")
def summarize():
    spec = importlib.util.spec_from_file_location("distill_summarize", SUMMARIZE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(work: Path, name: str, hyps: list[str] | None, averaged: bool = True, tag: str = "") -> None:
    (work / name).mkdir(exist_ok=True)
    if averaged:
        (work / name / "averaged.safetensors").write_bytes(b"")
    for t in ("test_2016_flickr", "test_2017_flickr"):
        if hyps is not None:
            (work / f"{name}{tag}.{t}.de").write_text("\n".join(hyps) + "\n", encoding="utf-8")
            score = sacrebleu.corpus_bleu(hyps, [REFS]).score
            (work / f"{name}{tag}.{t}.score").write_text(f"BLEU = {score:.2f} 60.0/40.0/30.0/20.0\n")


def test_seeds_are_found_in_order_and_differences_are_means_with_a_paired_interval(summarize, tmp_path):
    (tmp_path / "data").mkdir()
    for t in ("test_2016_flickr", "test_2017_flickr"):
        (tmp_path / "data" / f"{t}.de.txt").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    worse = [r.replace("Wiese", "Straße") if i % 2 else r for i, r in enumerate(REFS)]
    worst = [r.replace("läuft", "sitzt") for r in worse]
    _model(tmp_path, "teacher", REFS, averaged=False)
    for name, hyps in (("student", REFS), ("student-s10", REFS), ("student-s2", worse),
                       ("student-orig", worse), ("student-orig-s2", worst)):
        _model(tmp_path, name, hyps)
    _model(tmp_path, "student-s3", REFS, averaged=False)  # unfinished: no averaged checkpoint
    _model(tmp_path, "student-sx", REFS)  # not a seed's folder
    kinds = summarize.models(tmp_path)
    assert kinds["student"] == ["student", "student-s2", "student-s10"]
    assert kinds["student-orig"] == ["student-orig", "student-orig-s2"]

    out = summarize.differences(tmp_path, kinds)
    bleu = {h: sacrebleu.corpus_bleu(x, [REFS]).score for h, x in (("r", REFS), ("w", worse), ("ww", worst))}
    gain = out["kd_gain"]["test2016"]
    assert gain["seeds"] == [3, 2]
    assert gain["delta"] == pytest.approx((2 * bleu["r"] + bleu["w"]) / 3 - (bleu["w"] + bleu["ww"]) / 2, abs=0.01)
    assert 0 < gain["ci95"][0] <= gain["delta"] <= gain["ci95"][1]
    vs_teacher = out["student_minus_teacher"]["test2017"]
    assert vs_teacher["seeds"] == [3, 1] and vs_teacher["delta"] < 0 and vs_teacher["ci95"][1] <= 0


def test_tuned_differences_are_kept_apart_and_carry_each_seeds_own_difference(summarize, tmp_path):
    (tmp_path / "data").mkdir()
    for t in ("test_2016_flickr", "test_2017_flickr"):
        (tmp_path / "data" / f"{t}.de.txt").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    worse = [r.replace("Wiese", "Straße") if i % 2 else r for i, r in enumerate(REFS)]
    for name, b4, tuned in (("teacher", REFS, REFS), ("student", worse, REFS), ("student-s2", worse, worse),
                            ("student-orig", worse, worse), ("student-orig-s2", REFS, worse)):
        _model(tmp_path, name, b4, averaged=name != "teacher")
        _model(tmp_path, name, tuned, averaged=False, tag=".tuned")
    out = summarize.differences(tmp_path, summarize.models(tmp_path))
    bleu = {h: sacrebleu.corpus_bleu(x, [REFS]).score for h, x in (("r", REFS), ("w", worse))}
    gap = bleu["r"] - bleu["w"]
    assert out["kd_gain"]["test2016"]["per_seed"] == pytest.approx([0, -gap], abs=0.01)
    assert out["kd_gain_tuned"]["test2016"]["per_seed"] == pytest.approx([gap, 0], abs=0.01)
    assert out["kd_gain_tuned"]["test2016"]["delta"] == pytest.approx(gap / 2, abs=0.01)
    assert out["student_minus_teacher_tuned"]["test2017"]["per_seed"] == pytest.approx([0, -gap], abs=0.01)
    assert out["student_minus_teacher"]["test2017"]["per_seed"] == pytest.approx([-gap, -gap], abs=0.01)
    (tmp_path / "student-orig-s2.tuned.test_2017_flickr.score").unlink()  # translated, not yet scored
    out = summarize.differences(tmp_path, summarize.models(tmp_path))
    assert "test2017" not in out["kd_gain_tuned"] and "test2016" in out["kd_gain_tuned"]


def _signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


def test_the_students_page_gives_the_committed_run_s_figures_beside_their_own_rows():
    """docs/students.md's two-seed tables against the JSON bench/distill/summarize.py wrote for that run."""
    root = Path(__file__).resolve().parents[1]
    run = json.loads((root / "bench" / "distill" / "2026-12-07_family26_distill.json").read_text())
    page = (root / "docs" / "students.md").read_text(encoding="utf-8")
    section = page[page.index("## Measured"):page.index("On a Zen 3")]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    bleu = run["bleu"]
    for label, models in (("teacher", ["teacher"]),
                          ("student on the teacher's translations", ["student", "student-s2"]),
                          ("student on the original targets", ["student-orig", "student-orig-s2"])):
        cells = [c.strip() for c in rows[label].split("|")[3:-1]]
        want = [", ".join(f"{run['tuned'][m]['precisions']['fp32']['valid_bleu']:.2f}" for m in models)]
        for test in ("test_2016_flickr", "test_2017_flickr"):
            want += [", ".join(f"{bleu[m + tag][test]:.2f}" for m in models) for tag in ("", ".tuned")]
        assert cells == want, label
    diffs = run["differences"]
    for label, key in (("distillation's gain", "kd_gain"), ("student − teacher", "student_minus_teacher")):
        cells = rows[label].split("|")[2:-1]
        for cell, (tag, test) in zip(cells, [("", "test2016"), ("", "test2017"), ("_tuned", "test2016"),
                                             ("_tuned", "test2017")]):
            d = diffs[key + tag][test]
            want = f"{_signed(d['delta'])} ({_signed(d['ci95'][0])} … {_signed(d['ci95'][1])})"
            if key == "kd_gain":  # each seed's own gain beside the mean
                want += "; " + ", ".join(_signed(x) for x in d["per_seed"])
            assert cell.replace("**", "").strip() == want, (label, test)
