"""Fine-tuning a pretrained model (`prepare --tokenizer-from`, `train --init-from`): it starts from the
parent's weights, in the parent's vocabulary, learns the new domain, and resumes bit for bit after SIGKILL."""

import json
import subprocess

import pytest
import torch
import torch.nn.functional as F
from conftest import STEPS, TINY, aiayn
from test_resume import final_bytes, kill_after_step_15, resume

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.data.tokenizer import BOS, EOS
from aiayn.files import digest

FINE = ("--train.schedule", "constant", "--train.peak_lr", "2e-3", "--train.warmup_steps", "5", "--train.lr_scale", "1")


def domain_nll(ckpt, src: list[str], tgt: list[str]) -> float:
    """Teacher-forced NLL per target token, computed here from the model's logits."""
    model, _, tok, _ = load_checkpoint(ckpt)
    total = n = 0.0
    with torch.no_grad():
        for s, t in zip(tok.encode(src), tok.encode_target(tgt)):
            logits = model(torch.tensor([s + [EOS]]), torch.tensor([[BOS] + t]))[0]
            total += float(F.cross_entropy(logits, torch.tensor(t + [EOS]), reduction="sum"))
            n += len(t) + 1
    return total / n


@pytest.fixture(scope="module")
def parent(toy_prepared, tmp_path_factory):
    """A model trained by aiayn, exported to Hugging Face and imported back (a pretrained Marian
    model as `aiayn import hf` makes one), and a domain split in halves: train and valid."""
    d = tmp_path_factory.mktemp("finetune")
    subprocess.run(aiayn("train", "--data", str(toy_prepared), "--run-dir", str(d / "run"), *TINY), check=True,
                   capture_output=True, timeout=180)
    for args in (("export", "hf", "--checkpoint", str(list_checkpoints(d / "run")[-1]), "-o", str(d / "hf")),
                 ("import", "hf", str(d / "hf"), "-o", str(d / "parent.safetensors"))):
        subprocess.run(aiayn(*args), check=True, capture_output=True, timeout=180)
    lines = {lang: (toy_prepared / f"test.{lang}.txt").read_text().splitlines() for lang in ("en", "de")}
    half = len(lines["en"]) // 2
    for name, part in (("dtrain", slice(0, half)), ("dvalid", slice(half, None))):
        for lang in ("en", "de"):
            (d / f"{name}.{lang}").write_text("\n".join(lines[lang][part]) + "\n")
    prep = d / "prep"
    subprocess.run(aiayn("prepare", "--src", "en", "--tgt", "de", "--train", f"{d}/dtrain.en,{d}/dtrain.de",
                         "--valid", f"{d}/dvalid.en,{d}/dvalid.de", "--tokenizer-from", str(d / "parent.safetensors"),
                         "-o", str(prep)), check=True, capture_output=True, timeout=180)
    return d, prep


@pytest.mark.slow
def test_finetuning_starts_from_the_parent_learns_the_domain_and_resumes_bit_identically(parent, tmp_path):
    d, prep = parent
    assert (prep / "spm.model").read_bytes() == load_checkpoint(d / "parent.safetensors")[2].proto  # no new vocabulary
    cmd = aiayn("train", "--data", str(prep), "--run-dir", str(tmp_path / "straight"), "--init-from",
                str(d / "parent.safetensors"), *TINY, *FINE)
    subprocess.run(cmd, check=True, capture_output=True, timeout=180)
    src, tgt = (d / "dvalid.en").read_text().splitlines(), (d / "dvalid.de").read_text().splitlines()
    before = domain_nll(d / "parent.safetensors", src, tgt)
    after = domain_nll(list_checkpoints(tmp_path / "straight")[-1], src, tgt)
    first = domain_nll(list_checkpoints(tmp_path / "straight")[0], src, tgt)  # after 5 updates of warm-up
    assert after < before and abs(first - before) < abs(first - 6.0)  # not a fresh model's ~ln(V) loss
    run_json = json.loads((tmp_path / "straight" / "run.json").read_text())
    assert run_json["parent"]["sha256"] == digest(d / "parent.safetensors")
    run = tmp_path / "killed"
    kill_after_step_15([*cmd[:cmd.index("--run-dir") + 1], str(run), *cmd[cmd.index("--run-dir") + 2:]], run)
    assert "resumed from step-000000" in resume(run).stderr
    assert final_bytes(run) == final_bytes(tmp_path / "straight")
    assert len(list_checkpoints(run)) and STEPS == 40


def test_finetuning_on_data_in_another_vocabulary_is_refused_in_one_line(parent, toy_prepared, tmp_path):
    """The parent's vocabulary is not extended: data prepared without --tokenizer-from (here the very
    corpus it was trained on, whose SentencePiece model the imported one splits in two) is refused."""
    d, _ = parent
    res = subprocess.run(aiayn("train", "--data", str(toy_prepared), "--run-dir", str(tmp_path / "run"),
                               "--init-from", str(d / "parent.safetensors"), *TINY), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "its vocabulary is not the checkpoint's" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("what,message", [("missing", "no such checkpoint"), ("text", "unreadable metadata")])
def test_tokenizer_from_a_file_that_is_no_checkpoint_gets_one_line(toy_corpus, tmp_path, capsys, what, message):
    from aiayn.cli import main

    ckpt = tmp_path / "x.safetensors"
    if what == "text":
        ckpt.write_text("not a checkpoint")
    assert main(["prepare", "--data-dir", str(toy_corpus), "--src", "en", "--tgt", "de", "--tokenizer-from",
                 str(ckpt), "-o", str(tmp_path / "prep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not (tmp_path / "prep").exists()
