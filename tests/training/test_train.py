"""Training: exact resume, averaging, DDP equivalence, atomic and safe checkpoints."""

import json
import os
import socket
import zipfile

import pytest
import torch
import torch.multiprocessing as mp
import yaml
from conftest import tiny_config

from aiayn import checkpoint
from aiayn.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, read_weights
from aiayn.cli import main
from aiayn.data.batches import TokenData, collate, make_batches
from aiayn.files import FileError, atomic_write
from aiayn.models.transformer import Transformer
from aiayn.training.optim import make_optimizer
from aiayn.training.processes import cpu_threads
from aiayn.training.session import train
from aiayn.training.step import train_step


def weights(path):
    return read_weights(path)[0]


def test_resume_gives_identical_parameters(toy_prepared, tmp_path):
    # dropout on, so the restored RNG state matters; 11 steps cross an epoch boundary.
    def cfg(steps):
        c = tiny_config(max_steps=steps)
        c.data.max_tokens = 800  # about 8 updates per epoch
        return c

    train(cfg(11), toy_prepared, tmp_path / "straight")
    train(cfg(4), toy_prepared, tmp_path / "broken")
    state = train(None, None, tmp_path / "broken", resume=True, overrides={"train.max_steps": "11"})
    assert state["step"] == 11 and state["epoch"] >= 1
    a = weights(list_checkpoints(tmp_path / "straight")[-1])
    b = weights(list_checkpoints(tmp_path / "broken")[-1])
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(x)["step"] for x in (tmp_path / "broken/metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(x)]
    assert steps == [5, 10]  # logging picked up where it left off


def test_training_lowers_validation_loss(toy_prepared, tmp_path):
    train(tiny_config(max_steps=60, valid_every=30, lr_scale=0.5), toy_prepared, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    valid = [r["valid_loss"] for r in rows if "valid_loss" in r]
    assert len(valid) == 2 and valid[-1] < valid[0] - 0.5
    assert any("tgt_tok_s" in r for r in rows)
    assert (tmp_path / "run/train.log").read_text().count("validation step") == 2
    assert "; kernels: CPU vector unit" in (tmp_path / "run/train.log").read_text()  # the path taken, named
    assert (tmp_path / "run/checkpoints/best.safetensors").exists()


def test_tokens_per_second_counts_training_time_only(toy_prepared, tmp_path, monkeypatch):
    """On a clock that moves 1 s an update and 100 s a validation, 10 updates logged at step 10
    (validated at step 5) ran 10 s: target tokens/s is the window's tokens over 10 s."""
    import time

    import aiayn.training.trainer as trainer

    clock = [0.0]
    real_step, real_validate = trainer.train_step, trainer.validate

    def step(*a, **k):
        clock[0] += 1.0
        return real_step(*a, **k)

    def validate(*a, **k):
        clock[0] += 100.0
        return real_validate(*a, **k)

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(trainer, "train_step", step)
    monkeypatch.setattr(trainer, "validate", validate)
    train(tiny_config(max_steps=10, valid_every=5, log_every=10), toy_prepared, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    (log_row,) = [r for r in rows if "loss" in r]
    assert log_row["tgt_tok_s"] == pytest.approx(log_row["tgt_tokens_per_update"] * 10 / 10.0)


def test_a_saved_loss_window_reopens_only_for_as_many_ranks_as_saved_it():
    from aiayn.training.state import LossWindow

    saved = {"step": 12, "ranks": [[4.0, 3.0, 300, 2.0], [5.0, 3.5, 300, 2.5]]}
    w = LossWindow()
    w.restore(saved, rank=1, world=2, step=15)
    loss, nll, tokens, seconds = w.sums()
    assert (loss, nll, tokens, w.step) == (5.0, 3.5, 300, 12) and seconds >= 2.5
    w.restore(saved, rank=0, world=1, step=15)  # another world: its sums are not this rank's
    assert w.sums()[:3] == [0.0, 0.0, 0] and w.step == 15
    w.restore(None, rank=0, world=1, step=15)  # a checkpoint from before windows were saved
    assert w.sums()[:3] == [0.0, 0.0, 0] and w.step == 15


def test_keep_last_and_average_matches_hand_average(toy_prepared, tmp_path, capsys):
    train(tiny_config(max_steps=12, save_every=3, keep_last=3), toy_prepared, tmp_path / "run")
    paths = list_checkpoints(tmp_path / "run")
    assert [p.name for p in paths] == [f"step-{s:08d}.safetensors" for s in (6, 9, 12)]
    out = tmp_path / "avg.safetensors"
    assert main(["average", str(tmp_path / "run"), "--last", "2", "-o", str(out)]) == 0
    w9, w12, avg = weights(paths[1]), weights(paths[2]), weights(out)
    for k in avg:
        torch.testing.assert_close(avg[k], (w9[k] + w12[k]) / 2, atol=1e-7, rtol=0)
    model, cfg, tok, step = load_checkpoint(out)
    assert step == 12 and cfg.model.d_model == 32 and len(tok) == cfg.model.vocab_size


def test_new_run_refuses_to_overwrite(toy_prepared, tmp_path, capsys):
    train(tiny_config(max_steps=1), toy_prepared, tmp_path / "run")
    assert main(["train", "--data", str(toy_prepared), "--run", str(tmp_path / "run")]) == 2
    assert "--resume" in capsys.readouterr().err


def test_bad_checkpoints_get_clear_errors(tmp_path, capsys):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(os.urandom(300))
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        load_checkpoint(bad)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, tmp_path / "foreign.safetensors")
    with pytest.raises(CheckpointError, match="not an aiayn checkpoint"):
        load_checkpoint(tmp_path / "foreign.safetensors")
    (tmp_path / "in.txt").write_text("hello\n")
    assert main(["translate", "--checkpoint", str(bad), "--input", str(tmp_path / "in.txt")]) == 2
    assert "bad.safetensors" in capsys.readouterr().err
    state = tmp_path / "x.state.pt"
    state.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt training state"):
        checkpoint.load_state(state)


def test_a_state_that_unpacks_past_its_bound_is_refused_before_torch_reads_it(tmp_path):
    """A training state is a zip; torch allocates each record's declared size. A 200 MiB record deflated
    to ~200 KB beside a 1 KB checkpoint is refused from the zip's directory; a real state still loads."""
    real = tmp_path / "real.state.pt"
    torch.save({"optimizer": {"m": torch.ones(1000)}, "step": 3}, real)
    (tmp_path / "real.safetensors").write_bytes(b"x" * 1024)
    assert checkpoint.load_state(real)["step"] == 3
    bomb = tmp_path / "bomb.state.pt"
    with zipfile.ZipFile(real) as z, zipfile.ZipFile(bomb, "w") as out:
        for info in z.infolist():
            out.writestr(info.filename, z.read(info.filename))
        out.writestr("real/data/99", bytes(200 << 20), compress_type=zipfile.ZIP_DEFLATED)
    (tmp_path / "bomb.safetensors").write_bytes(b"x" * 1024)
    assert bomb.stat().st_size < 2 << 20 and checkpoint.state_bound(bomb) == 8 * 1024 + (64 << 20)
    with pytest.raises(CheckpointError, match=r"bomb.state.pt: corrupt training state: its records unpack to 209,"):
        checkpoint.load_state(bomb)


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "ckpt.bin"
    atomic_write(target, b"old")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(FileError, match="ckpt.bin: cannot write .disk full.; the file there before"):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.bin"]


def test_resume_from_missing_run_is_an_error(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "none")]) == 2
    assert "not an aiayn run directory" in capsys.readouterr().err


