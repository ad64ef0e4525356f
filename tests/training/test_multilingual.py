"""One model, several directions (data/directions.py, Johnson et al. 2017): a run mixing them at a
temperature resumes bit-identically after SIGKILL in another process, validates each direction, and
its checkpoint translates into the language each line asks for — batched as one by one, with mixed
targets in one batch — and refuses one it does not know, from Python, the command line and HTTP."""

import json
import subprocess

import pytest
from conftest import TINY, aiayn, toy_multilingual
from test_resume import final_bytes, kill_after_step_15, resume

from aiayn.cli import main
from aiayn.config import ConfigError
from aiayn.data.directions import prepare_many
from aiayn.decode.beams import Hypothesis
from aiayn.decode.translator import Translator
from aiayn.device import int8_kernel

pytestmark = pytest.mark.slow
MIX = ["--data.mix_temperature", "3", "--train.valid_every", "20", "--train.valid_bleu_sentences", "6"]


@pytest.fixture(scope="module")
def prepared(toy_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("mlrun")
    src = toy_multilingual(toy_corpus, d / "text")
    # French with a quarter of the training pairs: the temperature has something to even out
    (src / "small.en").write_text("".join(x + "\n" for x in (src / "train.en").read_text().splitlines()[:100]))
    (src / "small.fr").write_text("".join(x + "\n" for x in (src / "train.fr").read_text().splitlines()[:100]))
    files = {("en", "de"): {"train": (src / "train.en", src / "train.de")},
             ("en", "fr"): {"train": (src / "small.en", src / "small.fr")}}
    for (s, t), splits in files.items():
        splits["valid"] = (src / f"valid.{s}", src / f"valid.{t}")
        splits["test"] = (src / f"test.{s}", src / f"test.{t}")
    prepare_many(files, d / "prep", 90, max_len=64)
    return src, d / "prep"


@pytest.fixture(scope="module")
def straight_run(prepared, tmp_path_factory):
    run = tmp_path_factory.mktemp("mlstraight") / "run"
    subprocess.run(aiayn("train", "--data", str(prepared[1]), "--run-dir", str(run), *TINY, *MIX), check=True,
                   capture_output=True, timeout=300)
    return run


def test_a_mixed_run_resumes_bit_identically_and_validates_each_direction(prepared, straight_run, tmp_path):
    run = tmp_path / "run"
    kill_after_step_15(aiayn("train", "--data", str(prepared[1]), "--run-dir", str(run), *TINY, *MIX), run)
    assert "resumed from step-000000" in resume(run).stderr
    assert final_bytes(run) == final_bytes(straight_run)
    valid = [json.loads(x) for x in (straight_run / "metrics.jsonl").read_text().splitlines() if "valid_loss" in x]
    assert valid and all({"valid_bleu_en-de", "valid_bleu_en-fr"} <= set(r) for r in valid)
    for r in valid:
        assert r["valid_bleu"] == pytest.approx((r["valid_bleu_en-de"] + r["valid_bleu_en-fr"]) / 2)
    assert main(["plot", "curves", "--run-dir", str(straight_run), "-o", str(tmp_path / "c.png")]) == 0


def test_the_checkpoint_translates_into_the_language_asked_for(prepared, straight_run, tmp_path, capsys):
    src_dir, _ = prepared
    ckpt = straight_run / "checkpoints" / "last.safetensors"
    t = Translator.load(ckpt, precision="fp32", max_len_b=10)
    assert t.target_languages() == ["de", "fr"] and t.directions == ["en-de", "en-fr"]
    src = (src_dir / "test.en").read_text().splitlines()[:8]
    de, fr = t.translate(src, tgt_lang="de"), t.translate(src, tgt_lang="fr")
    assert t.encode_sources(src[:1], tgt_lang="de")[0][0] == t.tokenizer.tag_id("de")
    mixed = [f"<2{lang}> {s}" for s, lang in zip(src, ["de", "fr"] * 4)]  # one batch, two targets
    assert t.translate(mixed) == [de[i] if i % 2 == 0 else fr[i] for i in range(8)]
    assert t.translate(mixed) == [t.translate([m])[0] for m in mixed]
    with pytest.raises(ConfigError, match="translates into de, fr: name the target"):
        t.translate(src[:2])
    with pytest.raises(ConfigError, match="'cs'.*de, fr"):
        t.translate(src[:2], tgt_lang="cs")
    ids = t.encode_sources(src, tgt_lang="fr")
    refs = t.tokenizer.encode_target((src_dir / "test.fr").read_text().splitlines()[:8])
    for attended in (None, 0):  # as teacher-forced, or as a search that found the tag most attended
        hyps = [[Hypothesis(r, 0.0, None if attended is None else [attended] * len(r))] for r in refs]
        for links, line in zip(t.align(ids, hyps), src):  # the tag is no source word: never linked to
            assert links and all(0 <= i < len(line.split()) for i, _ in links)
    (tmp_path / "in.en").write_text("".join(s + "\n" for s in src))
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in.en"), "--tgt-lang", "fr",
                 "--precision", "fp32", "--max-len-b", "10"]) == 0
    assert capsys.readouterr().out.splitlines() == fr
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in.en"), "--precision", "fp32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "de, fr" in err[0]


