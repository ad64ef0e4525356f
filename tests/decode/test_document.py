"""translate --document: paragraphs split into sentences, translated in one batch, joined back; blank lines kept."""

import pytest

from aiayn.cli import main
from aiayn.config import ConfigError
from aiayn.decode.document import sentences, translate_paragraphs
from aiayn.decode.translator import Translator


def test_paragraphs_are_split_translated_in_one_batch_and_joined_back():
    calls = []

    def fake(batch):
        calls.append(list(batch))
        return [f"<{s}>" for s in batch]

    paras = ["Mr. Smith sees a dog. The dog runs!", "", "  One more sentence here.  "]
    assert translate_paragraphs(fake, paras) == ["<Mr. Smith sees a dog.> <The dog runs!>", "",
                                                 "<One more sentence here.>"]
    assert calls == [["Mr. Smith sees a dog.", "The dog runs!", "One more sentence here."]]  # one batch
    assert sentences("   ") == [] and sentences("Ein Hund. Eine Katze.", "de") == ["Ein Hund.", "Eine Katze."]
    with pytest.raises(ConfigError, match="no sentence rules"):
        sentences("x", "xx")


def test_the_cli_translates_a_document_as_its_sentences(toy_prepared, tmp_path):
    from conftest import tiny_config

    import aiayn
    from aiayn.checkpoint import list_checkpoints

    aiayn.train(tiny_config(max_steps=20), str(toy_prepared), str(tmp_path / "run"))
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    src = (toy_prepared / "test.en.txt").read_text().splitlines()[:6]
    doc = [" ".join(s + "." for s in src[:3]), "", " ".join(s + "." for s in src[3:])]
    (tmp_path / "doc.en").write_text("\n".join(doc) + "\n")
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "doc.en"), "-o", str(tmp_path / "o"),
                 "--document", "--precision", "fp32"]) == 0
    t = Translator.load(ckpt, precision="fp32")
    want = [" ".join(t.translate([s + "." for s in src[:3]])), "", " ".join(t.translate([s + "." for s in src[3:]]))]
    assert (tmp_path / "o").read_text().splitlines() == want
