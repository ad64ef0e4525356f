"""Resume across real process boundaries: SIGKILL, SIGTERM, changed batching, DDP ranks.

Every run here is a separate `python -m aiayn train` process (or torchrun, or spawned ranks), so
what a restart resets — the global RNG, module caches, signal handlers — is really reset. The
reference is an uninterrupted run in its own process; "identical" means the same bytes.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import STEPS, TINY, aiayn, tiny_config, tiny_treebank

from aiayn.checkpoint import list_checkpoints, read_weights
from aiayn.data.batches import TokenData
from aiayn.training.step import epoch_batches


def start_training(prep: Path, run: Path, extra: tuple[str, ...] = ()) -> list[str]:
    return aiayn("train", "--data", str(prep), "--run-dir", str(run), *TINY, *extra)


def final_bytes(run: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    """Every tensor's raw bytes and the metadata of the run's last checkpoint. (Not the file's
    bytes: safetensors writes its header's metadata map in an order that varies by process.)"""
    last = list_checkpoints(run)[-1]
    assert last.name == f"step-{STEPS:08d}.safetensors", last
    tensors, meta = read_weights(last)
    return {k: v.numpy().tobytes() for k, v in tensors.items()}, meta


def training_log(run: Path) -> list[dict]:
    """The run's training-loss records without their clock readings (log_every 4 does not divide
    save_every 5: a resume lands inside a logging window)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tgt_tok_s", "elapsed_s")} for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def straight_run(toy_prepared, tmp_path_factory) -> Path:
    """An uninterrupted run, in its own process."""
    run = tmp_path_factory.mktemp("straight") / "run"
    subprocess.run(start_training(toy_prepared, run), check=True, capture_output=True, timeout=180)
    return run


@pytest.fixture(scope="module")
def straight(straight_run) -> tuple[dict[str, bytes], dict[str, str]]:
    """The final checkpoint of the uninterrupted run."""
    return final_bytes(straight_run)


def resume(run: Path, *extra: str) -> subprocess.CompletedProcess:
    res = subprocess.run(aiayn("train", "--resume", str(run), *extra), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def kill_after_step_15(cmd: list[str], run: Path) -> None:
    """Start training in a new process and SIGKILL it once step 15's checkpoint is on disk."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run / "checkpoints/step-00000015.state.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "training ended before the kill"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_sigkill_then_resume_in_a_new_process_is_bit_identical(toy_prepared, tmp_path, straight, straight_run):
    run = tmp_path / "run"
    kill_after_step_15(start_training(toy_prepared, run), run)
    res = resume(run)
    assert "resumed from step-000000" in res.stderr
    assert final_bytes(run) == straight
    start = int(re.search(r"resumed from step-(\d+)", res.stderr).group(1))  # the bar counts on from there
    assert f"| {start}/{STEPS} [" in res.stderr.split("resumed from")[1], res.stderr[-1500:]
    newest = sorted((run / "checkpoints").glob("step-*.safetensors"))[-1]  # `last`: the newest, after the resume too
    assert (run / "checkpoints" / "last.safetensors").read_bytes() == newest.read_bytes()
    # Killed-and-replayed rows appear once, and the log at step 16 averages updates 13-16 as the
    # uninterrupted run's does, though 13-15 ran in the killed process.
    assert training_log(run) == training_log(straight_run)


@pytest.mark.slow
@pytest.mark.parametrize("valid_every", ["0", "8"])
def test_resuming_a_finished_run_changes_nothing(toy_prepared, tmp_path, straight_run, valid_every):
    """The last validation came after the last checkpoint (valid_every 0: made at the end) or before it
    (every 8 updates, so at 40): either way a resume in a new process neither repeats nor loses it, and
    rewrites no checkpoint."""
    run = tmp_path / "run"
    if valid_every == "0":
        shutil.copytree(straight_run, run)
    else:
        subprocess.run(start_training(toy_prepared, run, ("--train.valid_every", valid_every)), check=True,
                       capture_output=True, timeout=180)
    files = sorted(p for p in (run / "checkpoints").iterdir() if p.name != "best.safetensors")
    before, log = [p.read_bytes() for p in files], (run / "metrics.jsonl").read_text()
    assert sum('"valid_loss"' in row and '"step": 40,' in row for row in log.splitlines()) == 1
    best = read_weights(run / "checkpoints/best.safetensors")[0]
    res = resume(run)
    assert f"finished at step {STEPS}" in res.stderr
    assert (run / "metrics.jsonl").read_text() == log
    assert [p.read_bytes() for p in files] == before
    again = read_weights(run / "checkpoints/best.safetensors")[0]
    assert again.keys() == best.keys() and all(torch.equal(again[k], best[k]) for k in best)


SIGTERM_AFTER_STEP = textwrap.dedent("""
    import os, signal, sys
    import torch
    from aiayn.cli import main

    real_step, calls = torch.optim.Adam.step, [0]

    def step(self, *a, **k):
        out = real_step(self, *a, **k)
        calls[0] += 1
        if calls[0] == 7:  # the signal lands after the weights moved, before the step is counted
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    torch.optim.Adam.step = step
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_sigterm_checkpoints_at_the_update_boundary(toy_prepared, tmp_path, straight, straight_run):
    run = tmp_path / "run"
    cmd = start_training(toy_prepared, run)
    res = subprocess.run([sys.executable, "-c", SIGTERM_AFTER_STEP, *cmd[3:]], capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 130, res.stderr[-2000:]
    assert "stopped by a signal at step 7" in res.stderr
    assert list_checkpoints(run)[-1].name == "step-00000007.safetensors"  # the update was completed
    resume(run)
    assert final_bytes(run) == straight
    assert training_log(run) == training_log(straight_run)


@pytest.mark.slow
def test_resume_with_another_update_freq_continues_at_the_same_batch(toy_prepared, tmp_path):
    run = tmp_path / "run"
    subprocess.run(start_training(toy_prepared, run, ("--train.max_steps", "3")), check=True, capture_output=True,
                   timeout=180)
    cfg = tiny_config()
    cfg.data.max_tokens = 400
    n = len(epoch_batches(TokenData(toy_prepared, "train"), cfg, 0))
    res = resume(run, "--train.update_freq", "2", "--train.max_epochs", "1", "--train.max_steps", "1000")
    assert "batches per update were 1" in res.stderr
    # 3 batches done; the other n - 3 in updates of 2: no batch skipped or repeated.
    assert list_checkpoints(run)[-1].name == f"step-{3 + (n - 2) // 2:08d}.safetensors"


@pytest.mark.slow
def test_resume_with_other_max_tokens_is_refused_or_forced(toy_prepared, tmp_path):
    run = tmp_path / "run"
    subprocess.run(start_training(toy_prepared, run, ("--train.max_steps", "3")), check=True, capture_output=True,
                   timeout=180)
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    res = subprocess.run(aiayn("train", "--resume", str(run), "--data.max_tokens", "800"), capture_output=True,
                         text=True, timeout=180)
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "data.max_tokens was 400 and is now 800" in err[0] and "--force-batching" in err[0]
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before
    res = resume(run, "--data.max_tokens", "800", "--force-batching", "--train.max_steps", "4")
    assert "continuing from the start of epoch 1" in res.stderr


@pytest.mark.slow
def test_resume_on_data_of_another_vocabulary_is_refused(toy_corpus, toy_prepared, tmp_path):
    """Same number of pairs and of pieces, other pieces: the run's embeddings would read other words."""
    from aiayn.data.prepare import prepare

    for path in toy_corpus.iterdir():  # the same corpus in capitals: other pieces, as many
        (tmp_path / path.name).write_text(path.read_text().upper())
    other = tmp_path / "other"
    prepare({n: (tmp_path / f"{n}.en", tmp_path / f"{n}.de") for n in ("train", "valid")}, other, "en", "de",
            vocab_size=60, max_len=32)
    assert (other / "spm.model").read_bytes() != (toy_prepared / "spm.model").read_bytes()
    run = tmp_path / "run"
    subprocess.run(start_training(toy_prepared, run, ("--train.max_steps", "2")), check=True, capture_output=True,
                   timeout=180)
    kept = [*(run / "checkpoints").iterdir(), run / "config.yaml", run / "run.json", run / "metrics.jsonl"]
    before = {p.name: p.read_bytes() for p in kept}
    for force in ((), ("--force-batching",)):
        res = subprocess.run(aiayn("train", "--resume", str(run), "--data", str(other), *force), capture_output=True,
                             text=True, timeout=180)
        err = res.stderr.strip().splitlines()
        assert res.returncode == 2 and "vocabulary is not the checkpoint's" in err[-1] and str(other) in err[-1], \
            res.stderr[-1500:]
    assert {p.name: p.read_bytes() for p in [*(run / "checkpoints").iterdir(), *kept[-3:]]} == before


# -- DDP: clocks that disagree, one dropout stream per rank --------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clock_worker(rank: int, world: int, port: int, prep: str, run: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    if rank == 1:  # this rank's clock runs 20 times too fast
        import time as _time

        real, t0 = _time.perf_counter, _time.perf_counter()
        _time.perf_counter = lambda: t0 + 20 * (real() - t0)
    from aiayn.training.session import train

    cfg = tiny_config(max_steps=10**6, max_minutes=0.03)
    state = train(cfg, Path(prep), Path(run))
    import torch.distributed as dist

    left = not dist.is_initialized()  # train() leaves the process group it joined
    Path(out, f"rank{rank}.json").write_text(json.dumps({"step": state["step"], "elapsed": state["elapsed"],
                                                         "left_group": left}))


@pytest.mark.slow
def test_ddp_ranks_with_disagreeing_clocks_stop_together(toy_prepared, tmp_path):
    args = (2, free_port(), str(toy_prepared), str(tmp_path / "run"), str(tmp_path))
    ctx = mp.start_processes(_clock_worker, args=args, nprocs=2, join=False, start_method="spawn")
    deadline = time.time() + 120
    try:
        while not ctx.join(timeout=1):
            assert time.time() < deadline, "the ranks hung: one left the loop while the other trained on"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0 == r1  # same last step, and rank 0's clock for both
    assert r0["left_group"]
    assert r0["elapsed"] >= 0.03 * 60 and r0["step"] > 5


@pytest.mark.slow
def test_torchrun_ranks_have_their_own_dropout_and_resume_exactly(toy_prepared, tmp_path):
    def torchrun(*args: str) -> None:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "-m", "aiayn", "train", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]

    small = TINY[:-1]  # all but the number of steps
    torchrun("--data", str(toy_prepared), "--run-dir", str(tmp_path / "straight"), *small, "12")
    torchrun("--data", str(toy_prepared), "--run-dir", str(tmp_path / "broken"), *small, "5")
    state = torch.load(tmp_path / "broken/checkpoints/step-00000005.state.pt", weights_only=True)
    assert len(state["rng"]) == 2 and not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])
    torchrun("--resume", str(tmp_path / "broken"), "--train.max_steps", "12")
    a = read_weights(list_checkpoints(tmp_path / "straight")[-1])[0]
    b = read_weights(list_checkpoints(tmp_path / "broken")[-1])[0]
    assert list_checkpoints(tmp_path / "broken")[-1].name == "step-00000012.safetensors"
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.long
@pytest.mark.slow
def test_soak_short_form(toy_prepared, tmp_path):
    """tests/robustness/soak_resume.py --short: 3 SIGKILLs (one mid-write), 0 corrupt checkpoints, same final tensors
    and the same training log."""
    script = Path(__file__).resolve().parents[1] / "robustness" / "soak_resume.py"
    res = subprocess.run([sys.executable, str(script), "--short", "--data", str(toy_prepared), "--work",
                          str(tmp_path / "soak")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads(res.stdout[res.stdout.index("{"):res.stdout.rindex("}") + 1])
    # A random kill may land after a short run has already finished; the kill mid-write cannot.
    assert summary["kills_survived"] >= 2 and summary["kills_during_write"] >= 1
    assert summary["corrupt_checkpoints"] == 0 and summary["final_weights_identical"] is True
    assert summary["training_log_identical"] is True and summary["log_records"] >= 300 // 7


@pytest.mark.slow
def test_tokens_per_update_gives_the_same_update_on_one_and_two_ranks(toy_prepared, tmp_path):
    """§5.1: the update's size follows train.tokens_per_update, not the number of ranks: one
    process and two torchrun ranks make the same updates (no dropout, so no RNG in the way)."""
    extra = ("--train.max_steps", "4", "--model.p_drop", "0", "--train.tokens_per_update", "1200",
             "--train.save_every", "4", "--train.log_every", "1")

    def last(run: str) -> dict:
        return read_weights(tmp_path / run / "checkpoints/step-00000004.safetensors")[0]

    one = subprocess.run(start_training(toy_prepared, tmp_path / "one", extra), capture_output=True, text=True,
                         timeout=180)
    assert one.returncode == 0, one.stderr[-2000:]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "aiayn", "train", "--data", str(toy_prepared), "--run-dir",
           str(tmp_path / "two"), *TINY, *extra]
    two = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert two.returncode == 0, two.stderr[-2000:]
    s1, s2 = (json.loads((tmp_path / r / "run.json").read_text())["sessions"][0] for r in ("one", "two"))
    assert (s1["world"], s2["world"]) == (1, 2) and s1["batches_per_update"] == s2["batches_per_update"] > 1
    def losses(run: str) -> list[float]:
        rows = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    other = subprocess.run(start_training(toy_prepared, tmp_path / "other", (*extra, "--train.tokens_per_update",
                                                                              "400")), capture_output=True, timeout=180)
    assert other.returncode == 0
    assert losses("one") == pytest.approx(losses("two"), rel=1e-4) and len(losses("one")) == 4
    # Adam turns rounding-level gradient differences of near-zero entries into whole steps, so the
    # weights are compared as a whole: far closer to each other than to another update size's.
    a, b, c = last("one"), last("two"), last("other")
    gap = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
    other_gap = sum(float(((a[k] - c[k]) ** 2).sum()) for k in a) ** 0.5
    assert gap < 0.05 * other_gap


@pytest.mark.slow
def _sentences_for(seconds: float, spm: Path) -> int:
    """Validation sentences that one process greedily translates in about `seconds` here, timed on an
    untrained model of the run's size (10,000 took about 9 s on a family-26 EPYC, 3x that on a Zen 3)."""
    from conftest import _sentences, random_translator

    tr = random_translator(spm, max_len_b=50)
    src, _ = _sentences(300, 1)
    torch.set_num_threads(1)
    start = time.perf_counter()
    tr.translate(src, beam=1)
    return int(min(10000, max(2000, 300 * seconds / (time.perf_counter() - start))))


def test_a_validation_longer_than_the_collective_timeout_is_shared_by_the_ranks(toy_corpus, toy_prepared, tmp_path):
    """2 gloo ranks, collectives limited to 3 s, a validation that takes one process about 10 s:
    the ranks share it (every world-th batch and sentence), so none waits past the limit (rank 0
    validating alone would leave rank 1 in a collective for 10 s and kill the run). The shared
    result equals the validation of one process."""
    from conftest import _sentences

    from aiayn.checkpoint import load_checkpoint
    from aiayn.data.prepare import prepare
    from aiayn.overrides import load_yaml
    from aiayn.training.step import valid_bleu, validate

    for split, n, seed in (("train", 400, 0), ("valid", _sentences_for(10.0, toy_prepared / "spm.model"), 1)):
        s, t = _sentences(n, seed)
        (tmp_path / f"{split}.en").write_text("".join(x + "\n" for x in s))
        (tmp_path / f"{split}.de").write_text("".join(x + "\n" for x in t))
    prep = tmp_path / "prep"
    prepare({k: (tmp_path / f"{k}.en", tmp_path / f"{k}.de") for k in ("train", "valid")}, prep, "en", "de",
            vocab_size=60, max_len=32)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "aiayn", "train", "--data", str(prep), "--run-dir", str(run),
           *TINY[:-1], "3", "--train.valid_bleu_sentences", "10000", "--decode.max_len_b", "50",
           "--train.dist_timeout_minutes", "0.05"]
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    shared = [r for r in rows if "valid_loss" in r][-1]
    model, cfg, tok, _ = load_checkpoint(list_checkpoints(run)[-1])
    cfg = load_yaml(run / "config.yaml")
    torch.set_num_threads(1)
    start = time.perf_counter()
    alone = validate(model, TokenData(prep, "valid"), cfg, torch.device("cpu"))
    src = (prep / "valid.en.txt").read_text().splitlines()
    ref = (prep / "valid.de.txt").read_text().splitlines()
    alone["valid_bleu"] = valid_bleu(model, tok, src, ref, cfg, torch.device("cpu"))
    one_process = time.perf_counter() - start
    print(f"one process validates in {one_process:.1f} s; the 2-rank run took {time.perf_counter() - t:.1f} s")
    assert one_process > 3 * 2  # the validation is longer than the collective limit, twice over
    assert shared["valid_loss"] == pytest.approx(alone["valid_loss"], rel=1e-6)
    assert shared["valid_bleu"] == pytest.approx(alone["valid_bleu"], abs=1e-9)


