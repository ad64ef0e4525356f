"""fp16 training with dynamic loss scaling (training/scaling.py): the scale, skipped updates, the
divergence guard, `auto` on a GPU without bf16, and a SIGKILL-resume of an fp16 run across processes."""

import subprocess

import pytest
import torch
from conftest import STEPS, TINY, aiayn, tiny_config
from test_resume import final_bytes, kill_after_step_15

from aiayn.device import TRAIN_PRECISIONS, resolve_precision
from aiayn.training.scaling import Diverged, LossScaler
from aiayn.training.step import train_step

CPU = torch.device("cpu")


def tiny_step(cfg, scaler, batch, loss_factor: float = 1.0):
    from aiayn.models.build import build_model
    from aiayn.training.optim import make_optimizer

    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = make_optimizer(model, cfg.train)
    before = [p.detach().clone() for p in model.parameters()]
    train_step(model, opt, [(batch, loss_factor)], batch.n_tokens, cfg, 1e-3, 1, CPU, scaler)
    return model, before


def a_batch():
    from aiayn.data.batches import Batch

    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 50, (3, 6), generator=g), torch.randint(4, 50, (3, 5), generator=g)
    return Batch(src, torch.cat([torch.ones(3, 1, dtype=torch.long), tgt[:, :-1]], 1), tgt, 15)


def config():
    cfg = tiny_config(precision="fp16")
    cfg.model.vocab_size = 50
    return cfg


def test_a_clean_fp16_update_is_applied_and_the_scale_kept():
    scaler = LossScaler(CPU, "fp16")
    model, before = tiny_step(config(), scaler, a_batch())
    assert scaler.scaler.get_scale() == 2.0 ** 16 and scaler.skipped == 0
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_an_overflowing_update_is_skipped_and_the_scale_halved():
    scaler = LossScaler(CPU, "fp16")
    model, before = tiny_step(config(), scaler, a_batch(), loss_factor=float("inf"))  # every gradient inf/NaN
    assert scaler.skipped == 1 and scaler.scaler.get_scale() == 2.0 ** 15
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # Adam never stepped


def test_a_collapsed_scale_ends_the_run_in_one_line():
    scaler = LossScaler(CPU, "fp16", init_scale=2.0, min_scale=1.5, check_every=1)
    with pytest.raises(Diverged, match="fp16 training diverged: the loss scale fell to 1"):
        tiny_step(config(), scaler, a_batch(), loss_factor=float("inf"))


def test_other_precisions_never_scale_and_save_no_state():
    scaler = LossScaler(CPU, "bf16")
    assert not scaler.enabled and scaler.state_dict() == {} and scaler.scale(torch.tensor(3.0)) == 3.0


def test_scaler_state_round_trips():
    a = LossScaler(CPU, "fp16", init_scale=1024.0)
    a.skipped = 3
    b = LossScaler(CPU, "fp16")
    b.load_state_dict(a.state_dict())
    assert b.skipped == 3 and b.scaler.get_scale() == 1024.0


def test_auto_picks_fp16_on_a_gpu_without_bf16(monkeypatch):
    gpu = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert resolve_precision("auto", gpu, choices=TRAIN_PRECISIONS) == (
        "fp16", "auto: this GPU has no native bf16 (before Ampere); fp16 with dynamic loss scaling")
    assert resolve_precision("auto", gpu)[0] == "fp32"  # decoding has no fp16 path: fp32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_precision("auto", gpu, choices=TRAIN_PRECISIONS)[0] == "bf16"


@pytest.mark.slow
def test_fp16_run_resumes_bit_identically_after_sigkill(toy_prepared, tmp_path):
    fp16 = ("--train.precision", "fp16")
    straight, run = tmp_path / "straight", tmp_path / "run"
    subprocess.run(aiayn("train", "--data", str(toy_prepared), "--run-dir", str(straight), *TINY, *fp16),
                   check=True, capture_output=True, timeout=180)
    state = torch.load(straight / f"checkpoints/step-{STEPS:08d}.state.pt", weights_only=True)
    assert state["scaler"]["scale"] > 0 and "skipped" in state["scaler"]
    kill_after_step_15(aiayn("train", "--data", str(toy_prepared), "--run-dir", str(run), *TINY, *fp16), run)
    res = subprocess.run(aiayn("train", "--resume", str(run)), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    assert final_bytes(run) == final_bytes(straight)
