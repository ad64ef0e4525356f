"""End to end through the command line: prepare -> train -> average -> translate -> score."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from conftest import kill_after_parts

from aiayn.cli import main


@pytest.fixture(scope="module")
def trained(toy_corpus, tmp_path_factory):
    work = tmp_path_factory.mktemp("e2e")
    prep, run = work / "prep", work / "run"
    assert main(["prepare", "--data-dir", str(toy_corpus), "--src", "en", "--tgt", "de", "--out", str(prep),
                 "--test", "test", "--data.vocab_size", "60"]) == 0
    assert main(["train", "--data", str(prep), "--run", str(run), "--model.d_model", "64", "--model.d_ff", "128",
                 "--model.h", "4", "--model.N", "2", "--model.p_drop", "0", "--train.max_steps", "300",
                 "--train.warmup_steps", "50", "--train.lr_scale", "0.5", "--data.max_tokens", "600",
                 "--train.save_every", "20", "--train.valid_every", "150", "--train.valid_bleu_sentences", "10",
                 "--train.threads", "1", "--train.tokens_per_update", "0"]) == 0
    assert main(["average", str(run), "--last", "3", "-o", str(work / "avg.safetensors")]) == 0
    return work, prep


def test_prepare_reads_the_languages_off_explicit_files(toy_corpus, tmp_path, capsys):
    """--train SRC_FILE,TGT_FILE without --src/--tgt: the files' suffixes name the languages, in the pair's
    order (de -> en here); a suffix that is no language (.txt) needs --src/--tgt, one line saying so."""
    c, out = toy_corpus, tmp_path / "p"
    assert main(["prepare", "--train", f"{c}/train.de,{c}/train.en", "--valid", f"{c}/valid", "--out", str(out),
                 "--data.vocab_size", "60"]) == 0
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert (settings["src"], settings["tgt"]) == ("de", "en")
    assert (out / "valid.de.txt").read_text() == (c / "valid.de").read_text()  # the prefix split read as de
    (tmp_path / "train.txt").write_text((c / "train.en").read_text())
    capsys.readouterr()
    assert main(["prepare", "--train", f"{tmp_path}/train.txt,{c}/train.de", "--valid", f"{c}/valid", "--out",
                 str(tmp_path / "q")]) == 2
    assert "prepare needs --src and --tgt" in capsys.readouterr().err and not (tmp_path / "q").exists()


@pytest.mark.slow
def test_translate_and_score_agree_with_sacrebleu(trained, capsys):
    work, prep = trained
    hyp, ref = work / "hyp.txt", prep / "test.de.txt"
    assert main(["translate", "--checkpoint", str(work / "avg.safetensors"), "--input", str(prep / "test.en.txt"),
                 "--output", str(hyp)]) == 0
    hyps = hyp.read_text().splitlines()
    refs = ref.read_text().splitlines()
    assert len(hyps) == len(refs) == 20
    capsys.readouterr()
    assert main(["score", "--hyp", str(hyp), "--ref", str(ref)]) == 0
    out = capsys.readouterr().out
    expected = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert f"BLEU = {expected:.2f}" in out and "chrF2" in out and "version:" in out
    assert expected > 20  # the toy task is word-for-word: the model must have learned it


@pytest.mark.slow
def test_translate_stdin_nbest_and_greedy(trained, tmp_path):
    work, _ = trained
    cmd = [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(work / "avg.safetensors")]
    res = subprocess.run(cmd + ["--nbest", "2"], input="the big dog runs\n\na cat\n", capture_output=True,
                         text=True, check=True)
    rows = res.stdout.split("\n")[:-1]
    assert len(rows) == 6  # 3 lines x 2 hypotheses
    assert rows[2] == "\t" and rows[3] == "\t"  # the empty line keeps its place
    first, second = float(rows[0].split("\t")[1]), float(rows[1].split("\t")[1])
    assert first >= second
    greedy = subprocess.run(cmd + ["--beam", "1"], input="the big dog runs\n", capture_output=True, text=True,
                            check=True)
    assert greedy.stdout.count("\n") == 1


def test_translate_with_several_checkpoints_decodes_their_ensemble(trained, tmp_path):
    """The same model twice is the model (mean of equal log-probabilities); the run's last checkpoint
    beside the average is another ensemble, decoded without complaint, one line per input line."""
    work, prep = trained
    src, avg = str(prep / "test.en.txt"), str(work / "avg.safetensors")
    last = str(sorted((work / "run" / "checkpoints").glob("step-*.safetensors"))[-1])
    for name, ckpts in (("one", [avg]), ("twice", [avg, avg]), ("two", [avg, last])):
        assert main(["translate", "--checkpoint", *ckpts, "-i", src, "-o", str(tmp_path / name),
                     "--precision", "fp32"]) == 0
    assert (tmp_path / "twice").read_text() == (tmp_path / "one").read_text()
    assert len((tmp_path / "two").read_text().splitlines()) == len(Path(src).read_text().splitlines())
    assert main(["translate", "--checkpoint", avg, str(tmp_path / "none.safetensors"), "-i", src]) == 2


@pytest.mark.slow
def test_a_pipe_is_translated_while_its_writer_is_still_writing(trained):
    """`producer | aiayn translate`: a full chunk of input is translated and written before the
    producer has finished (before EOF), and the lines that come after it follow when it does."""
    import select

    from aiayn.cli.decoding import STREAM_LINES

    work, _ = trained
    cmd = [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(work / "avg.safetensors"), "--beam", "1"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"the big dog runs\n" * STREAM_LINES)
        proc.stdin.flush()  # the pipe stays open: no EOF yet
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline().strip(), "nothing translated before the input ended"
        assert proc.poll() is None
        proc.stdin.write(b"a cat\n\nthe dog\n")
        proc.stdin.close()
        rest = proc.stdout.read().decode().split("\n")
        assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()
    assert len(rest) == STREAM_LINES - 1 + 3 + 1 and rest[-1] == "" and rest[-3] == ""  # ... "a cat", "", "the dog"


def test_input_is_read_in_chunks_as_the_text_splits_into_lines(tmp_path):
    """The chunked reader (and the whole-file reader built on it) gives the lines str.split("\\n")
    gives (a CR before LF dropped, no line after a final newline, empty lines kept, NFC), whatever
    the chunk size, and names the line of invalid UTF-8."""
    import unicodedata

    from aiayn.cli.common import UserError, input_chunks, read_input

    f = tmp_path / "in.txt"
    for data in (b"", b"\n", b"a\r\n\nb", "caf\u0065\u0301\nx\r\r\n\n\n".encode(), b"one\ntwo\nthree\n"):
        f.write_bytes(data)
        text = data.decode()
        expected = [unicodedata.normalize("NFC", x.rstrip("\r")) for x in text.split("\n")]
        expected = expected[:-1] if text.endswith("\n") or not text else expected
        assert read_input(str(f)) == expected
        for size in (1, 2, 3, 5000):
            chunks = list(input_chunks(str(f), size))
            assert [x for c in chunks for x in c] == expected
            assert all(len(c) == size for c in chunks[:-1]) and all(chunks)
    f.write_bytes(b"ok\nfine\n\xff\xfe\nlater\n")
    for read in (lambda: list(input_chunks(str(f), 2)), lambda: read_input(str(f))):
        with pytest.raises(UserError, match=r"in\.txt:3: invalid UTF-8"):
            read()
    with pytest.raises(UserError, match="input file not found"):
        list(input_chunks(str(tmp_path / "absent.txt"), 2))


@pytest.mark.slow
def test_translations_reach_stdout_as_they_go_and_a_closed_pipe_ends_it_quietly(trained):
    """`aiayn translate ... | head -1`: the first chunk's translations are out while the rest are still
    being translated; then the reader leaves and aiayn stops quietly at its next write (exit 141, as a
    shell reports SIGPIPE) instead of translating on or printing a BrokenPipeError traceback."""
    from aiayn.cli.decoding import STREAM_LINES

    work, _ = trained
    src = work / "many.en.txt"  # a file: stdin is read as translation goes, and nobody reads stdout yet
    src.write_bytes(b"the big dog runs\n" * (3 * STREAM_LINES))
    cmd = [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(work / "avg.safetensors"), "--beam", "1"]
    with open(src, "rb") as stdin:
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    assert first.strip() and proc.poll() is None, "no output before the last translation"
    proc.stdout.close()  # the reader leaves: the next chunk's write meets a closed pipe
    assert proc.wait(timeout=300) == 141
    err = proc.stderr.read()
    assert b"Traceback" not in err and b"Exception ignored" not in err, err.decode()


def test_a_file_and_stdout_get_the_same_translations_chunk_by_chunk(trained, tmp_path, capsys, monkeypatch):
    """translate works through its input STREAM_LINES sources at a time (stdout gets each chunk as it is
    done): --output gets the same text, and n-best lists and empty lines keep their places across chunks."""
    import aiayn.cli.decoding as decoding

    work, _ = trained
    monkeypatch.setattr(decoding, "STREAM_LINES", 3)
    src = tmp_path / "in.txt"
    src.write_text("the big dog runs\n\na cat\nthe dog\nthe big cat sleeps\na dog\nthe cat runs\n")
    for extra in ([], ["--nbest", "2"]):
        argv = ["translate", "--checkpoint", str(work / "avg.safetensors"), "--input", str(src), "--precision", "fp32",
                *extra]
        assert main(argv) == 0
        streamed = capsys.readouterr().out
        assert main([*argv, "-o", str(tmp_path / "out.txt")]) == 0
        assert (tmp_path / "out.txt").read_text() == streamed and len(streamed.splitlines()) == 7 * (len(extra) or 1)
        (tmp_path / "out.txt").unlink()
    monkeypatch.setattr(decoding, "STREAM_LINES", 5000)
    assert main(argv) == 0
    assert capsys.readouterr().out == streamed  # one chunk: the same (in fp32 a sentence's batch does not matter)


def test_score_rejects_mismatched_files(tmp_path, capsys):
    (tmp_path / "h").write_text("a\nb\n")
    (tmp_path / "r").write_text("a\n")
    assert main(["score", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r")]) == 2
    assert "2 lines" in capsys.readouterr().err


def test_bad_override_is_a_clear_error(toy_corpus, tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path), "--run", str(tmp_path / "r"), "--train.warmup", "3"]) == 2
    assert "train.warmup" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path), "--run", str(tmp_path / "r")]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_shortlist_command_and_translate_with_it(trained, tmp_path, capsys):
    """`aiayn shortlist` then `translate --shortlist`: one that holds every subword translates as
    without one; one that holds few keeps each sentence in its own set; a foreign one is refused."""
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.decode.shortlist import Shortlist, vocabulary_id
    from aiayn.decode.translator import Translator

    work, prep = trained
    ckpt, src = str(work / "avg.safetensors"), str(prep / "test.en.txt")
    outs = {}
    for name, flags in (("none", []), ("all", ["--per-source", "60", "--frequent", "60"]),
                        ("few", ["--per-source", "2", "--frequent", "0"])):
        extra = []
        if name != "none":
            assert main(["shortlist", "--data", str(prep), "-o", str(tmp_path / f"{name}.st"), *flags]) == 0
            extra = ["--shortlist", str(tmp_path / f"{name}.st")]
        assert main(["translate", "--checkpoint", ckpt, "-i", src, "-o", str(tmp_path / name), *extra]) == 0
        outs[name] = (tmp_path / name).read_text().splitlines()
    assert outs["all"] == outs["none"]
    tok = Tokenizer((prep / "spm.model").read_bytes())
    few = Shortlist.load(tmp_path / "few.st", tok.proto)
    lines = (prep / "test.en.txt").read_text().splitlines()
    translator = Translator.load(ckpt, shortlist=tmp_path / "few.st")
    for line, hyps, out in zip(lines, translator.hypotheses(lines), outs["few"]):
        allowed = set(few.table[tok.encode([line])[0]].flatten().tolist()) | {0, 1, 2, 3}
        assert set(hyps[0].ids) <= allowed and hyps[0].text == out, (line, out)
    Shortlist(few.table, few.frequent, vocabulary_id(b"another model")).save(tmp_path / "foreign.st")
    capsys.readouterr()
    assert main(["translate", "--checkpoint", ckpt, "-i", src, "--shortlist", str(tmp_path / "foreign.st")]) == 2
    err = capsys.readouterr().err
    assert "foreign.st: built for another vocabulary" in err and "Traceback" not in err
    assert main(["shortlist", "--data", str(prep), "-o", str(tmp_path / "x.st"), "--per-source", "0"]) == 2
    assert "--per-source must be in [1, 1024]" in capsys.readouterr().err
    assert main(["shortlist", "--data", str(tmp_path), "-o", str(tmp_path / "x.st")]) == 2  # not prepared data
    assert "no manifest.json" in capsys.readouterr().err and not (tmp_path / "x.st").exists()


@pytest.mark.parametrize("argv", [["translate", "--checkpoint", "a.safetensors", "b.safetensors", "--input", "x"],
                                  ["export", "hf", "--checkpoint", "a.safetensors", "-o", "ex"],
                                  ["heads", "--checkpoint", "a.safetensors", "--data", "d", "-o", "h"],
                                  ["serve", "--checkpoint", "a.safetensors"],
                                  ["tune", "--checkpoint", "a.safetensors", "--data", "d"]])
def test_a_missing_checkpoint_is_named_before_torch_is_imported(argv, tmp_path):
    """A mistyped --checkpoint is one line at once: no verb has imported torch (1-4 s) by then."""
    code = ("import sys; from aiayn.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and res.stdout.strip() == "False", res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [f"aiayn {argv[0]}: error: --checkpoint a.safetensors: no such file "
                                               "(checkpoint not found)"]


def test_the_decoder_step_is_the_users_choice_and_the_same_translations(trained, tmp_path, caplog):
    """translate --step: the modules' step and the fused one (fp32: identical logits) translate alike,
    and the log says which step ran and why."""
    work, prep = trained
    outs = {}
    for step in ("modules", "fused"):
        caplog.clear()
        with caplog.at_level("INFO", logger="aiayn"):
            assert main(["translate", "--checkpoint", str(work / "avg.safetensors"), "-i", str(prep / "test.en.txt"),
                         "-o", str(tmp_path / f"{step}.de"), "--precision", "fp32", "--step", step]) == 0
        assert f"decoder step: {step} (decode.step {step})" in caplog.text
        outs[step] = (tmp_path / f"{step}.de").read_text()
    assert outs["modules"] == outs["fused"] and outs["fused"].strip()


def test_train_help_explains_every_key_with_the_chosen_presets_values(capsys):
    """train --help --preset NAME: every config key, its value in that preset and one line from
    config.py's comment beside the field; the preset names listed once."""
    from aiayn.overrides import config_keys, descriptions, preset

    with pytest.raises(SystemExit):
        main(["train", "--preset", "quick", "--help"])
    text = capsys.readouterr().out
    keys = config_keys(preset("quick"))
    assert all(descriptions()[k] for k in keys)  # no key without a description
    for key, value in keys.items():
        line = next(x for x in text.splitlines() if x.strip().startswith(f"{key} = "))
        assert line.strip().startswith(f"{key} = {value!r}") and descriptions()[key].split()[0] in line, line
    assert text.count("table3-A-h16") == 1  # the preset list once