@pytest.mark.slow
def test_a_pointer_parser_resumes_bit_identically_after_sigkill(tmp_path):
    """§6.3's parser (words as leaves, model.pointer_input, depth_input and tag_input): SIGKILL, resume in a new
    process, the same final tensors and the parse task and tagger in the metadata as an uninterrupted run."""
    (tmp_path / "tb").mkdir()
    prep = tmp_path / "prep"
    subprocess.run(aiayn("prepare", "--task", "parse", "--treebank", str(tiny_treebank(tmp_path / "tb")), "-o",
                         str(prep), "--preset", "parse", "--data.vocab_size", "60"), check=True, capture_output=True,
                   timeout=180)
    extra = ("--preset", "parse", *TINY, "--train.max_minutes", "0", "--model.depth_input", "true")
    subprocess.run(start_training(prep, tmp_path / "straight", extra), check=True, capture_output=True, timeout=180)
    run = tmp_path / "run"
    kill_after_step_15(start_training(prep, run, extra), run)
    assert "resumed from step-000000" in resume(run).stderr
    (got, meta), (want, _) = final_bytes(run), final_bytes(tmp_path / "straight")
    assert got == want and "pointer_proj.weight" in got and "depth.embed.weight" in got and "tag_embed.weight" in got
    extra = json.loads(meta["extra"])
    assert extra.pop("tagger") == (prep / "tagger.json").read_text()  # the parse preset reads tags (tagger.py)
    assert extra == {"task": "parse", "linearization": "words"}