def test_the_server_routes_a_request_to_its_target_language(straight_run, prepared):
    from fastapi.testclient import TestClient

    from aiayn.serve.app import create_app

    t = Translator.load(straight_run / "checkpoints" / "last.safetensors", precision="fp32", max_len_b=10)
    client = TestClient(create_app(t))
    model = client.get("/health").json()["model"]
    assert model["target_languages"] == ["de", "fr"] and model["directions"] == ["en-de", "en-fr"]
    src = (prepared[0] / "test.en").read_text().splitlines()[:3]
    for lang in ("de", "fr"):
        r = client.post("/translate", json={"sentences": src, "tgt": lang})
        assert r.status_code == 200 and r.json()["translations"] == t.translate(src, tgt_lang=lang)
    r = client.post("/translate", json={"sentences": src, "tgt": "fr", "alignments": True})
    assert r.status_code == 200 and len(r.json()["alignments"]) == 3
    r = client.post("/translate", json={"sentences": ["the <b>dog</b> runs"], "tgt": "fr", "markup": True})
    assert r.status_code == 200 and r.json()["translations"][0].count("<b>") <= 1  # tags put back, none invented
    r = client.post("/translate", json={"sentences": src})
    assert r.status_code in (400, 422) and "de, fr" in r.json()["detail"]


def test_tune_chooses_a_setting_for_each_target_language(straight_run, tmp_path, capsys):
    """`aiayn tune` on a multilingual run: a grid per target language on its own validation set, each
    language's choice its best point, and translating into a language takes its setting."""
    from aiayn.checkpoint import read_extra

    ckpt, out = straight_run / "checkpoints" / "last.safetensors", tmp_path / "tuned.safetensors"
    assert main(["tune", "--checkpoint", str(ckpt), "--beams", "1,2", "--alphas", "0,1", "--sentences", "6",
                 "-o", str(out), "--precision", "fp32"]) == 0
    tuned = read_extra(out)["tuned"]
    assert set(tuned["by_language"]) == {"de", "fr"}
    for lang, entry in tuned["by_language"].items():
        best = max(entry["points"], key=lambda p: p["bleu"])
        assert entry["chosen"]["bleu"] == best["bleu"] and len(entry["points"]) == 4, lang
    t = Translator.load(out, precision="fp32")
    for lang, entry in tuned["by_language"].items():
        chosen = entry["chosen"]
        assert t.setting_for(None, None, lang) == (chosen["beam"], chosen["alpha"])
        assert t.setting_for(3, None, lang) == (3, chosen["alpha"])  # what a call names wins


def test_the_tag_is_read_by_the_decoder_by_default_and_by_the_source_when_asked(prepared, straight_run, toy_prepared,
                                                                                  tmp_path, capsys):
    """model.lang_tag auto: a run on several directions' data reads the tag in the decoder (fairseq's
    --decoder-langtok; measured better on validation), recorded as such, and so every test above
    runs it; `source` (Johnson et al. 2017) still trains and translates, batched as one by one with
    mixed targets; int8 starts from the tag too; one direction's data with `decoder` is one line."""
    from aiayn.checkpoint import read_meta, read_metadata

    def lang_tag(run):
        ckpt = run / "checkpoints" / "last.safetensors"
        return read_meta(read_metadata(ckpt), ckpt)[0].model.lang_tag

    assert lang_tag(straight_run) == "decoder" and "lang_tag: decoder" in (straight_run / "config.yaml").read_text()
    src = (prepared[0] / "test.en").read_text().splitlines()[:8]
    mixed = [f"<2{lang}> {s}" for s, lang in zip(src, ["de", "fr"] * 4)]
    if int8_kernel():
        q = Translator.load(straight_run / "checkpoints" / "last.safetensors", precision="int8", max_len_b=10)
        assert q.translate(mixed) == [q.translate([m])[0] for m in mixed]
        assert q.translate(src, tgt_lang="de") != q.translate(src, tgt_lang="fr")  # the encoder never sees it
    run = tmp_path / "run"
    assert main(["train", "--data", str(prepared[1]), "--run-dir", str(run), *TINY, *MIX,
                 "--model.lang_tag", "source"]) == 0
    assert lang_tag(run) == "source"
    t = Translator.load(run / "checkpoints" / "last.safetensors", precision="fp32", max_len_b=10)
    de, fr = t.translate(src, tgt_lang="de"), t.translate(src, tgt_lang="fr")  # (after 40 updates: mostly empty)
    refs = (prepared[0] / "test.de").read_text().splitlines()[:8]
    assert t.score(src, refs, "de") != t.score(src, refs, "fr")  # the encoder reads the tag
    assert t.translate(mixed) == [de[i] if i % 2 == 0 else fr[i] for i in range(8)]
    assert t.translate(mixed) == [t.translate([m])[0] for m in mixed]
    capsys.readouterr()
    assert main(["train", "--data", str(toy_prepared), "--run-dir", str(tmp_path / "one"), *TINY,
                 "--model.lang_tag", "decoder"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one direction's data" in err[0]
