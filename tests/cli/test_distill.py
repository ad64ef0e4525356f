"""`aiayn distill` (cli/distilling.py): a teacher's translations of the training sources, the same as
`aiayn translate` gives, filtered by its confidence, prepared in its vocabulary with a shortlist;
killed part-way in another process, a rerun gives the bytes of an uninterrupted one."""

import subprocess
import sys

import pytest
import torch
from conftest import kill_after_parts

from aiayn.cli import main


@pytest.fixture(scope="module")
def teacher(toy_prepared, tmp_path_factory):
    from aiayn.checkpoint import model_tensors, save_weights
    from aiayn.config import Config
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.models.transformer import Transformer

    tok, cfg = Tokenizer.load(str(toy_prepared / "spm.model")), Config()
    cfg.model.vocab_size, cfg.model.d_model, cfg.model.d_ff, cfg.model.h, cfg.model.N = len(tok), 32, 64, 4, 2
    cfg.decode.max_len_b = 8
    torch.manual_seed(0)
    ckpt = tmp_path_factory.mktemp("teacher") / "teacher.safetensors"
    save_weights(ckpt, model_tensors(Transformer(cfg.model)), cfg, tok, 0)
    return ckpt


def _cmd(teacher, toy_corpus, out, *extra):
    return ["distill", "--teacher", str(teacher), "--data-dir", str(toy_corpus), "--src", "en", "--tgt", "de",
            "--train", "train", "--valid", "valid", "--test", "test", "-o", str(out), "--chunk-lines", "20",
            "--beam", "2", "--precision", "fp32", *extra]


def test_distill_writes_the_teachers_translations_and_prepares_them_in_its_vocabulary(teacher, toy_corpus,
                                                                                       tmp_path, capsys):
    from aiayn.checkpoint import read_meta, read_metadata
    from aiayn.data.prepare import load_manifest
    from aiayn.decode.shortlist import Shortlist

    out = tmp_path / "student"
    assert main(_cmd(teacher, toy_corpus, out)) == 0
    work = tmp_path / "student.teacher"
    hyps = (work / "teacher.de").read_text().splitlines()
    assert len(hyps) == 400
    assert main(["translate", "--checkpoint", str(teacher), "-i", str(toy_corpus / "train.en"), "-o",
                 str(tmp_path / "t.de"), "--beam", "2", "--precision", "fp32", "--chunk-lines", "20"]) == 0
    assert hyps == (tmp_path / "t.de").read_text().splitlines()  # what translate gives, line for line
    assert (work / "train.de").read_text().splitlines() == [h for h in hyps if h]
    proto = read_meta(read_metadata(teacher), str(teacher))[1].proto
    assert (out / "spm.model").read_bytes() == proto  # the teacher's vocabulary
    manifest = load_manifest(out)
    assert manifest["inputs"]["train"]["src"] == str(work / "train.en")
    assert (out / "test.de.txt").read_text() == (toy_corpus / "test.de").read_text()  # genuine references kept
    Shortlist.load(work / "shortlist.safetensors", proto)
    scores = [line.split("\t") for line in (work / "scores.tsv").read_text().splitlines()[1:]]
    assert len(scores) == 400
    # a confidence threshold keeps exactly the pairs at or above it
    cut = sorted(float(s[0]) for s in scores)[200]
    again = tmp_path / "filtered"
    assert main(_cmd(teacher, toy_corpus, again, "--min-logprob", str(cut), "--no-shortlist")) == 0
    kept = (tmp_path / "filtered.teacher" / "train.de").read_text().splitlines()
    rows = [line.split("\t") for line in (tmp_path / "filtered.teacher" / "scores.tsv").read_text().splitlines()[1:]]
    want = [h for h, r in zip(hyps, rows) if h and float(r[0]) >= round(cut, 4) - 1e-4]
    assert 150 < len(kept) <= 210 and [int(r[2]) for r in rows].count(1) == len(kept)
    assert set(kept) <= set(want)
    assert not (tmp_path / "filtered.teacher" / "shortlist.safetensors").exists()


def test_a_distillation_killed_part_way_resumes_to_the_same_bytes(teacher, toy_corpus, tmp_path):
    def cmd(out):
        return [sys.executable, "-m", "aiayn", *_cmd(teacher, toy_corpus, tmp_path / out, "--no-shortlist")]

    subprocess.run(cmd("straight"), check=True, capture_output=True, timeout=300)
    parts = tmp_path / "killed.teacher" / "teacher.de.parts"
    kept = kill_after_parts(cmd("killed"), parts)
    assert 3 <= kept < 20 and not (tmp_path / "killed").exists()
    res = subprocess.run(cmd("killed"), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-1500:]
    assert f"{kept} chunk(s) already translated" in res.stderr
    for name in ("teacher.de", "scores.tsv", "train.en", "train.de"):
        assert (tmp_path / "killed.teacher" / name).read_bytes() == (tmp_path / "straight.teacher" / name).read_bytes()
    for name in ("train.src.tok.npy", "train.tgt.tok.npy", "spm.model"):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "straight" / name).read_bytes()
    assert not parts.exists()


def test_distill_refuses_what_it_did_not_write_and_a_missing_teacher(teacher, toy_corpus, tmp_path, capsys):
    work = tmp_path / "mine"
    work.mkdir()
    (work / "notes.txt").write_text("keep me")
    assert main(_cmd(teacher, toy_corpus, tmp_path / "s", "--work", str(work))) == 2
    assert "aiayn never deletes what it did not write" in capsys.readouterr().err
    assert (work / "notes.txt").read_text() == "keep me" and not (tmp_path / "s").exists()
    assert main(_cmd(tmp_path / "nope.safetensors", toy_corpus, tmp_path / "s")) == 2
    assert "nope.safetensors" in capsys.readouterr().err
    assert main(_cmd(teacher, toy_corpus, tmp_path / "s", "--min-logprob", "nan")) == 2
    assert "--min-logprob must be a finite number" in capsys.readouterr().err
