"""The toolkit's surface: a strict Python API, one flag vocabulary, discoverable configs, runs that
record how they were made, early stopping, interactive translation, no import side effects."""

import importlib
import json
import os
import pty
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import tiny_config

import aiayn
from aiayn.checkpoint import list_checkpoints
from aiayn.cli import main
from aiayn.config import ConfigError
from aiayn.data.tokenizer import BOS, EOS
from aiayn.decode.search import length_penalty
from aiayn.decode.translator import Translator
from aiayn.device import decode_batch_tokens
from aiayn.overrides import apply_overrides, load_yaml, preset


@pytest.fixture(scope="module")
def ckpt(toy_prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("surface") / "run"
    aiayn.train(tiny_config(max_steps=40, lr_scale=0.5), str(toy_prepared), str(run))
    return list_checkpoints(run)[-1]


def aiayn_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "aiayn", *map(str, args)], capture_output=True, text=True,
                          timeout=300, **kw)


# -- the Python API -----------------------------------------------------------------------------
def test_translator_load_rejects_unknown_keywords_and_values(ckpt):
    with pytest.raises(TypeError, match="'beam_size'.*beam, alpha"):
        Translator.load(ckpt, beam_size=8)
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, int8, got 'fp16'"):
        Translator.load(ckpt, precision="fp16")
    with pytest.raises(ConfigError, match="decode.beam must be >= 1"):
        Translator.load(ckpt, beam=0)
    t = Translator.load(ckpt, beam=3)
    assert t.decode_cfg.beam == 3
    with pytest.raises(ValueError, match="beam must be in"):
        t.translate(["the dog"], beam=0)
    with pytest.raises(ConfigError, match="not a device"):
        Translator.load(ckpt, device="gpu")


def test_translation_batches_are_the_decoding_machines(toy_prepared, tmp_path, monkeypatch):
    """decode.max_tokens unset: 16,384 source tokens a batch on a GPU (1.58x the sentences/s of 4,096 on
    an H200, bench/gpu/2026-11-27_h200_gpu_full_rerun.json), 4,096 on a CPU; a checkpoint's own size (every one trained
    before this saved 4,096) is the training machine's and is not used; an explicit size always is."""
    assert decode_batch_tokens(torch.device("cuda")) == (16384, "the default for a GPU; decode.max_tokens sets it")
    assert decode_batch_tokens(torch.device("cpu")) == (4096, "the default for a CPU; decode.max_tokens sets it")
    assert decode_batch_tokens(torch.device("cuda"), 1000) == (1000, "decode.max_tokens")
    cfg = tiny_config(max_steps=2)
    cfg.decode.max_tokens = 50  # as an older checkpoint carries its 4,096
    aiayn.train(cfg, str(toy_prepared), str(tmp_path / "run"))
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    sizes = []
    batches = Translator._batches
    monkeypatch.setattr(Translator, "_batches",
                        lambda self, ids, n, apart=None: sizes.append(n) or batches(self, ids, n, apart))
    Translator.load(ckpt, device="cpu").translate(["the dog"])
    Translator.load(ckpt, device="cpu", max_tokens=64).translate(["the dog"])
    assert sizes == [4096, 64]
    with pytest.raises(ConfigError, match="decode.max_tokens must be positive"):
        Translator.load(ckpt, max_tokens=0)


def test_hypotheses_carry_the_scores_a_teacher_forced_pass_gives(ckpt):
    t = Translator.load(ckpt, precision="fp32")  # the teacher-forced pass below is fp32
    hyps = t.hypotheses(["the big dog runs", "", "a cat"], beam=4, alpha=0.6, nbest=3)
    assert len(hyps) == 3 and hyps[1] == [] and len(hyps[0]) == 3
    for h in hyps[0] + hyps[2]:
        assert h.text == t.tokenizer.decode([h.ids])[0] and len(h.pieces) == len(h.ids)
    for line, hs in (("the big dog runs", hyps[0]), ("a cat", hyps[2])):
        assert [h.score for h in hs] == sorted((h.score for h in hs), reverse=True)
        src = torch.tensor([t.encode_sources([line])[0]])
        for h in hs:
            ids = h.ids
            tgt_in, tgt_out = torch.tensor([[BOS] + ids]), torch.tensor(ids + [EOS])
            with torch.no_grad():
                lp = torch.log_softmax(t.model(src, tgt_in)[0].float(), -1)
            total = lp[torch.arange(len(tgt_out)), tgt_out].sum().item()
            assert h.score == pytest.approx(total / length_penalty(len(ids) + 1, 0.6), abs=1e-4)