def test_shard_gives_every_rank_the_same_number_of_passes():
    import numpy as np

    from aiayn.training.step import shard

    group = [np.array([i]) for i in range(3)]
    parts = [shard(group, r, 2) for r in range(2)]
    assert [len(p) for p in parts] == [2, 2]
    real = sorted(int(b[0]) for p in parts for b, w in p if w == 1.0)
    assert real == [0, 1, 2]  # each batch once, with weight 1
    assert [w for _, w in parts[1]] == [1.0, 0.0]
    assert shard(group[:1], 1, 2) == [(group[0], 0.0)]  # a rank with nothing still takes a pass


# -- DDP -------------------------------------------------------------------------------------
def _setup_model(data_dir):
    cfg = tiny_config()
    cfg.model.p_drop = 0.0
    cfg.model.vocab_size = 60
    data = TokenData(data_dir, "train")
    batches = make_batches(data.src_lens, data.tgt_lens, 160, 1, 0)[:2]
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    return cfg, model, make_optimizer(model, cfg.train), [collate(data, b) for b in batches]


def _ddp_worker(rank, world, port, data_dir, out):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg, model, opt, batches = _setup_model(data_dir)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    total = sum(b.n_tokens for b in batches)
    train_step(ddp, opt, [(batches[rank], 1.0)], total, cfg, 1e-3, world, torch.device("cpu"))
    if rank == 0:
        torch.save({k: v.detach() for k, v in model.named_parameters()}, out)
    dist.destroy_process_group()


