"""A core install (`pip install aiayn`, no extras) prepares, trains, translates, scores and imports;
a verb that needs an extra says in one line which to install. Run in fresh processes where the
extras' packages cannot be imported (as in a venv without them)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import aiayn
from aiayn.checkpoint import list_checkpoints
from tests.conftest import tiny_config

EXTRAS_PACKAGES = ("fastapi", "uvicorn", "matplotlib", "scipy", "pysbd", "transformers", "ctranslate2", "nltk",
                   "tensorboard")
RUN = ("import sys\n"
       f"for name in {EXTRAS_PACKAGES!r}:\n"
       "    sys.modules[name] = None  # import fails, as where it is not installed\n"
       "from aiayn.cli import main\n"
       "code = main(sys.argv[1:])\n"
       f"leaked = [m for m in {EXTRAS_PACKAGES!r} if sys.modules.get(m) is not None]\n"
       "assert not leaked, leaked\n"
       "sys.exit(code)\n")


def core(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_a_core_install_prepares_trains_translates_scores_and_imports(toy_corpus, tmp_path):
    c = toy_corpus
    steps = [
        ["prepare", "--data-dir", str(c), "--src", "en", "--tgt", "de", "--train", "train", "--valid", "valid",
         "--test", "test", "-o", str(tmp_path / "prep"), "--data.vocab_size", "60", "--data.max_len", "32"],
        ["train", "--data", str(tmp_path / "prep"), "--run-dir", str(tmp_path / "run"), "--model.d_model", "32",
         "--model.d_ff", "64", "--model.h", "4", "--model.N", "1", "--train.max_steps", "6",
         "--train.warmup_steps", "4", "--train.valid_every", "0", "--train.valid_bleu_sentences", "0",
         "--train.precision", "fp32", "--train.tokens_per_update", "0", "--data.max_tokens", "400",
         "--train.threads", "1", "--train.save_every", "3"],
        ["average", "--run-dir", str(tmp_path / "run"), "--last", "2", "-o", str(tmp_path / "avg.safetensors")],
        ["translate", "--checkpoint", str(tmp_path / "avg.safetensors"), "-i", str(c / "test.en"),
         "-o", str(tmp_path / "test.hyp"), "--max-len-b", "5"],
        ["score", "--hyp", str(tmp_path / "test.hyp"), "--ref", str(c / "test.de")],
    ]
    for argv in steps:
        res = core(*argv, cwd=tmp_path)
        assert res.returncode == 0, (argv[0], res.stderr[-2000:])
    assert len((tmp_path / "test.hyp").read_text().splitlines()) == len((c / "test.en").read_text().splitlines())


@pytest.fixture(scope="module")
def ckpt(toy_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("extras") / "run"
    aiayn.train(tiny_config(max_steps=4), str(toy_prepared), str(run))
    return list_checkpoints(run)[-1]


@pytest.mark.parametrize("argv, extra", [
    (["serve", "--checkpoint", "{ckpt}"], "serve"),
    (["translate", "--checkpoint", "{ckpt}", "--document", "--src-lang", "en", "-i", "{src}"], "document"),
    (["plot", "curves", "{run}", "-o", "{out}/curves.png"], "plot"),
    (["export", "hf", "--checkpoint", "{ckpt}", "-o", "{out}/hf"], "export"),
])
def test_a_verb_without_its_extra_says_which_to_install_in_one_line(argv, extra, tmp_path, toy_corpus, ckpt):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    fill = {"ckpt": str(ckpt), "src": str(toy_corpus / "test.en"), "run": str(run), "out": str(tmp_path)}
    res = core(*(a.format(**fill) for a in argv), cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert f"aiayn[{extra}]" in line and "Traceback" not in res.stderr, res.stderr[-2000:]