def test_attention_of_a_translation(ckpt):
    t = Translator.load(ckpt)
    a = t.attention("the big dog")
    assert a.translation == t.translate(["the big dog"])[0]
    assert a.cross.shape[2:] == (len(a.tgt_out_tokens), len(a.src_tokens))
    assert abs(a.cross.sum(-1) - 1).max() < 1e-4


def test_training_from_python_is_two_calls(toy_corpus, tmp_path):
    manifest = aiayn.prepare({"train": (toy_corpus / "train.en", toy_corpus / "train.de"),
                              "valid": (str(toy_corpus / "valid.en"), str(toy_corpus / "valid.de"))},
                             str(tmp_path / "prep"), "en", "de", vocab_size=60)
    assert manifest["splits"]["train"]["pairs"] == 400
    state = aiayn.train(tiny_config(max_steps=3), tmp_path / "prep", tmp_path / "run")
    assert state["step"] == 3 and list_checkpoints(tmp_path / "run")


# -- configs ------------------------------------------------------------------------------------------
def test_config_command_round_trips_through_config(tmp_path, capsys):
    assert main(["config", "--preset", "base"]) == 0
    path = tmp_path / "base.yaml"
    path.write_text(capsys.readouterr().out)
    assert load_yaml(path).to_dict() == preset("base").to_dict()
    assert main(["config", "--preset", "multi30k", "--train.lr_scale", "0.5"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["train"]["lr_scale"] == 0.5


@pytest.mark.parametrize("typed,meant", [("train.lr", "train.lr_scale"), ("model.dmodel", "model.d_model"),
                                         ("decode.beam_size", "decode.beam"), ("trian.seed", "train.seed")])
def test_a_typo_gets_the_closest_key(typed, meant):
    with pytest.raises(ConfigError, match=f"did you mean '{meant}'"):
        apply_overrides(preset("base"), {typed: "1"})


def test_an_ambiguous_typo_gets_both_close_keys():
    with pytest.raises(ConfigError, match="did you mean 'train.lr_scale' or 'train.peak_lr'"):
        apply_overrides(preset("base"), {"train.lr": "1"})


def test_train_help_lists_every_key():
    out = aiayn_cli("train", "--help").stdout
    for key in ("train.lr_scale = 1.0", "model.d_model = 512", "data.max_tokens = 4096", "decode.beam = 4",
                "train.patience = 0"):
        assert key in out


# -- one flag vocabulary --------------------------------------------------------------------------------
@pytest.mark.slow
def test_flags_are_spelled_the_same_in_every_verb(ckpt, toy_corpus, toy_prepared, tmp_path):
    p = aiayn_cli("--version")
    assert p.returncode == 0 and p.stdout.startswith(f"aiayn {aiayn.__version__}")
    p = aiayn_cli("prepare", "--data-dir", toy_corpus, "--src", "en", "--tgt", "de", "-o", tmp_path / "prep",
                  "--data.vocab_size", "60")
    assert p.returncode == 0 and (tmp_path / "prep" / "manifest.json").exists()
    p = aiayn_cli("translate", "--checkpoint", ckpt, "-i", toy_prepared / "valid.en.txt", "-o", tmp_path / "h.txt")
    assert p.returncode == 0 and len((tmp_path / "h.txt").read_text().splitlines()) == 20
    run = ckpt.parent.parent
    p = aiayn_cli("average", "--run-dir", run, "--last", "1", "-o", tmp_path / "avg.safetensors")
    assert p.returncode == 0 and (tmp_path / "avg.safetensors").exists()
    p = aiayn_cli("plot", "curves", "--run-dir", run, "-o", tmp_path / "c.png")
    assert p.returncode == 0 and (tmp_path / "c.png").exists()


@pytest.mark.parametrize("args,message", [
    (["--beam", "0"], "--beam: decode.beam must be >= 1"),
    (["--max-tokens", "0"], "--max-tokens: decode.max_tokens must be positive"),
    (["--device", "cuda"], "CUDA is not available here"),
])
def test_translate_errors_name_the_flag(ckpt, args, message):
    if args[-1] == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    p = aiayn_cli("translate", "--checkpoint", ckpt, "-i", os.devnull, *args)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr


# -- runs record how they were made --------------------------------------------------------------------
@pytest.mark.slow
def test_run_json_and_train_log_record_the_run(toy_prepared, tmp_path):
    run = tmp_path / "run"
    p = aiayn_cli("train", "--data", toy_prepared, "--run-dir", run, "--model.d_model", "32", "--model.d_ff", "64",
                  "--model.N", "1", "--train.max_steps", "10", "--train.log_every", "5", "--train.threads", "1",
                  "--train.valid_bleu_sentences", "0", "--data.max_tokens", "400", "--train.tokens_per_update", "0")
    assert p.returncode == 0, p.stderr[-1500:]
    rec = json.loads((run / "run.json").read_text())
    s = rec["sessions"][0]
    assert s["command"][1:3] == ["train", "--data"] and s["aiayn"] == aiayn.__version__
    assert s["torch"] == torch.__version__ and s["device"] == "cpu" and s["threads"] == 1 and s["world"] == 1
    assert s["max_tokens_per_update"] == 400 and "git" in s and not s["resumed"]
    log = (run / "train.log").read_text()
    assert "step 5 epoch" in log and "step 10 epoch" in log and "target tok/s" in log
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    per_update = [r["tgt_tokens_per_update"] for r in rows if "tgt_tokens_per_update" in r]
    assert len(per_update) == 2 and all(0 < x <= 400 for x in per_update)  # at most max_tokens, padding aside
    p = aiayn_cli("train", "--resume", run, "--train.max_steps", "12")
    assert p.returncode == 0
    assert [x["resumed"] for x in json.loads((run / "run.json").read_text())["sessions"]] == [False, True]


def test_importing_aiayn_leaves_the_environment_alone():
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    out = subprocess.run([sys.executable, "-c", "import os, aiayn, aiayn.training.session, aiayn.serve.app; "
                          "print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'))"],
                         capture_output=True, text=True, env=env, timeout=120).stdout
    assert out.strip() == "None"


def test_a_command_does_not_import_scipy_until_it_needs_it():
    """scipy (the t distribution of the report's statistics) cost every `aiayn` command 0.7 s to import."""
    code = ("import sys\nfrom aiayn.cli import main\ntry:\n    main(['translate', '--help'])\n"
            "except SystemExit:\n    pass\nprint('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("False"), out.stdout[-500:] + out.stderr[-2000:]
    from aiayn.evidence.stats import seed_test, t_quantile  # and the statistics still work with it

    assert abs(t_quantile(0.975, 4) - 2.7764451) < 1e-6 and seed_test(1.0, [0.0, 0.1, -0.1]).p < 0.05


def test_translating_eagerly_does_not_import_dynamo(ckpt, tmp_path):
    """torch._dynamo (the compiler's front end) cost every `aiayn translate` 0.9 s of a 2.8 s start; only
    --compile needs it."""
    (tmp_path / "in.txt").write_text("a dog runs\n")
    code = ("import sys\nfrom aiayn.cli import main\nmain(['translate', '--checkpoint', sys.argv[1], '-i', "
            "sys.argv[2]])\nprint('torch._dynamo' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, str(ckpt), str(tmp_path / "in.txt")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.count("\n") == 1, p.stderr[-2000:]
    assert p.stderr.rstrip().endswith("False"), p.stderr[-2000:]


def test_the_package_loads_its_torch_names_on_first_use():
    """`import aiayn` alone leaves torch unloaded; every public name still resolves, is listed by dir(),
    and aiayn.train stays the function after its module is imported."""
    code = ("import sys, aiayn\nbefore = 'torch' in sys.modules\nimport aiayn.training.session\n"
            "print(before, all(hasattr(aiayn, n) for n in aiayn.__all__), set(aiayn.__all__) <= set(dir(aiayn)),"
            " aiayn.train is aiayn.training.session.train, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True", "True", "True", "True"], out.stdout + out.stderr[-2000:]


def test_help_and_errors_found_before_any_model_answer_without_torch(tmp_path):
    """torch is 2 s of a 3 s start: help, a bad flag, a bad override and misaligned text do without it."""
    (tmp_path / "t.en").write_text("a dog\nthe cat\n")
    (tmp_path / "t.de").write_text("ein hund\n")
    calls = [["--help"], ["translate", "--help"], ["reproduce", "--help"], ["train", "--no-such-flag"],
             ["train", "--data", str(tmp_path), "--run-dir", str(tmp_path / "r"), "--train.lr_scale", "fast"],
             ["prepare", "--data-dir", str(tmp_path), "--src", "en", "--tgt", "de", "--out", str(tmp_path / "p"),
              "--train", "t", "--valid", "t"]]
    code = ("import sys, json\nfrom aiayn.cli import main\nout = []\n"
            f"for argv in {calls!r}:\n    try:\n        out.append(main(argv))\n"
            "    except SystemExit as e:\n        out.append(e.code)\nprint(json.dumps([out, 'torch' in sys.modules]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    codes, imported = json.loads(p.stdout.splitlines()[-1])
    assert codes == [0, 0, 0, 2, 2, 2] and not imported, p.stdout[-500:] + p.stderr[-2000:]
    assert "train.lr_scale" in p.stderr and "misaligned" in p.stderr and "t.en" in p.stderr
    version = aiayn_cli("--version").stdout  # and the version line still names the torch it runs on
    assert version.strip() == f"aiayn {aiayn.__version__} (torch {torch.__version__})"


def test_a_torch_without_package_metadata_still_gets_a_cli(monkeypatch, capsys):
    """--version reads torch's version from metadata, which a source checkout of torch lacks."""
    from importlib.metadata import PackageNotFoundError

    import aiayn.cli

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(aiayn.cli, "version", missing)
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "torch version unknown" in capsys.readouterr().out
    assert main(["train"]) == 2 and "train needs --data" in capsys.readouterr().err  # every verb still parses


# -- early stopping --------------------------------------------------------------------------------------
def scripted_validation(monkeypatch, losses):
    seq = iter(losses)

    def fake(model, data, cfg, device, env=None):
        loss = next(seq)
        return {"valid_loss": loss, "valid_nll": loss, "valid_ppl": 2.0 ** loss}

    monkeypatch.setattr(importlib.import_module("aiayn.training.trainer"), "validate", fake)


def test_patience_stops_training_and_survives_a_resume(toy_prepared, tmp_path, monkeypatch):
    # validations at steps 2, 4, 6, ...: better, better, worse, worse -> stop at step 8 with patience 2
    scripted_validation(monkeypatch, [5.0, 4.0, 4.5, 4.2, 3.0, 3.0])
    state = aiayn.train(tiny_config(max_steps=50, valid_every=2, patience=2), toy_prepared, tmp_path / "a")
    assert state["step"] == 8 and state["stale"] == 2
    assert (tmp_path / "a/checkpoints/step-00000008.safetensors").exists()
    # one stale validation before the run stops at max_steps; the resumed run stops at the next one
    scripted_validation(monkeypatch, [5.0, 4.0, 4.5])
    state = aiayn.train(tiny_config(max_steps=5, valid_every=2, patience=2), toy_prepared, tmp_path / "b")
    assert state["step"] == 5 and state["stale"] == 1
    scripted_validation(monkeypatch, [4.8, 4.9])
    state = aiayn.train(None, None, tmp_path / "b", resume=True, overrides={"train.max_steps": "50"})
    assert state["step"] == 6 and state["stale"] == 2
    assert not preset("base").train.patience  # off by default: the paper's fixed schedule


# -- interactive translation ------------------------------------------------------------------------------
def test_translate_on_a_terminal_answers_line_by_line(ckpt):
    expected = Translator.load(ckpt).translate(["the big dog", "a cat"])
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(ckpt)], stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(slave)
    try:
        os.write(master, b"the big dog\n")
        first = proc.stdout.readline()  # answered before the second line is typed
        assert first.rstrip("\n") == expected[0]
        os.write(master, b"a cat\n")
        assert proc.stdout.readline().rstrip("\n") == expected[1]
        os.write(master, b"\x04")  # Ctrl-D
        proc.wait(timeout=60)
        assert proc.returncode == 0
    finally:
        proc.kill()
        os.close(master)



def test_train_translate_and_serve_choose_the_device_the_same_way(ckpt):
    import argparse

    from aiayn.cli import main as cli_main
    from aiayn.decode.translator import pick_device

    expected = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device(None) == expected
    assert Translator.load(ckpt).device.type == expected.type
    seen = {}

    def capture(self, args=None, namespace=None):  # the parsed defaults of each verb, nothing run
        ns, extra = real(self, args, namespace)
        if not hasattr(ns, "command"):  # a verb's own parser, inside the top-level one
            return ns, extra
        seen[ns.command] = ns.device
        raise SystemExit(0)

    real = argparse.ArgumentParser.parse_known_args
    try:
        argparse.ArgumentParser.parse_known_args = capture
        for argv in (["train", "--data", "d", "--run-dir", "r"], ["translate", "--checkpoint", "c"],
                     ["serve", "--checkpoint", "c"], ["reproduce", "--suite", "quick"]):
            with pytest.raises(SystemExit):
                cli_main(argv)
    finally:
        argparse.ArgumentParser.parse_known_args = real
    assert seen == {"train": None, "translate": None, "serve": None, "reproduce": None}