OLD_PARSER_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "parser-run-d7d636a"
OLD_PARSER_FLAGS = ("--preset", "parse", "--model.d_model", "16", "--model.d_ff", "32", "--model.h", "2",
                    "--model.N", "1", "--model.p_drop", "0.1", "--model.max_positions", "128",
                    "--data.max_tokens", "400",
                    "--train.warmup_steps", "20", "--train.lr_scale", "0.5", "--train.valid_every", "0",
                    "--train.valid_bleu_sentences", "0", "--train.save_every_minutes", "0", "--train.save_every", "5",
                    "--train.log_every", "4", "--train.threads", "1", "--train.tokens_per_update", "0",
                    "--train.max_minutes", "0", "--model.depth_input", "true")


@pytest.mark.slow
def test_a_parser_run_written_before_parser_model_resumes_bit_identically(tmp_path):
    """A run folder of commit d7d636a, when the parser's inputs lived in model.py (tests/fixtures): today's
    code loads its checkpoint as a ParserTransformer and resumes it, and the end equals a run started today
    from scratch, bit for bit: the parameters keep their names, order and initialization, Adam its state.
    Bit for bit where this CPU's kernels reproduce the fixture's first 10 updates (an AVX-512 BF16 CPU made
    them); elsewhere (an AVX2 CPU rounds bf16 products differently) the end is not compared: skipped, saying so."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.parsing.model import ParserTransformer, build_any

    (tmp_path / "tb").mkdir()
    prep = tmp_path / "prep"
    subprocess.run(aiayn("prepare", "--task", "parse", "--treebank", str(tiny_treebank(tmp_path / "tb")), "-o",
                         str(prep), "--preset", "parse", "--data.vocab_size", "60"), check=True, capture_output=True,
                   timeout=180)
    old = OLD_PARSER_RUN / "run/checkpoints/step-00000010.safetensors"
    assert isinstance(load_checkpoint(old, build=build_any)[0], ParserTransformer)
    run = tmp_path / "run"
    shutil.copytree(OLD_PARSER_RUN / "run", run)
    assert "resumed from step-00000010" in resume(run, "--data", str(prep), "--train.max_steps", "20",
                                                  "--train.precision", "bf16").stderr
    subprocess.run(aiayn("train", "--data", str(prep), "--run-dir", str(tmp_path / "today"), *OLD_PARSER_FLAGS,
                         "--train.max_steps", "20", "--train.precision", "bf16"), check=True, capture_output=True,
                   timeout=180)
    got, want = (read_weights(r / "checkpoints/step-00000020.safetensors")[0] for r in (run, tmp_path / "today"))
    assert sorted(got) == sorted(want) and "tag_embed.weight" in got and "depth.embed.weight" in got
    then, now = (read_weights(r / "checkpoints/step-00000010.safetensors")[0] for r in (OLD_PARSER_RUN / "run",
                                                                                         tmp_path / "today"))
    if not all(torch.equal(then[k], now[k]) for k in then):  # names, kinds and the resume are checked above
        pytest.skip("this CPU's kernels do not reproduce the fixture's first 10 bf16 updates (made on an AVX-512 "
                    "BF16 CPU; Adam turns rounding into visible steps): the bit-for-bit end is checked there")
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.slow
def test_guided_alignment_resumes_bit_identically(toy_prepared, tmp_path, straight):
    """train.guided_alignment rebuilds its reference links in the resumed process: the same bytes as
    a guided run never stopped (and not those of an unguided one)."""
    extra = ("--train.guided_alignment", "0.5", "--train.guided_layer", "-1")
    straight_run, run = tmp_path / "straight", tmp_path / "run"
    subprocess.run(start_training(toy_prepared, straight_run, extra), check=True, capture_output=True, timeout=180)
    kill_after_step_15(start_training(toy_prepared, run, extra), run)
    resume(run)
    assert final_bytes(run) == final_bytes(straight_run) != straight
    assert "guided_alignment: 0.5" in (run / "config.yaml").read_text()
