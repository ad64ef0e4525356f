"""Export to Hugging Face Marian: same logits, same tokens, same beam search (a second code path)."""

import importlib.util

import pytest
import torch

from aiayn.checkpoint import model_tensors, save_weights
from aiayn.cli import main
from aiayn.config import Config
from aiayn.data.tokenizer import EOS, PAD, Tokenizer
from aiayn.decode.search import beam_search
from aiayn.models.transformer import Transformer
from aiayn.parsing.model import build_any

transformers = pytest.importorskip("transformers", reason="export needs the optional transformers package")


@pytest.fixture(scope="module")
def exported(toy_prepared, tmp_path_factory):
    """A briefly trained toy model (so hypotheses end by EOS), exported through the CLI."""
    from conftest import tiny_config

    from aiayn.checkpoint import list_checkpoints, load_checkpoint
    from aiayn.training.session import train

    d = tmp_path_factory.mktemp("export")
    cfg = tiny_config(max_steps=300, lr_scale=0.5, warmup_steps=50)
    cfg.model.d_model, cfg.model.d_ff, cfg.model.p_drop, cfg.data.max_tokens = 64, 128, 0.0, 600
    train(cfg, toy_prepared, d / "run")
    ckpt = list_checkpoints(d / "run")[-1]
    model, _, tok, _ = load_checkpoint(ckpt)
    assert main(["export", "hf", "--checkpoint", str(ckpt), "-o", str(d / "hf")]) == 0
    hf = transformers.MarianMTModel.from_pretrained(d / "hf").eval()
    return model, tok, hf, transformers.MarianTokenizer.from_pretrained(d / "hf"), ckpt


@pytest.mark.slow
def test_logits_equal_on_random_batches(exported):
    model, tok, hf, _, _ = exported
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
    _, tok, _, hf_tok, _ = exported
    for s in ["the big dog runs", "a cat sits near the red house"]:
        assert hf_tok(s).input_ids == tok.encode([s])[0] + [EOS]


def test_hf_beam_search_gives_the_same_translations(exported):
    model, tok, hf, hf_tok, _ = exported
    sents = ["the big dog runs", "a cat sits near the red house", "woman", "the man runs to the park"]
    enc = hf_tok(sents, return_tensors="pt", padding=True)
    # alpha = 0: HF's length penalty (score / len^alpha) and GNMT's agree only there.
    # early_stopping="never": stop only when no live beam can still win, aiayn's rule; HF's
    # early_stopping=True stops at the first `beam` finished hypotheses and can miss the best.
    out = hf.generate(**enc, num_beams=4, length_penalty=0.0, max_new_tokens=30, early_stopping="never")
    theirs = hf_tok.batch_decode(out, skip_special_tokens=True)
    ours = beam_search(model, enc.input_ids, beam=4, alpha=0.0, max_len_a=0.0, max_len_b=29)
    assert tok.decode([h[0].tokens for h in ours]) == theirs


def test_export_refuses_what_marian_cannot_hold(toy_prepared, tmp_path, capsys):
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    cfg = Config()
    cfg.model.vocab_size, cfg.model.d_model, cfg.model.d_ff, cfg.model.h, cfg.model.N = len(tok), 16, 32, 2, 1
    cfg.model.pre_norm = True
    save_weights(tmp_path / "p.safetensors", model_tensors(Transformer(cfg.model)), cfg, tok, 0)
    assert main(["export", "hf", "--checkpoint", str(tmp_path / "p.safetensors"), "-o", str(tmp_path / "o")]) == 2
    assert "post-norm" in capsys.readouterr().err
    if importlib.util.find_spec("nltk"):  # a parser that reads part-of-speech tags (tagger.py)
        from aiayn.parsing.tagger import Tagger

        cfg.model.pre_norm, cfg.model.tag_input = False, True
        save_weights(tmp_path / "t.safetensors", model_tensors(build_any(cfg.model)), cfg, tok, 0,
                     {"task": "parse", "tagger": Tagger.train([[("a", "DT")]]).to_json()})
        assert main(["export", "hf", "--checkpoint", str(tmp_path / "t.safetensors"), "-o", str(tmp_path / "o")]) == 2
        assert "model.tag_input parser has inputs Marian and CTranslate2 lack" in capsys.readouterr().err


def test_ctranslate2_gives_the_same_translations(exported, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="export ct2 needs the optional ctranslate2 package")
    model, tok, _, _, ckpt = exported
    assert main(["export", "ct2", "--checkpoint", str(ckpt), "-o", str(tmp_path / "ct2")]) == 0
    sents = ["the big dog runs", "a cat sits near the red house", "woman", "the man runs to the park"]
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    pieces = [tok.pieces(s) + ["</s>"] for s in sents]
    # alpha = 0: CTranslate2's length penalty, like HF's, is not GNMT's form.
    res = ct2.translate_batch(pieces, beam_size=4, length_penalty=0.0, max_decoding_length=30)
    theirs = [tok.sp.decode(r.hypotheses[0]) for r in res]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(x) for x in tok.encode(sents)], batch_first=True)
    src = torch.cat([src, torch.zeros(len(sents), 1, dtype=torch.long)], 1)
    for i, ids in enumerate(tok.encode(sents)):
        src[i, len(ids)] = EOS
    ours = beam_search(model, src, beam=4, alpha=0.0, max_len_a=0.0, max_len_b=30)
    assert all(len(h[0].tokens) < 30 for h in ours)  # ended by EOS, not by the length limit
    assert tok.decode([h[0].tokens for h in ours]) == theirs
