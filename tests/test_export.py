"""Export to Hugging Face Marian: same logits, same tokens, same beam search (a second code path)."""

import pytest
import torch

from aiayn.checkpoint import model_tensors, save_weights
from aiayn.cli import main
from aiayn.config import Config
from aiayn.model import Transformer
from aiayn.search import beam_search
from aiayn.tokenizer import EOS, PAD, Tokenizer

transformers = pytest.importorskip("transformers", reason="export needs the optional transformers package")


@pytest.fixture(scope="module")
def exported(toy_prepared, tmp_path_factory):
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    cfg = Config()
    m = cfg.model
    m.vocab_size, m.d_model, m.d_ff, m.h, m.N, m.p_drop, m.max_positions = len(tok), 32, 64, 4, 2, 0.0, 128
    torch.manual_seed(0)
    model = Transformer(m).eval()
    with torch.no_grad():
        model.out_proj.weight.mul_(4.0)  # confident outputs: beam search has real choices to make
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))  # non-trivial biases and LayerNorm gains
    d = tmp_path_factory.mktemp("export")
    save_weights(d / "m.safetensors", model_tensors(model), cfg, tok, 0)
    assert main(["export", "hf", "--checkpoint", str(d / "m.safetensors"), "-o", str(d / "hf")]) == 0
    hf = transformers.MarianMTModel.from_pretrained(d / "hf").eval()
    return model, tok, hf, transformers.MarianTokenizer.from_pretrained(d / "hf")


def test_logits_equal_on_random_batches(exported):
    model, tok, hf, _ = exported
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        src = torch.randint(4, len(tok), (3, 9), generator=g)
        tgt = torch.randint(4, len(tok), (3, 7), generator=g)
        src[1, 6:], src[2, 3:] = PAD, PAD
        src[0, -1], src[1, 5], src[2, 2] = EOS, EOS, EOS
        tgt[:, 0] = 2
        with torch.no_grad():
            ours = model(src, tgt)
            theirs = hf(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
        torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


def test_tokenizer_matches(exported):
    _, tok, _, hf_tok = exported
    for s in ["the big dog runs", "a cat sits near the red house"]:
        assert hf_tok(s).input_ids == tok.encode([s])[0] + [EOS]


def test_hf_beam_search_gives_the_same_translations(exported):
    model, tok, hf, hf_tok = exported
    sents = ["the big dog runs", "a cat sits near the red house", "woman", "the man runs to the park"]
    enc = hf_tok(sents, return_tensors="pt", padding=True)
    # alpha = 0: HF's length penalty (score / len^alpha) and GNMT's agree only there.
    out = hf.generate(**enc, num_beams=4, length_penalty=0.0, max_new_tokens=12, early_stopping=True)
    theirs = hf_tok.batch_decode(out, skip_special_tokens=True)
    ours = beam_search(model, enc.input_ids, beam=4, alpha=0.0, max_len_a=0.0, max_len_b=11)
    assert tok.decode([h[0].tokens for h in ours]) == theirs


def test_export_refuses_what_marian_cannot_hold(toy_prepared, tmp_path, capsys):
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    cfg = Config()
    cfg.model.vocab_size, cfg.model.d_model, cfg.model.d_ff, cfg.model.h, cfg.model.N = len(tok), 16, 32, 2, 1
    cfg.model.pre_norm = True
    save_weights(tmp_path / "p.safetensors", model_tensors(Transformer(cfg.model)), cfg, tok, 0)
    assert main(["export", "hf", "--checkpoint", str(tmp_path / "p.safetensors"), "-o", str(tmp_path / "o")]) == 2
    assert "post-norm" in capsys.readouterr().err