def test_config_prints_yaml_with_a_comment_per_key_that_reads_back(capsys):
    import yaml

    from aiayn.overrides import from_dict, preset

    assert main(["config", "--preset", "multi30k", "--train.max_steps", "7"]) == 0
    text = capsys.readouterr().out
    cfg = from_dict(yaml.safe_load(text))
    want = preset("multi30k")
    want.train.max_steps = 7
    assert cfg.to_dict() == want.to_dict()
    assert "  d_model: 256  # §3" in text and text.startswith("# aiayn config: --preset multi30k")


def test_an_override_whose_value_looks_like_a_flag_is_a_value(capsys):
    assert main(["config", "--train.guided_layer", "-1", "--model.N=2"]) == 0
    assert "  guided_layer: -1" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "hint"), [
    (["train", "--presets", "multi30k"], "did you mean --preset?"),
    (["prepare", "--vocab-size", "8000", "-o", "x"], "did you mean --data.vocab_size?"),
    (["translate", "--beam-size", "4", "--checkpoint", "x"], "did you mean --beam?"),
    (["train", "--preset", "multi30K"], "unknown preset 'multi30K'; did you mean multi30k?"),
    (["trian"], "no verb 'trian'; did you mean train?"),
])
def test_a_mistyped_flag_preset_or_verb_gets_one_line_with_the_closest(argv, hint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and hint in err[0], err


def test_folders_given_as_a_checkpoint_or_an_input_are_named_before_a_model_loads(trained, tmp_path):
    """A run's checkpoints folder and a folder given as --input: one line each, naming the file to give,
    before torch is imported."""
    work, _ = trained
    code = ("import sys; from aiayn.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules); sys.exit(rc)")
    for argv, said in (
            (["translate", "--checkpoint", str(work / "run" / "checkpoints")],
             [f"{work / 'run' / 'checkpoints' / 'best.safetensors'} or", "last.safetensors", "aiayn average"]),
            (["translate", "--checkpoint", str(work / "avg.safetensors"), "-i", str(tmp_path)],
             [f"--input {tmp_path}: a folder, not a text file"])):
        res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and res.stdout.strip() == "False", res.stderr
        line = res.stderr.strip().splitlines()
        assert len(line) == 1 and all(s in line[0] for s in said), line


def test_last_is_the_newest_checkpoint_and_translates(trained, capsys):
    work, prep = trained
    ckpts = work / "run" / "checkpoints"
    newest = sorted(ckpts.glob("step-*.safetensors"))[-1]
    assert (ckpts / "last.safetensors").read_bytes() == newest.read_bytes()
    from aiayn.decode.translator import Translator

    assert Translator.load(ckpts / "last.safetensors").languages == ("en", "de")  # for the server and its page
    assert main(["translate", "--checkpoint", str(ckpts / "last.safetensors"), "-i", str(prep / "test.en.txt")]) == 0
    assert capsys.readouterr().out.count("\n") == len((prep / "test.en.txt").read_text().splitlines())


def test_markup_nested_past_its_bound_is_one_line_naming_the_line(trained, tmp_path, capsys):
    """1,000 nested tags (once a RecursionError traceback): exit 2, one line, the line named."""
    work, _ = trained
    f = tmp_path / "deep.txt"
    f.write_text("a <b>dog</b>\n" + "<b>" * 1000 + "dog" + "</b>" * 1000 + "\n")
    assert main(["translate", "--checkpoint", str(work / "avg.safetensors"), "-i", str(f), "--markup"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 2: tags nested deeper than 64" in err[0] and "Traceback" not in err[0], err


@pytest.mark.slow
def test_a_translation_killed_part_way_resumes_and_gives_the_uninterrupted_bytes(toy_prepared, tmp_path):
    """`translate -o` of 300 lines in chunks of 20, SIGKILLed in another process once some chunks are
    kept in OUTPUT.parts/: run again, it translates only the rest and writes what a run never killed
    writes (translations, alignments, quality), then removes the parts; other settings start anew."""
    import signal
    import time

    import torch

    from aiayn.checkpoint import model_tensors, save_weights
    from aiayn.config import Config
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.models.transformer import Transformer

    tok, cfg = Tokenizer.load(str(toy_prepared / "spm.model")), Config()
    cfg.model.vocab_size, cfg.model.d_model, cfg.model.d_ff, cfg.model.h, cfg.model.N = len(tok), 32, 64, 4, 2
    torch.manual_seed(0)
    ckpt = tmp_path / "m.safetensors"
    save_weights(ckpt, model_tensors(Transformer(cfg.model)), cfg, tok, 0)
    lines = (toy_prepared / "valid.en.txt").read_text().splitlines() * 15
    (tmp_path / "in").write_text("".join(x + "\n" for x in lines))

    def cmd(out: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in"),
                "-o", str(tmp_path / out), "--alignments", str(tmp_path / f"{out}.al"), "--quality",
                str(tmp_path / f"{out}.q"), "--chunk-lines", "20", "--precision", "fp32", "--beam", "2",
                "--max-len-b", "10", *extra]

    subprocess.run(cmd("straight"), check=True, capture_output=True, timeout=300)
    parts = tmp_path / "killed.parts"
    kept = kill_after_parts(cmd("killed"), parts)
    assert not (tmp_path / "killed").exists() and 3 <= kept < 15
    res = subprocess.run(cmd("killed"), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-1500:]
    assert f"{kept} chunk(s) already translated" in res.stderr
    for suffix in ("", ".al", ".q"):
        assert (tmp_path / f"killed{suffix}").read_bytes() == (tmp_path / f"straight{suffix}").read_bytes(), suffix
    assert not parts.exists()
    proc = subprocess.Popen(cmd("again"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a kill, then
    while not list((tmp_path / "again.parts").glob("[0-9]*.json")):  # a rerun with another beam: anew
        assert proc.poll() is None, "the translation ended before the kill"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = subprocess.run(cmd("again", "--beam", "1"), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "translating anew" in res.stderr and "already translated" not in res.stderr
