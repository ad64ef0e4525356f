"""A catalog of bad input, walked through the real command line (one process per case) and the
Python and HTTP APIs. For every case: exit status 2 (or an exception / a 4xx), one error line that
names what is wrong and where, no traceback, no file of the workspace changed, added or removed —
and no pickle ever executed.
"""

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_forks import run_many
from conftest import tiny_config
from fastapi.testclient import TestClient
from safetensors.torch import save_file

from aiayn.checkpoint import CheckpointError
from aiayn.config import ConfigError
from aiayn.decode.translator import Translator
from aiayn.overrides import config_keys
from aiayn.serve.app import Limits, create_app
from aiayn.training.session import train

MARKER = "PICKLE_WAS_EXECUTED"


class Evil:
    """Unpickling this creates a folder named MARKER in the current directory."""

    def __reduce__(self):
        return os.mkdir, (MARKER,)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def lines(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.fixture(scope="module")
def template(toy_prepared, tmp_path_factory) -> Path:
    """Every file a case may need: corpora, a trained run, checkpoints good, foreign and evil."""
    w = tmp_path_factory.mktemp("catalog")
    good = "a dog\nthe cat\na man runs\n"
    for name, en, de in [("ok", good, "ein hund\ndie katze\nein mann läuft\n"),
                         ("misaligned", good, "ein hund\ndie katze\n"),
                         ("badutf8", good, b"ein hund\ndie katze\nein \xff mann\n"),
                         ("emptyline", good, "ein hund\n\nein mann\n"),
                         ("empty", "", "")]:
        lines(w / f"{name}.en", en)
        lines(w / f"{name}.de", de)
    cfg = tiny_config(max_steps=2)
    train(cfg, toy_prepared, w / "run")
    ckpt = sorted((w / "run/checkpoints").glob("step-*.safetensors"))[-1]
    shutil.copy(ckpt, w / "model.safetensors")
    data = ckpt.read_bytes()
    lines(w / "truncated.safetensors", data[: len(data) // 2])
    torch.save({"model": {"w": torch.zeros(2)}, "args": Evil()}, w / "fairseq.pt")
    lines(w / "evil.safetensors", pickle.dumps(Evil()))
    save_file({"model.encoder.layers.0.fc1.weight": torch.zeros(2, 2)}, w / "hf.safetensors", metadata={"format": "pt"})
    shutil.copytree(w / "run", w / "corrupt-run")
    for state in (w / "corrupt-run/checkpoints").glob("*.state.pt"):
        lines(state, pickle.dumps(Evil()))
    (w / "empty-dir").mkdir()
    (w / "foreign-run").mkdir()
    lines(w / "foreign-run/checkpoint_last.pt", b"not ours")
    lines(w / "bad.yaml", "model: {d_model: [unclosed\n")
    lines(w / "list.yaml", "- 1\n- 2\n")
    lines(w / "valid.en", good)
    lines(w / "in.txt", "a dog runs\n")
    lines(w / "in-badutf8.txt", b"a dog\n\xc3\x28 runs\n")
    lines(w / "out.txt", "KEEP ME\n")
    lines(w / "two.txt", "a\nb\n")
    lines(w / "bad-glossary.tsv", "dog\thund\ncat katze\n")
    lines(w / "glossary-badutf8.tsv", b"dog\thund\ncat\t\xff\n")
    lines(w / "one.txt", "a\n")
    (w / "prepared").symlink_to(toy_prepared)
    (w / "precious/sub").mkdir(parents=True)  # a folder aiayn did not write: never cleared
    lines(w / "precious/notes.txt", "my notes\n")
    lines(w / "precious/sub/data.txt", "more\n")
    for name in ("config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json",  # save_pretrained's
                 "tokenizer_config.json", "special_tokens_map.json"):
        lines(_mkdir(w / "user-hf") / name, "{}\n")
    lines(_mkdir(w / "user-config") / "config.json", '{"mine": true}\n')
    lines(_mkdir(w / "userdata/raw") / "original-crawl.tsv", "a dog\tein hund\n")  # a folder with a manifest
    lines(w / "userdata/manifest.json", '{"mine": true}\n')
    lines(w / "userdata/NOTES.txt", "my notes\n")
    for split in ("train", "valid"):
        lines(w / f"userdata/{split}.en", good)
        lines(w / f"userdata/{split}.de", "ein hund\ndie katze\nein mann läuft\n")
    (w / "bad-manifest").mkdir()
    lines(w / "bad-manifest/manifest.json", '{"settings": {"src": "en"')
    lines(_mkdir(w / "list-manifest") / "manifest.json", "[1, 2]\n")
    nested = "[" * 100_000 + "]" * 100_000 + "\n"  # past Python's recursion limit, as JSON and as YAML
    lines(w / "nested.yaml", nested)
    lines(_mkdir(w / "junk-metrics") / "metrics.jsonl", "7\n" + nested + '{"loss": "x"}\n')
    lines(_mkdir(w / "list-run-json") / "run.json", "[1, 2]\n")
    shutil.copy(w / "model.safetensors", w / "list-run-json/model.safetensors")
    shutil.copytree(w / "run", w / "nested-run-json")
    lines(w / "nested-run-json/run.json", nested)
    lines(w / "deep.mrg", "(S " * 3000 + "(NN x)" + ")" * 3000 + "\n")
    import zipfile

    with zipfile.ZipFile(w / "latin1.zip", "w") as z:
        z.writestr("treebank/combined/wsj_0001.mrg", "( (S (NP (NN caf\xe9)) ) )\n".encode("latin-1"))
    from aiayn.checkpoint import read_weights

    tensors, meta = read_weights(w / "model.safetensors")
    save_file(tensors, w / "bad-spm.safetensors", metadata={**meta, "spm_model": "bm90IGEgbW9kZWw="})
    save_file(tensors, w / "list-config.safetensors", metadata={**meta, "config": "[1, 2]"})
    config = json.loads(meta["config"])
    for name, model_field, value in [("huge-positions", "max_positions", 1 << 24), ("huge-dff", "d_ff", 1 << 21),
                                     ("wrong-dff", "d_ff", 1 << 16), ("half-layer", "N", 2.5)]:
        damaged = {**config, "model": {**config["model"], model_field: value}}
        save_file(tensors, w / f"{name}.safetensors", metadata={**meta, "config": json.dumps(damaged)})
    for name, text in [("digits", '{"model": {"d_model": ' + "9" * 5000 + "}}"),
                       ("nested", '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}")]:
        save_file(tensors, w / f"{name}.safetensors", metadata={**meta, "config": text})
    save_file(tensors, w / "nan-step.safetensors", metadata={**meta, "step": "nan"})
    save_file(tensors, w / "list-extra.safetensors", metadata={**meta, "extra": "[1, 2]"})
    for name, field, text in [("list-extra-run", "extra", "[1, 2]"), ("damaged-config-run", "config", "null")]:
        shutil.copytree(w / "run", w / name)  # its last checkpoint, whose metadata an average copies, damaged
        last = sorted((w / name / "checkpoints").glob("step-*.safetensors"))[-1]
        tensors_i, meta_i = read_weights(last)
        save_file(tensors_i, last, metadata={**meta_i, field: text})
    shutil.copytree(w / "run", w / "incomplete-run")
    for state in (w / "incomplete-run/checkpoints").glob("*.state.pt"):
        torch.save({"optimizer": {}, "rng": []}, state)
    return w


P = ["prepare", "--data-dir", "{w}", "--src", "en", "--tgt", "de", "--out", "{w}/prep", "--data.vocab_size", "60"]
T = ["translate", "--checkpoint", "{w}/model.safetensors", "--input", "{w}/in.txt", "--output", "{w}/out.txt"]
TR = ["train", "--data", "{w}/prepared", "--run-dir", "{w}/new-run"]
# (name, argv, fragments the error line must contain: what, and where)
CLI_CASES = [
    ("misaligned corpus", P + ["--train", "misaligned", "--valid", "ok"], ["misaligned", "misaligned.en", "3", "2"]),
    ("invalid UTF-8 corpus", P + ["--train", "badutf8", "--valid", "ok"], ["badutf8.de:3", "invalid UTF-8"]),
    ("empty line, --strict", P + ["--train", "emptyline", "--valid", "ok", "--strict"], ["emptyline.de:2", "empty"]),
    ("empty corpus", P + ["--train", "empty", "--valid", "ok"], ["empty.en", "no sentence pairs"]),
    ("missing corpus file", P + ["--train", "nothere", "--valid", "ok"], ["nothere.en"]),
    ("prepare without languages", P[:3] + P[7:] + ["--train", "ok", "--valid", "ok"], ["--src", "ok.* has de, en"]),
    ("vocabulary smaller than asked, --strict", P[:-1] + ["5000", "--train", "ok", "--valid", "ok", "--strict"],
     ["fewer than the 5000", "--strict"]),
    ("bad vocabulary size", P[:-1] + ["0", "--train", "ok", "--valid", "ok"], ["data.vocab_size", "0"]),
    ("missing checkpoint", ["translate", "--checkpoint", "{w}/nope.safetensors", "--input", "{w}/in.txt"],
     ["nope.safetensors", "not found"]),
    ("truncated checkpoint", T[:2] + ["{w}/truncated.safetensors"] + T[3:], ["truncated.safetensors", "readable"]),
    ("pickled checkpoint", T[:2] + ["{w}/evil.safetensors"] + T[3:], ["evil.safetensors", "pickle"]),
    # a single-file output replaces only a file of its kind that aiayn wrote (its header says so), never the user's
    *[(f"{argv[0]} -o a user's file", argv, ["one.txt", "exists and is not an aiayn", "replaces only"]) for argv in (
        ["average", "{w}/run", "-o", "{w}/one.txt"], ["align", "--checkpoint", "{w}/model.safetensors", "--data",
                                                      "{w}/prepared", "-o", "{w}/one.txt"],
        ["tune", "--checkpoint", "{w}/model.safetensors", "--data", "{w}/prepared", "--output", "{w}/one.txt"],
        ["shortlist", "--data", "{w}/prepared", "-o", "{w}/one.txt"])],
    ("shortlist -o a checkpoint", ["shortlist", "--data", "{w}/prepared", "-o", "{w}/model.safetensors"],
     ["model.safetensors", "not an aiayn shortlist"]),
    # a training run's folder where a checkpoint belongs: every verb says so, and what to give instead
    *[(f"{argv[0]} given a run's folder", argv, ["run: a folder, not a checkpoint file", "aiayn average"]) for argv in (
        T[:2] + ["{w}/run"] + T[3:], ["export", "ct2", "--checkpoint", "{w}/run", "-o", "{w}/ct2-out"],
        ["tune", "--checkpoint", "{w}/run", "--data", "{w}/prepared"], TR + ["--init-from", "{w}/run"],
        P + ["--train", "ok", "--valid", "ok", "--tokenizer-from", "{w}/run"],
        ["align", "--checkpoint", "{w}/run", "--data", "{w}/prepared", "-o", "{w}/al.safetensors"])],
    ("fairseq checkpoint", T[:2] + ["{w}/fairseq.pt"] + T[3:], ["fairseq.pt", "pickle"]),
    ("Hugging Face checkpoint", T[:2] + ["{w}/hf.safetensors"] + T[3:], ["hf.safetensors", "not an aiayn"]),
    ("malformed YAML", TR + ["--config", "{w}/bad.yaml"], ["bad.yaml:2:1", "invalid YAML"]),
    ("YAML that is not a mapping", TR + ["--config", "{w}/list.yaml"], ["list.yaml", "mapping"]),
    ("override of the wrong type", TR + ["--train.lr_scale", "fast"], ["train.lr_scale", "float", "fast"]),
    ("unknown override", TR + ["--train.lr", "0.1"], ["train.lr", "unknown"]),
    ("override without a value", TR + ["--train.lr_scale"], ["--train.lr_scale", "value"]),
    ("impossible shape: h does not divide d_model", TR + ["--model.h", "3"], ["model.d_model", "model.h"]),
    ("impossible shape: no layers", TR + ["--model.N", "0"], ["model.N", "positive"]),
    ("non-finite config value", TR + ["--train.lr_scale", ".nan"], ["train.lr_scale", "finite"]),
    ("--resume of an empty directory", ["train", "--resume", "{w}/empty-dir"], ["empty-dir", "not an aiayn run"]),
    ("--resume of a foreign directory", ["train", "--resume", "{w}/foreign-run"], ["foreign-run", "not an aiayn run"]),
    ("--resume with a pickled training state", ["train", "--resume", "{w}/corrupt-run"],
     ["corrupt-run", "state.pt", "corrupt training state", "to resume from the checkpoint before it, move"]),
    ("training into an existing run", ["train", "--data", "{w}/prepared", "--run-dir", "{w}/run"],
     ["run", "--resume"]),
    ("unprepared data folder", ["train", "--data", "{w}/empty-dir", "--run-dir", "{w}/new-run"],
     ["empty-dir", "manifest.json"]),
    ("score files of different lengths", ["score", "--hyp", "{w}/two.txt", "--ref", "{w}/one.txt"],
     ["two.txt", "2 lines", "one.txt", "1"]),
    ("translate --ref of another length", T + ["--ref", "{w}/two.txt"], ["in.txt", "1 lines", "two.txt", "2"]),
    ("NaN alpha", T + ["--alpha", "nan"], ["decode.alpha", "finite"]),
    ("negative alpha", T + ["--alpha", "-1"], ["decode.alpha", ">= 0"]),
    ("beam 0", T + ["--beam", "0"], ["decode.beam", ">= 1"]),
    ("beam larger than the vocabulary", T + ["--beam", "1000"], ["decode.beam", "1000", "vocabulary"]),
    ("beam past any vocabulary's limit", T + ["--beam", "100000"], ["--beam", "at most 1,024", "100000"]),
    ("negative max length", T + ["--max-len-b", "-5"], ["max_len_b", "-5"]),
    ("nbest larger than the beam", T + ["--nbest", "5"], ["decode.nbest", "5"]),
    ("zero tokens per batch", T + ["--max-tokens", "0"], ["decode.max_tokens", "positive"]),
    # terms the user dictates (decode/glossary.py, decode/constraints.py)
    ("glossary line without a tab", T + ["--glossary", "{w}/bad-glossary.tsv"],
     ["bad-glossary.tsv line 2", "1 tab-separated fields"]),
    ("glossary of invalid UTF-8", T + ["--glossary", "{w}/glossary-badutf8.tsv"], ["glossary-badutf8.tsv", "UTF-8"]),
    ("missing glossary", T + ["--glossary", "{w}/no-glossary.tsv"], ["no-glossary.tsv"]),
    ("negative constraint beam", T + ["--constraint-beam", "-1"], ["decode.constraint_beam", ">= 0"]),
    ("input of invalid UTF-8", T[:3] + ["--input", "{w}/in-badutf8.txt", "--output", "{w}/out.txt"],
     ["in-badutf8.txt:2", "invalid UTF-8"]),
    ("average of a run without checkpoints", ["average", "{w}/empty-dir", "-o", "{w}/avg.safetensors"],
     ["empty-dir", "no checkpoints"]),
    ("curves of a folder without metrics", ["plot", "curves", "{w}/empty-dir", "-o", "{w}/c.png"],
     ["empty-dir", "metrics.jsonl"]),
    ("server with a zero queue", ["serve", "--checkpoint", "{w}/model.safetensors", "--max-queue", "0"],
     ["--max-queue", "positive"]),
    ("server whose clients may hold more than the queue", ["serve", "--checkpoint", "{w}/model.safetensors",
                                                            "--client-share", "1.5"], ["--client-share", "1.5"]),
    ("server allowing a malformed host pattern", ["serve", "--checkpoint", "{w}/model.safetensors", "--allow-host",
                                                  "ex*ample.com"], ["--allow-host", "ex*ample.com"]),
    # many directions, many models, sampling, forced scores
    ("prepare pairs that are no direction", ["prepare", "--data-dir", "{w}", "--pairs", "en_de", "--out", "{w}/mp"],
     ["--pairs", "en_de", "SRC-TGT"]),
    ("prepare a direction twice", ["prepare", "--data-dir", "{w}", "--pairs", "en-de,en-de", "--out", "{w}/mp"],
     ["en-de", "named twice"]),
    ("prepare pairs with --src", ["prepare", "--data-dir", "{w}", "--pairs", "en-de", "--src", "en", "--out",
                                  "{w}/mp"], ["--pairs", "--src"]),
    ("translate into a language the model lacks", T + ["--tgt-lang", "xx"], ["'xx'", "translates into de"]),
    ("sampling with a nucleus of nothing", T + ["--sample", "--top-p", "0"], ["--top-p", "decode.top_p", "(0, 1]"]),
    ("sampling at temperature 0", T + ["--sample", "--temperature", "0"], ["--temperature", "(0, 100]"]),
    ("server of several models with a negative memory bound", ["serve", "--checkpoint", "{w}/model.safetensors",
                                                               "--checkpoint", "{w}/model.safetensors",
                                                               "--max-loaded-mb", "-1"], ["--max-loaded-mb", "-1"]),
    ("server of a folder without checkpoints", ["serve", "--checkpoint", "{w}/empty-dir"],
     ["empty-dir", "a folder without checkpoints"]),
    ("scores without their sources", ["score", "--checkpoint", "{w}/model.safetensors", "--hyp", "{w}/two.txt"],
     ["--src", "--hyp"]),
    ("scores of files of different lengths", ["score", "--checkpoint", "{w}/model.safetensors", "--src",
                                              "{w}/in.txt", "--hyp", "{w}/two.txt"], ["in.txt", "1 lines", "two.txt"]),
    # a checkpoint's header is untrusted too: each field typed (tests/robustness/flag_sweep.py --verbs ckpt)
    ("checkpoint whose step is not a number", T[:2] + ["{w}/nan-step.safetensors"] + T[3:],
     ["nan-step.safetensors", "step is 'nan'", "not a count of updates"]),
    ("align a checkpoint whose extra is a list", ["align", "--checkpoint", "{w}/list-extra.safetensors", "--data",
                                                  "{w}/prepared", "-o", "{w}/al.safetensors"],
     ["list-extra.safetensors", "extra is a list, not a mapping"]),
    ("average of a run whose last extra is a list", ["average", "{w}/list-extra-run", "-o", "{w}/avg.safetensors"],
     ["list-extra-run", "extra is a list, not a mapping"]),
    ("average of a run whose last config is damaged", ["average", "{w}/damaged-config-run", "-o",
                                                       "{w}/avg.safetensors"], ["damaged-config-run", "config"]),
    ("server on a port past 65535", ["serve", "--checkpoint", "{w}/model.safetensors", "--port", "70000"],
     ["--port", "0..65535", "70000"]),
    ("server on a host name that does not resolve", ["serve", "--checkpoint", "{w}/model.safetensors", "--host",
                                                     "nothere.invalid", "--port", "0"],
     ["--host", "nothere.invalid", "cannot listen"]),
    ("server on an address not this machine's", ["serve", "--checkpoint", "{w}/model.safetensors", "--host",
                                                 "192.0.2.1", "--port", "0"], ["192.0.2.1", "cannot listen"]),
    # folders aiayn did not write are refused, never cleared (export ct2 once deleted them)
    ("export hf into a foreign folder", ["export", "hf", "--checkpoint", "{w}/model.safetensors", "-o", "{w}/precious"],
     ["precious", "not empty", "notes.txt"]),
    ("export ct2 into a foreign folder", ["export", "ct2", "--checkpoint", "{w}/model.safetensors", "-o",
                                          "{w}/precious"], ["precious", "not empty"]),
    ("export into the current folder", ["export", "ct2", "--checkpoint", "{w}/model.safetensors", "-o", "."],
     ["-o", "not empty"]),
    ("export into the parent folder", ["export", "hf", "--checkpoint", "{w}/model.safetensors", "-o", ".."],
     ["not empty"]),
    ("plot attention into a foreign folder", ["plot", "attention", "--checkpoint", "{w}/model.safetensors", "--src",
                                              "a dog", "-o", "{w}/precious"], ["precious", "not empty"]),
    ("prepare into a foreign folder", P[:-3] + ["{w}/precious", "--data.vocab_size", "60", "--train", "ok",
                                                 "--valid", "ok"], ["precious", "not empty"]),
    ("prepare into an existing file", P[:-3] + ["{w}/out.txt", "--data.vocab_size", "60", "--train", "ok",
                                                 "--valid", "ok"], ["out.txt", "is a file"]),
    # names alone never make a folder aiayn's: only its marker, listing all the folder holds
    ("export hf into the user's own MarianMT folder", ["export", "hf", "--checkpoint", "{w}/model.safetensors", "-o",
                                                       "{w}/user-hf"], ["user-hf", "not empty", "aiayn did not write"]),
    ("export into a folder of the user's config.json", ["export", "hf", "--checkpoint", "{w}/model.safetensors", "-o",
                                                         "{w}/user-config"], ["user-config", "not empty"]),
    ("prepare into the folder of its own inputs", ["prepare", "--data-dir", "{w}/userdata", "--src", "en", "--tgt",
                                                   "de", "--train", "train", "--valid", "valid", "-o", "{w}/userdata",
                                                   "--data.vocab_size", "60"], ["userdata", "not empty"]),
    ("a test set named like the validation split", P + ["--train", "ok", "--valid", "ok", "--test", "ok",
                                                         "--test", "{w}/ok.en,{w}/ok.de"],
     ["--test", "ok.en", "'ok'", "another test set"]),
    ("a test set that would replace the validation split", P + ["--train", "ok", "--valid", "ok", "--test",
                                                                "{w}/valid.en,{w}/ok.de"],
     ["--test", "'valid'", "the valid split"]),
    ("translate --output onto its --input", T[:5] + ["--output", "{w}/in.txt"], ["in.txt", "also an input"]),
    ("average onto a checkpoint it averages",
     ["average", "{w}/run", "-o", "{w}/run/checkpoints/step-00000002.safetensors"],
     ["step-00000002.safetensors", "also an input"]),
    ("reproduce report into a foreign folder", ["reproduce", "--suite", "table1", "--report", "{w}/precious"],
     ["--report", "precious", "not empty"]),
    ("reproduce results into a foreign folder", ["reproduce", "--suite", "table1", "--report", "{w}/new-report",
                                                 "--results", "{w}/precious"],
     ["--results", "precious", "not empty"]),
    ("translate into a missing folder", T[:5] + ["--output", "{w}/missing/dir/out.txt"],
     ["missing/dir", "does not exist"]),
    ("corrupt manifest", ["train", "--data", "{w}/bad-manifest", "--run-dir", "{w}/new-run"],
     ["bad-manifest/manifest.json", "corrupt"]),
    ("a manifest that is a JSON list", ["train", "--data", "{w}/list-manifest", "--run-dir", "{w}/new-run"],
     ["list-manifest/manifest.json", "a JSON list, not an object", "re-run `aiayn prepare`"]),
    ("a config nested past the recursion limit", TR + ["--config", "{w}/nested.yaml"], ["nested.yaml", "invalid YAML"]),
    ("curves of metrics that hold no record", ["plot", "curves", "{w}/junk-metrics", "-o", "{w}/c.png"],
     ["junk-metrics", "no training or validation records"]),
    ("tune beside a run.json that is a JSON list", ["tune", "--checkpoint", "{w}/list-run-json/model.safetensors"],
     ["model.safetensors", "no readable run.json", "--data"]),
    ("--resume with a run.json nested past the recursion limit", ["train", "--resume", "{w}/nested-run-json"],
     ["nested-run-json/run.json", "damaged", "--data"]),
    ("tree nested 3,000 deep", ["score", "--parse", "--hyp", "{w}/deep.mrg", "--ref", "{w}/deep.mrg"],
     ["deep.mrg", "nested deeper"]),
    ("treebank that is not UTF-8", ["prepare", "--task", "parse", "--treebank", "{w}/latin1.zip", "-o", "{w}/ptb"],
     ["latin1.zip", "wsj_0001.mrg", "invalid UTF-8"]),
    ("negative --subtrees", ["prepare", "--task", "parse", "--treebank", "{w}/latin1.zip", "--subtrees", "-2",
                             "-o", "{w}/ptb"], ["--subtrees", "-2"]),
    ("mirror that is not a URL", ["prepare", "--corpus", "wmt14-en-de", "--src", "en", "--tgt", "de", "--mirror",
                                  "notaurl", "-o", "{w}/wmt"], ["--mirror", "notaurl", "not a URL"]),
    ("checkpoint whose vocabulary is garbage", T[:2] + ["{w}/bad-spm.safetensors"] + T[3:],
     ["bad-spm.safetensors", "spm_model"]),
    ("checkpoint whose config is a list", T[:2] + ["{w}/list-config.safetensors"] + T[3:],
     ["list-config.safetensors", "config", "list"]),
    # a checkpoint's config is bounded and checked against its weights before anything is allocated
    ("checkpoint asking for 2^24 positions", T[:2] + ["{w}/huge-positions.safetensors"] + T[3:],
     ["huge-positions.safetensors", "max_positions", "at most"]),
    ("checkpoint asking for d_ff 2^21", T[:2] + ["{w}/huge-dff.safetensors"] + T[3:],
     ["huge-dff.safetensors", "d_ff", "at most"]),
    ("checkpoint whose d_ff is not its weights'", T[:2] + ["{w}/wrong-dff.safetensors"] + T[3:],
     ["wrong-dff.safetensors", "shape"]),
    ("checkpoint with half a layer", T[:2] + ["{w}/half-layer.safetensors"] + T[3:],
     ["half-layer.safetensors", "model.N", "expected int", "2.5"]),
    ("checkpoint config with a 5,000-digit number", T[:2] + ["{w}/digits.safetensors"] + T[3:],
     ["digits.safetensors", "damaged metadata"]),
    ("checkpoint config nested 100,000 deep", T[:2] + ["{w}/nested.safetensors"] + T[3:],
     ["nested.safetensors", "damaged metadata", "nested too deeply"]),
    ("--resume with a training state missing keys", ["train", "--resume", "{w}/incomplete-run"],
     ["incomplete-run", "state.pt", "missing progress"]),
    # numbers that passed every check and overflowed later, found by giving every flag odd values (10^30)
    ("alpha that overflows the length penalty", T + ["--alpha", "1e30"], ["--alpha", "at most 10"]),
    ("max length of 30 digits", T + ["--max-len-b", "9" * 30], ["--max-len-b", "at most 65,536"]),
    ("tune beams of 30 digits", ["tune", "--checkpoint", "{w}/model.safetensors", "--data", "{w}/prepared",
                                 "--beams", "4," + "9" * 30], ["--beams", "[1, 1024]"]),
    ("tune beam larger than the vocabulary", ["tune", "--checkpoint", "{w}/model.safetensors", "--data",
                                              "{w}/prepared", "--beams", "4,1000"],
     ["beam size 1000 (--beams", "vocabulary"]),
    ("shortlist of 10^30 per source", ["shortlist", "--data", "{w}/prepared", "-o", "{w}/sl.safetensors",
                                       "--per-source", "9" * 30], ["--per-source", "[1, 1024]"]),
    ("parameters at a vocabulary of 10^30", ["params", "--preset", "base", "--vocab-size", "9" * 30],
     ["--vocab-size", "at most 2,097,152"]),
    ("a word where a head size belongs", TR + ["--model.d_k", "abc"], ["model.d_k", "integer or null", "abc"]),
    ("a million training threads", TR + ["--train.threads", "1000000"], ["train.threads", "at most 1,024"]),
    ("a folder as the config file", TR + ["--config", "{w}/empty-dir"], ["empty-dir", "not a readable config file"]),
    ("a binary file as the config file", P + ["--train", "ok", "--valid", "ok", "--config",
                                              "{w}/prepared/train.src.tok.npy"],
     ["train.src.tok.npy", "not a readable config file", "invalid UTF-8"]),
]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (links not followed) and its content hash; folders by name."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(Path(dirpath, name), root) + "/"] = ""
        for name in filenames:
            p = Path(dirpath, name)
            out[os.path.relpath(p, root)] = "link" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def cli_results(template, tmp_path_factory) -> dict:
    """All CLI cases, each a process of its own in its own copy of the workspace (tests/cli_forks.py)."""
    work, before = [], []
    for _, argv, _ in CLI_CASES:
        w = tmp_path_factory.mktemp("case") / "w"
        shutil.copytree(template, w, symlinks=True)
        work.append((w, [a.replace("{w}", str(w)) for a in argv]))
        before.append(snapshot(w))
    results = run_many([(argv, w) for w, argv in work])
    return {case[0]: (res, b, snapshot(w)) for case, res, b, (w, _) in zip(CLI_CASES, results, before, work,
                                                                            strict=True)}


def test_a_forked_case_gives_what_python_m_aiayn_gives(template, tmp_path):
    """The harness is faithful: exit status, stdout and stderr as a fresh `python -m aiayn` process's."""
    cases = [["--version"], ["translate", "--no-such-flag"], ["score", "--hyp", "two.txt", "--ref", "one.txt"]]
    results = run_many([(argv, template) for argv in cases])
    assert [r.returncode for r in results] == [0, 2, 2]
    for argv, forked in zip(cases, results, strict=True):
        real = subprocess.run([sys.executable, "-m", "aiayn", *argv], capture_output=True, text=True, cwd=template,
                              timeout=120, stdin=subprocess.DEVNULL)
        assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr), argv


def test_catalog_is_large_enough():
    assert len(CLI_CASES) >= 20 and len({c[0] for c in CLI_CASES}) == len(CLI_CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name,argv,fragments", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(cli_results, name, argv, fragments):
    res, before, after = cli_results[name]
    err = res.stderr
    assert res.returncode == 2, f"exit {res.returncode}\n{err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    errors = [x for x in err.splitlines() if x.startswith(f"aiayn {argv[0]}: error: ")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    assert after == before, "the failed command changed the workspace"  # a run pickle would add MARKER/


def test_no_pickle_was_ever_executed(cli_results, template):
    # Each case ran in its own copy of the workspace, with that copy as the working directory.
    assert all(MARKER not in after for _, _, after in cli_results.values())
    assert not (template / MARKER).exists() and not Path(MARKER).exists()


# -- the Python API ------------------------------------------------------------------------------
def test_python_api_bad_input(template, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path, fragment in [("evil.safetensors", "pickle"), ("fairseq.pt", "pickle"), ("hf.safetensors", "not an aiayn"),
                           ("truncated.safetensors", "readable")]:
        with pytest.raises(CheckpointError, match=fragment):
            Translator.load(template / path)
    with pytest.raises(ConfigError, match="decode.alpha"):
        Translator.load(template / "model.safetensors", alpha=float("inf"))
    t = Translator.load(template / "model.safetensors")
    for kwargs, fragment in [({"beam": 0}, "beam"), ({"alpha": float("nan")}, "alpha"), ({"beam": 10**6}, "beam")]:
        with pytest.raises(ValueError, match=fragment):
            t.translate(["a dog"], **kwargs)
    with pytest.raises(CheckpointError, match="already holds a run"):
        train(tiny_config(max_steps=1), template / "prepared", template / "run")
    assert not (tmp_path / MARKER).exists()


def test_a_config_that_does_not_match_its_weights_allocates_nothing(template):
    """The model a checkpoint's config names is built on the meta device and compared with the
    file's shapes; only a match is built for real."""
    from aiayn.models.build import build_model

    built = []

    def spy(cfg, pieces=None):
        model = build_model(cfg, pieces)
        built.append(next(model.parameters()).device.type)
        return model

    with pytest.raises(CheckpointError, match="shape"):
        Translator.load(template / "wrong-dff.safetensors", build=spy)
    assert built == ["meta"]
    Translator.load(template / "model.safetensors", build=spy)
    assert built == ["meta", "meta", "cpu"]


# -- the HTTP API --------------------------------------------------------------------------------
HTTP_CASES = [
    ("malformed JSON", b"{not json", 422, "json"),
    ("not an object", b'["a dog"]', 422, "body"),
    ("wrong type", b'{"sentences": "a dog"}', 422, "sentences"),
    ("items of the wrong type", b'{"sentences": [1, 2]}', 422, "sentences"),
    ("missing field", b'{"text": ["a dog"]}', 422, "sentences"),
    ("NaN alpha", b'{"sentences": ["a dog"], "alpha": NaN}', 422, "alpha"),
    ("negative alpha", b'{"sentences": ["a dog"], "alpha": -1}', 422, "alpha"),
    ("beam 0", b'{"sentences": ["a dog"], "beam": 0}', 422, "beam"),
    ("oversized beam", b'{"sentences": ["a dog"], "beam": 999}', 413, "beam 999"),
    ("empty list", b'{"sentences": []}', 400, "empty"),
    ("too many sentences", json.dumps({"sentences": ["a"] * 65}).encode(), 413, "too many"),
    ("over-long sentence", json.dumps({"sentences": ["a" * 1001]}).encode(), 413, "1001 characters"),
    ("over-sized body", json.dumps({"sentences": ["a" * 500_000]}).encode(), 413, "limit"),
    ("invalid UTF-8 body", b'{"sentences": ["\xff\xfe"]}', 400, "parsing the body"),
    ("lone surrogate", b'{"sentences": ["a dog", "\\ud800"]}', 422, "not valid Unicode"),
    ("over-long in subwords", json.dumps({"sentences": ["a " * 400]}).encode(), 413, "subwords"),
    ("glossary entry that is no pair", b'{"sentences": ["a dog"], "glossary": [["dog"]]}', 400, "glossary entry 1"),
    ("glossary of too many entries", json.dumps({"sentences": ["a"], "glossary": [["a", "b"]] * 1001}).encode(),
     422, "glossary"),
    ("constraints for other sentences", b'{"sentences": ["a dog"], "constraints": [[], []]}', 400, "constraint lists"),
    ("constraint term too long", json.dumps({"sentences": ["a dog"], "constraints": [["x" * 300]]}).encode(),
     400, "constraint 1"),
    ("too many constraints", json.dumps({"sentences": ["a dog"], "constraints": [["x"] * 40]}).encode(),
     413, "more than 32"),
]


@pytest.fixture(scope="module")
def client(template):
    return TestClient(create_app(Translator.load(template / "model.safetensors"), Limits()))


@pytest.mark.parametrize("name,body,status,fragment", HTTP_CASES, ids=[c[0] for c in HTTP_CASES])
def test_http_bad_input(client, name, body, status, fragment):
    r = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert fragment in json.dumps(r.json()["detail"])
    assert client.get("/health").json()["status"] == "ok"


@pytest.mark.long
@pytest.mark.slow
def test_the_flag_sweep_builds_its_workspace_and_finds_no_traceback(tmp_path):
    """tests/robustness/flag_sweep.py --short on two verbs, the config keys and the keys of an exported MarianMTModel
    folder's JSON files under `import hf`: every case ends in 0 or one line."""
    script = Path(__file__).resolve().parent / "robustness" / "flag_sweep.py"
    res = subprocess.run([sys.executable, str(script), "--verbs", "score,params,config,marian", "--short", "--out",
                          str(tmp_path / "sweep.json")], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    found = json.loads((tmp_path / "sweep.json").read_text())
    table = found["by_verb"]
    for verb, row in table.items():  # every case that ran is listed, to compare two sweeps case by case
        assert len(found.get(f"{verb}_accepted", [])) == row["ran"], verb
    assert all(argv[0] == "score" for argv in found.get("score_accepted", []))
    # score: --hyp --ref --pcfg --lang, and --checkpoint --src --tgt-lang --alpha --device of its force-decoded scores
    assert table["score"]["cases"] == 3 * 9 and table["params"]["cases"] == 3 * 2
    assert table["config"]["cases"] == 3 * len(config_keys()) and table["config"]["one_line_errors"] > 100
    assert table["marian"]["cases"] >= 3 * 30 and table["marian"]["one_line_errors"] > 40  # the counts, the ids
    assert all(row["tracebacks"] == 0 for row in table.values())


@pytest.mark.long
@pytest.mark.slow
def test_damaged_own_files_end_in_one_line_or_run(tmp_path):
    """tests/robustness/damaged_files.py: each file aiayn writes for itself (metrics.jsonl, run.json, config.yaml, the
    training state, manifest.json) damaged eight ways under every verb that reads it: no traceback, no hang
    (a FIFO), and a state whose records unpack past its bound refused before torch allocates them."""
    script = Path(__file__).resolve().parent / "robustness" / "damaged_files.py"
    res = subprocess.run([sys.executable, str(script), "--timeout", "60", "--out", str(tmp_path / "d.json")],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    cases = json.loads((tmp_path / "d.json").read_text())["cases"]
    assert len(cases) == (4 * 2 + 1) * 8 and not any(c["hang"] or c["traceback"] for c in cases)
    bomb = [c for c in cases if c["file"].endswith(".state.pt") and c["damage"] == "deflated 200 MiB"]
    assert bomb[0]["exit"] == 2 and "unpack to 209,715," in bomb[0]["last_line"]  # refused before torch reads it
    assert sum(c["exit"] == 2 for c in cases) >= 30  # most are refused in one line; the rest run (kept aside)