def test_two_rank_ddp_update_equals_one_rank_on_both_shards(toy_prepared, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(2, port, str(toy_prepared), str(out)), nprocs=2, join=True)
    cfg, model, opt, batches = _setup_model(toy_prepared)
    total = sum(b.n_tokens for b in batches)
    train_step(model, opt, [(b, 1.0) for b in batches], total, cfg, 1e-3, 1, torch.device("cpu"))
    ddp = torch.load(out, weights_only=True)
    changed = 0
    for k, v in model.named_parameters():
        torch.testing.assert_close(ddp[k], v.detach(), atol=2e-6, rtol=1e-5)
        changed += int(not torch.equal(v.detach(), _setup_model(toy_prepared)[1].state_dict()[k]))
    assert changed > 10  # the update really moved the weights


@pytest.mark.slow
def test_torchrun_two_processes_train_and_resume(toy_prepared, tmp_path):
    import subprocess
    import sys

    def free_port() -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return str(s.getsockname()[1])

    def base() -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", free_port(), "-m", "aiayn", "train"]

    run = tmp_path / "run"
    first = subprocess.run(base() + ["--data", str(toy_prepared), "--run-dir", str(run), "--model.d_model", "32",
                                   "--model.d_ff", "64", "--model.h", "4", "--model.N", "1", "--train.max_steps", "6",
                                   "--data.max_tokens", "400", "--train.threads", "1", "--train.valid_bleu_sentences",
                                   "0", "--train.tokens_per_update", "0"], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr[-8000:]  # the cause comes before torchrun's own 2,500-character report
    assert first.stderr.count("finished at step 6") == 1  # only rank 0 logs
    second = subprocess.run(base() + ["--resume", str(run), "--train.max_steps", "9"], capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stderr[-8000:]
    assert "resumed from step-00000006" in second.stderr
    assert list_checkpoints(run)[-1].name == "step-00000009.safetensors"


# -- §5.1 tokens per update, §6.1 checkpoints for averaging --------------------------------------------
def test_tokens_per_update_makes_updates_of_about_that_many_target_tokens(toy_prepared, tmp_path):
    cfg = tiny_config(max_epochs=1, max_steps=10**6, log_every=1)
    cfg.train.tokens_per_update = 1200
    train(cfg, toy_prepared, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    sizes = [r["tgt_tokens_per_update"] for r in rows if "tgt_tokens_per_update" in r]
    data = TokenData(toy_prepared, "train")
    batches = make_batches(data.src_lens, data.tgt_lens, 400, 1, 0)
    per_batch = data.tgt_lens.sum() / len(batches)
    assert sum(sizes) == data.tgt_lens.sum()  # one epoch, every target token once
    full = sizes[:-1]  # the epoch's last update takes what is left
    assert abs(sum(full) / len(full) - 1200) <= per_batch / 2 + 1
    session = json.loads((tmp_path / "run/run.json").read_text())["sessions"][0]
    assert session["tokens_per_update"] == 1200 and len(sizes) == -(-len(batches) // session["batches_per_update"])


def test_tokens_per_update_conflicts_with_update_freq(capsys, toy_prepared, tmp_path):
    assert main(["train", "--data", str(toy_prepared), "--run-dir", str(tmp_path / "r"), "--train.update_freq",
                 "2"]) == 2
    err = capsys.readouterr().err
    assert "train.update_freq (2) and train.tokens_per_update (25000)" in err and "tokens_per_update 0" in err


def test_best_checkpoint_stays_out_of_the_rotation_and_average_defaults_to_keep_last(toy_prepared, tmp_path):
    # validation every 2 updates (mostly improving), interval checkpoints every 5, keep 3
    cfg = tiny_config(max_steps=20, save_every=5, keep_last=3, valid_every=2)
    train(cfg, toy_prepared, tmp_path / "run")
    paths = list_checkpoints(tmp_path / "run")
    assert [p.name for p in paths] == [f"step-{s:08d}.safetensors" for s in (10, 15, 20)]
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    valid = [(r["step"], r["valid_loss"]) for r in rows if "valid_loss" in r]
    best_step = min(valid, key=lambda x: x[1])[0]
    assert read_weights(tmp_path / "run/checkpoints/best.safetensors")[1]["step"] == str(best_step)
    out = tmp_path / "avg.safetensors"
    assert main(["average", str(tmp_path / "run"), "-o", str(out)]) == 0  # no --last: the run's keep_last, 3
    ws = [weights(p) for p in paths]
    avg = weights(out)
    for k in avg:
        torch.testing.assert_close(avg[k], (ws[0][k] + ws[1][k] + ws[2][k]) / 3, atol=1e-6, rtol=0)


def test_presets_keep_what_section_6_1_averages():
    from aiayn.overrides import preset

    assert preset("base").train.keep_last == 5 and preset("big").train.keep_last == 20
    assert preset("base").train.tokens_per_update == preset("big").train.tokens_per_update == 25_000
    assert preset("base").train.save_every_minutes == 10.0


def test_a_run_from_before_tokens_per_update_resumes_with_its_update_freq(toy_prepared, tmp_path):
    import yaml

    run = tmp_path / "run"
    train(tiny_config(max_steps=3, save_every=3), toy_prepared, run)
    raw = yaml.safe_load((run / "config.yaml").read_text())
    del raw["train"]["tokens_per_update"]  # as an older aiayn wrote it
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    assert main(["train", "--resume", str(run), "--train.max_steps", "5"]) == 0
    last = json.loads((run / "run.json").read_text())["sessions"][-1]
    assert last["tokens_per_update"] == 0 and last["batches_per_update"] == 1
    assert list_checkpoints(run)[-1].name == "step-00000005.safetensors"


def _cpu(monkeypatch, flags: set[str]) -> None:
    """Make this process see a CPU with `flags` (device.cpu_flags, and the kernels line of the log)."""
    from aiayn import device
    from aiayn.training import processes as runs

    monkeypatch.setattr(device, "cpu_flags", lambda *a, **k: set(flags))
    monkeypatch.setattr(runs, "native_bf16", lambda: device.native_bf16(flags))


def test_auto_precision_is_chosen_once_by_the_cpu_and_kept_on_resume(toy_prepared, tmp_path, monkeypatch):
    """`train.precision auto` (every preset's): fp32 on an AVX2 CPU, written to config.yaml and run.json
    with the reason; resumed on an AVX-512 BF16 CPU, the run keeps fp32 (a resume continues bit for bit)."""
    _cpu(monkeypatch, {"avx2", "fma"})
    run = tmp_path / "run"
    train(tiny_config(max_steps=2, save_every=2, precision="auto"), toy_prepared, run)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["precision"] == "fp32"
    first = json.loads((run / "run.json").read_text())["sessions"][-1]
    assert first["precision"] == "fp32" and first["precision_why"].startswith("auto: the CPU has no native bf16")
    assert ", AVX2" in first["cpu"]
    _cpu(monkeypatch, {"avx2", "avx512f", "avx512_bf16"})
    assert main(["train", "--resume", str(run), "--train.max_steps", "3"]) == 0
    last = json.loads((run / "run.json").read_text())["sessions"][-1]
    assert last["precision"] == "fp32" and last["precision_why"] == "kept from the run's start"
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["precision"] == "fp32"
    fresh = tmp_path / "fresh"
    train(tiny_config(max_steps=1, precision="auto"), toy_prepared, fresh)
    assert yaml.safe_load((fresh / "config.yaml").read_text())["train"]["precision"] == "bf16"
    assert "(auto: the CPU computes bf16 natively (avx512_bf16))" in (fresh / "train.log").read_text()


def test_bf16_without_native_bf16_is_named_in_the_log(toy_prepared, tmp_path, monkeypatch):
    """The log's kernels line reads the CPU's flags; without AVX-512 BF16 or AMX, bf16 asked for warns."""
    _cpu(monkeypatch, {"avx2"})
    train(tiny_config(max_steps=2, precision="bf16"), toy_prepared, tmp_path / "run")
    text = (tmp_path / "run/train.log").read_text()
    assert "native bf16 no; products in bf16 through oneDNN" in text
    assert "WARNING training in bf16: asked for; this CPU has no native bf16" in text


def test_leave_closes_only_the_group_that_setup_joined():
    """A finished run leaves the process group it joined (left to interpreter shutdown, gloo can
    abort a rank), and leaves alone a group its caller made."""
    import torch.distributed as dist

    from aiayn.training.processes import Dist, leave
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        leave(Dist(owns_group=False))  # the caller's group
        assert dist.is_initialized()
        leave(Dist(owns_group=True))
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_cpu_threads_follow_the_config_then_omp_num_threads_then_the_cores(monkeypatch):
    cores = os.cpu_count() or 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads(5, 1) == 5  # train.threads wins
    assert cpu_threads(0, 1) == 3  # a user's (or a scheduler's) OpenMP setting, as PyTorch reads it
    assert cpu_threads(0, 2) == max(1, cores // 2)  # not under torchrun's ranks: it sets 1 for each of them
    for bad in ("", "0", "two", "-1"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        assert cpu_threads(0, 1) == cores
