"""The data behind the pictures (Figures 3-5) and the files written."""

import json

import numpy as np
import pytest
import torch

from aiayn.analysis.plot import plot_attention, plot_curves
from aiayn.cli import main
from aiayn.config import ModelConfig
from aiayn.data.tokenizer import EOS, PAD, Tokenizer
from aiayn.decode.maps import attention_data
from aiayn.decode.translator import Translator
from aiayn.models.transformer import Transformer
from aiayn.training.run_folder import read_metrics


@pytest.fixture
def model_and_tok(toy_prepared):
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), d_model=16, d_ff=32, h=2, N=2, p_drop=0.0, max_positions=40)
    return Transformer(cfg).eval(), tok


def test_attention_maps_are_distributions_with_masks(model_and_tok):
    model, tok = model_and_tok
    d = attention_data(model, tok, "the big dog runs", tgt="der große hund läuft")
    S, T = len(d.src_tokens), len(d.tgt_out_tokens)
    assert d.src_tokens[-1] == "</s>" and d.tgt_in_tokens[0] == "<s>" and d.tgt_out_tokens[-1] == "</s>"
    assert d.encoder_self.shape == (2, 2, S, S)
    assert d.decoder_self.shape == (2, 2, T, T)
    assert d.cross.shape == (2, 2, T, S)
    for maps in (d.encoder_self, d.decoder_self, d.cross):
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
        assert (maps >= 0).all()
    assert np.all(np.triu(d.decoder_self, 1) == 0)  # future positions are masked


def test_padded_keys_get_zero_weight(model_and_tok):
    model, _ = model_and_tok
    src = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    tgt = torch.tensor([[2, 9, 10], [2, 11, PAD]])
    _, maps = model.attention_maps(src, tgt)
    for w in maps.encoder_self + maps.cross:
        assert torch.all(w[1, :, :, 2:] == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_without_target_uses_the_models_translation(model_and_tok, tmp_path):
    model, tok = model_and_tok
    with pytest.raises(ValueError, match="need a translator"):
        attention_data(model, tok, "a small cat sits")
    d = attention_data(model, tok, "a small cat sits", search=Translator(model, tok, precision="fp32"))
    assert d.translation == Translator(model, tok).translate(["a small cat sits"])[0]
    files = plot_attention(d, tmp_path / "maps")
    assert len(files) == 3 * 2 * 2 + 2  # 3 kinds x 2 layers x (png, svg) + the mean
    assert all(f.exists() and f.stat().st_size > 1000 for f in files)
    assert (tmp_path / "maps/cross-layer1.png").read_bytes()[:4] == b"\x89PNG"


def test_curves_from_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "lr": 1e-3 * s, "loss": 5 - s / 10, "nll": 4.0, "ppl": 50.0 - s} for s in range(1, 20)]
    rows += [{"step": 10, "valid_loss": 4.0, "valid_ppl": 30.0, "valid_bleu": 12.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_curves(run, tmp_path / "curves.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(FileNotFoundError):
        plot_curves(tmp_path / "nope", tmp_path / "x.png")


def test_curves_skip_what_is_not_a_row_of_numbers(tmp_path):
    """metrics.jsonl is read as untrusted: a line cut short by a kill, JSON that is not a record, nesting past
    Python's recursion limit, a value that is not a number, a row without a step: skipped, never a traceback."""
    run = tmp_path / "run"
    run.mkdir()
    good = [{"step": s, "lr": 1e-3, "loss": 5.0 - s, "ppl": 40.0} for s in (1, 2)]
    junk = ['{"step": 3, "loss": 2.', "7", "[1, 2]", "[" * 100_000 + "]" * 100_000, '{"loss": 1.0}',
            '{"step": 4, "loss": "x", "ppl": true}', '{"step": 5, "loss": 1.5}']
    (run / "metrics.jsonl").write_text("\n".join([*map(json.dumps, good), *junk]) + "\n")
    assert read_metrics(run) == [*good, {"step": 4}, {"step": 5, "loss": 1.5}]
    assert plot_curves(run, tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"  # row 5 has no ppl: drawn without


def test_plot_cli(toy_prepared, tmp_path, capsys):
    from conftest import tiny_config

    from aiayn.training.session import train

    train(tiny_config(max_steps=5), toy_prepared, tmp_path / "run")
    ckpt = sorted((tmp_path / "run/checkpoints").glob("step-*.safetensors"))[-1]
    assert main(["plot", "attention", "--checkpoint", str(ckpt), "--src", "the dog", "--tgt", "der hund",
                 "-o", str(tmp_path / "att")]) == 0
    assert (tmp_path / "att/cross-mean.svg").exists()
    assert main(["plot", "curves", str(tmp_path / "run"), "-o", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").exists()
    assert main(["plot", "curves", str(tmp_path / "missing"), "-o", str(tmp_path / "c.png")]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err
