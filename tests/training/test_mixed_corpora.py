"""Training on weighted corpora (prepare --synthetic, data/mixing.py) with guided alignment on:
SIGKILLed and resumed in another process, the run ends bit for bit where an uninterrupted one does,
and its log names the mix."""

import subprocess

import pytest
from conftest import TINY, aiayn
from test_resume import final_bytes, kill_after_step_15, resume

from aiayn.data.mixing import TrainingCorpus
from aiayn.data.prepare import prepare

GUIDED = ["--train.guided_alignment", "0.05", "--train.guided_layer", "-1"]


@pytest.fixture(scope="module")
def mixed(toy_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("mixedrun")
    de = (toy_corpus / "train.de").read_text().splitlines()[:150]
    (d / "bt.en").write_text("".join(" ".join(reversed(x.split())) + "\n" for x in de))
    (d / "bt.de").write_text("".join(x + "\n" for x in de))
    splits = {n: (toy_corpus / f"{n}.en", toy_corpus / f"{n}.de") for n in ("train", "valid")}
    bt = TrainingCorpus("synthetic1", d / "bt.en", d / "bt.de", weight=0.5)
    prepare(splits, d / "prep", "en", "de", vocab_size=80, max_len=64, corpora=(bt,), train_weight=2.0)
    return d / "prep"


def test_a_weighted_run_resumes_bit_identically(mixed, tmp_path):
    straight = tmp_path / "straight"
    res = subprocess.run(aiayn("train", "--data", str(mixed), "--run-dir", str(straight), *TINY, *GUIDED),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "training corpora, weighted: parallel" in res.stderr and "synthetic1" in res.stderr
    run = tmp_path / "run"
    kill_after_step_15(aiayn("train", "--data", str(mixed), "--run-dir", str(run), *TINY, *GUIDED), run)
    assert "resumed from step-000000" in resume(run).stderr
    assert final_bytes(run) == final_bytes(straight)
