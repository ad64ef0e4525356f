"""Pretrained Marian models (`aiayn import hf`) against Hugging Face's own code: the same subword
ids as MarianTokenizer, the same logits and the same greedy and beam outputs as MarianMTModel."""

import gzip
import io
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from aiayn.checkpoint import list_checkpoints, read_weights
from aiayn.cli import main
from aiayn.config import ConfigError
from aiayn.data.tokenizer import BOS, EOS
from aiayn.decode.search import beam_search
from aiayn.decode.translator import Translator

transformers = pytest.importorskip("transformers", reason="import hf is tested against the transformers package")
MULTI30K = Path(__file__).resolve().parents[2] / "shared/data/multi30k"
VARIANTS = {  # OPUS-MT's usual configuration, and the options a Marian config may name
    "opus-mt": {"activation_function": "swish", "scale_embedding": True},
    "gelu-unshared": {"activation_function": "gelu", "scale_embedding": True,
                      "share_encoder_decoder_embeddings": False},
    "relu-unscaled": {"activation_function": "relu", "scale_embedding": False},
}


def _lines(name: str, n: int | None = None) -> list[str]:
    if not (MULTI30K / f"{name}.gz").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    with gzip.open(MULTI30K / f"{name}.gz", "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return lines[:n] if n else lines


def make_marian(out: Path, seed: int = 0, codes: tuple[str, ...] = (), **config) -> Path:
    """A MarianMTModel folder as OPUS-MT publishes them: separate source/target SentencePiece
    models (unigram, trained on Multi30k) over one vocab.json with </s> 0, <unk> 1, <pad> last;
    random weights (std 0.2, so outputs are not uniform) and a random final_logits_bias. `codes`:
    target-language codes in the vocabulary (`>>fra<<`), as a multilingual model has them."""
    import sentencepiece as spm

    out.mkdir(parents=True, exist_ok=True)
    pieces: list[str] = []
    for lang, side in (("en", "source"), ("de", "target")):
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines(f"train.{lang}", 3000)), model_writer=buf,
                                       vocab_size=400, model_type="unigram", minloglevel=2, character_coverage=1.0)
        (out / f"{side}.spm").write_bytes(buf.getvalue())
        sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
        pieces += [p for i in range(len(sp)) if not sp.is_control(i) and (p := sp.id_to_piece(i)) != "<unk>"
                   and p not in pieces]
    pieces += [f">>{c}<<" for c in codes]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    vocab["<pad>"] = V = len(vocab)
    V += 1
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    cfg = transformers.MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=V - 1, eos_token_id=0,
        decoder_start_token_id=V - 1, forced_eos_token_id=0, max_position_embeddings=128, init_std=0.2,
        bad_words_ids=[[V - 1]], **config)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(cfg)
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.5)
    model.save_pretrained(out)
    transformers.MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json")
                                 ).save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=list(VARIANTS))
def imported(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"marian-{request.param}")
    folder = make_marian(d / "hf", **VARIANTS[request.param])
    assert main(["import", "hf", str(folder), "-o", str(d / "model.safetensors")]) == 0
    hf = transformers.MarianMTModel.from_pretrained(folder).eval()
    return request.param, d / "model.safetensors", hf, transformers.MarianTokenizer.from_pretrained(folder)


def test_subword_ids_equal_marian_tokenizers_on_every_test2016_sentence(imported):
    name, ckpt, _, hf_tok = imported
    if name != "opus-mt":
        pytest.skip("one vocabulary is enough (the variants share it)")
    tok = Translator.load(ckpt, precision="fp32").tokenizer
    to_marian = tok.marian_ids
    for side, lines in (("source", _lines("test_2016_flickr.en")), ("target", _lines("test_2016_flickr.de"))):
        ours = (tok.encode if side == "source" else tok.encode_target)(lines)
        theirs = hf_tok(lines)["input_ids"] if side == "source" else hf_tok(text_target=lines)["input_ids"]
        assert [[to_marian[i] for i in x] + [0] for x in ours] == theirs, side


def test_logits_equal_hf_teacher_forced_on_50_sentences(imported):
    name, ckpt, hf, hf_tok = imported
    t = Translator.load(ckpt, precision="fp32")
    src, tgt = _lines("test_2016_flickr.en", 50), _lines("test_2016_flickr.de", 50)
    rows = torch.tensor(t.tokenizer.marian_ids)
    worst = 0.0
    for s, y, s_hf, y_hf in zip(t.tokenizer.encode(src), t.tokenizer.encode_target(tgt), hf_tok(src)["input_ids"],
                                hf_tok(text_target=tgt)["input_ids"]):
        with torch.no_grad():
            ours = t.model(torch.tensor([s + [EOS]]), torch.tensor([[BOS] + y]))[0]
            theirs = hf(input_ids=torch.tensor([s_hf]),
                        decoder_input_ids=torch.tensor([[hf.config.decoder_start_token_id] + y_hf[:-1]])).logits[0]
        worst = max(worst, float((ours - theirs[:, rows]).abs().max()))
    assert worst <= 1e-4, (name, worst)


def test_greedy_outputs_equal_hf_generate(imported):
    """Greedy, 50 sentences, at most 20 subwords: HF's max_new_tokens counts the EOS it forces, aiayn's
    limit does not, hence 21."""
    name, ckpt, hf, hf_tok = imported
    t = Translator.load(ckpt, precision="fp32", max_len_a=0.0, max_len_b=20)
    src = _lines("test_2016_flickr.en", 50)
    ours = t.translate_ids(t.encode_sources(src), beam=1, nbest=1)
    pad = hf.config.pad_token_id
    enc = hf_tok(src, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=21, bad_words_ids=[[pad]])
    theirs = [[x for x in row[1:] if x not in (pad, 0)] for row in out.tolist()]
    assert [[t.tokenizer.marian_ids[i] for i in h[0].tokens] for h in ours] == theirs, name
    assert t.tokenizer.decode([h[0].tokens for h in ours]) == hf_tok.batch_decode(out, skip_special_tokens=True)


def test_an_aiayn_model_exported_and_imported_is_the_same_model(toy_prepared, tmp_path):
    """aiayn -> `export hf` -> `import hf`: every weight bit for bit (rows in aiayn's order again, the
    residual dimension permuted there and back), the same vocabulary, the same translations."""
    from conftest import tiny_config

    from aiayn.training.session import train

    cfg = tiny_config(max_steps=40)
    train(cfg, toy_prepared, tmp_path / "run")
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    assert main(["export", "hf", "--checkpoint", str(ckpt), "-o", str(tmp_path / "hf")]) == 0
    assert main(["import", "hf", str(tmp_path / "hf"), "-o", str(tmp_path / "back.safetensors")]) == 0
    before, after = read_weights(ckpt)[0], read_weights(tmp_path / "back.safetensors")[0]
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    a, b = Translator.load(ckpt, precision="fp32"), Translator.load(tmp_path / "back.safetensors", precision="fp32")
    src = (toy_prepared / "test.en.txt").read_text().splitlines()
    assert a.tokenizer.encode(src) == b.tokenizer.encode(src) and a.translate(src) == b.translate(src)
    extra = json.loads(read_weights(tmp_path / "back.safetensors")[1]["extra"])
    assert extra["imported_from"] == str((tmp_path / "hf").resolve()) and "model.safetensors" in extra["sha256"]


def test_an_imported_model_decodes_in_every_precision_batched_as_alone(imported, tmp_path):
    """translate's precisions and the fused step (swish, the logits bias, unscaled embeddings)."""
    from aiayn.decode.fast import FusedDecoder

    name, ckpt, _, _ = imported
    src = _lines("test_2016_flickr.en", 12)
    fp32 = Translator.load(ckpt, precision="fp32", max_len_a=0.0, max_len_b=20)
    assert isinstance(fp32.search_model, FusedDecoder)
    modules = beam_search(fp32.model, torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(x) for x in fp32.encode_sources(src)], batch_first=True), 4, 0.6, max_len_a=0.0, max_len_b=20)
    fused = fp32.translate_ids(fp32.encode_sources(src), beam=4, alpha=0.6)
    assert [h[0].tokens for h in modules] == [h[0].tokens for h in fused], name
    for precision in ("fp32", "bf16", "int8"):  # untrained weights write to the length limit: a short one
        t = Translator.load(ckpt, precision=precision, max_len_b=20)
        assert t.translate(src) == [t.translate([s])[0] for s in src], (name, precision)
    out = tmp_path / "hyp.txt"
    (tmp_path / "src.txt").write_text("\n".join(src) + "\n")
    assert main(["translate", "--checkpoint", str(ckpt), "--input", str(tmp_path / "src.txt"), "-o", str(out),
                 "--precision", "fp32", "--max-len-b", "20"]) == 0
    assert out.read_text().splitlines() == Translator.load(ckpt, precision="fp32", max_len_b=20).translate(src)


def _broken(folder: Path, how: str) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    if how == "no vocab.json":
        (folder / "vocab.json").unlink()
    elif how == "no target.spm":
        (folder / "target.spm").unlink()
    elif how in ("model_type", "normalize_before", "vocab_size", "decoder_vocab_size", "layernorm_embedding",
                 "static_position_embeddings"):
        cfg.update({"model_type": {"model_type": "bart"}, "normalize_before": {"normalize_before": True},
                    "layernorm_embedding": {"layernorm_embedding": True},
                    "static_position_embeddings": {"static_position_embeddings": False},
                    "vocab_size": {"vocab_size": 700, "decoder_vocab_size": 700},
                    "decoder_vocab_size": {"decoder_vocab_size": 900}}[how])
        (folder / "config.json").write_text(json.dumps(cfg))
    elif how in ("decoder_layers true", "fewer layers than the weights"):
        cfg["decoder_layers"] = True if how == "decoder_layers true" else 1
        (folder / "config.json").write_text(json.dumps(cfg))
    elif how in ("untied lm_head", "untied lm_head, the embedding under the encoder's name"):
        tensors = safetensors.torch.load_file(folder / "model.safetensors")
        tensors["lm_head.weight"] = tensors["model.shared.weight"] + 1
        if how != "untied lm_head":
            tensors = {k: v for k, v in tensors.items() if "embed_tokens" not in k}
            tensors["model.encoder.embed_tokens.weight"] = tensors.pop("model.shared.weight")
        safetensors.torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    elif how == "separate_vocabs a list":
        (folder / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": [1, 2]}))
    elif how == "a huge vocab.json":  # refused by its size, before it is parsed (20x its size in memory)
        (folder / "vocab.json").write_bytes(b'{"' + b"x" * (17 << 20) + b'": 0}')
    elif how == "pickle only":
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    elif how == "truncated weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("how,message", [
    ("no vocab.json", "no vocab.json"), ("no target.spm", "no target.spm"),
    ("model_type", "model_type is 'bart'"), ("normalize_before", "normalize_before is True"),
    ("layernorm_embedding", "layernorm_embedding is True"),
    ("static_position_embeddings", "static_position_embeddings is False"),
    ("vocab_size", "config.json's vocab_size 700"), ("decoder_vocab_size", "separate vocabularies"),
    ("pickle only", "pytorch_model.bin, a pickle"), ("a huge vocab.json", "more than the 16,777,216 allowed"),
    ("decoder_layers true", "decoder_layers is True, not an integer"),
    ("fewer layers than the weights", "config.json does not describe, e.g. model.decoder.layers.1."),
    ("untied lm_head", "lm_head.weight differs from model.shared.weight"),
    ("untied lm_head, the embedding under the encoder's name",
     "lm_head.weight differs from model.encoder.embed_tokens.weight"),
    ("separate_vocabs a list", "separate_vocabs is [1, 2], not true or false"),
    ("truncated weights", "not a readable safetensors file"),
])
def test_bad_folders_get_one_line_and_nothing_is_written(tmp_path, capsys, how, message):
    folder = make_marian(tmp_path / "hf")
    _broken(folder, how)
    capsys.readouterr()
    out = tmp_path / "model.safetensors"
    assert main(["import", "hf", str(folder), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_import_never_replaces_a_file_it_did_not_write(tmp_path, capsys):
    folder = make_marian(tmp_path / "hf")
    mine = tmp_path / "notes.safetensors"
    mine.write_text("the user's")
    capsys.readouterr()
    assert main(["import", "hf", str(folder), "-o", str(mine)]) == 2
    assert "not a checkpoint `aiayn import` wrote" in capsys.readouterr().err and mine.read_text() == "the user's"
    assert main(["import", "hf", str(folder), "-o", str(tmp_path / "m.safetensors")]) == 0
    assert main(["import", "hf", str(folder), "-o", str(tmp_path / "m.safetensors")]) == 0  # its own: replaced


def test_export_hf_of_an_imported_model_gives_back_the_same_folder(imported, tmp_path):
    """import -> export: every weight bit for bit (Marian's row order again, the decoder start's
    copy left out), source.spm and target.spm byte for byte, vocab.json's pieces and ids, the
    special ids, and MarianMTModel's logits on the exported folder equal to the original's."""
    from safetensors.torch import load_file

    name, ckpt, hf, hf_tok = imported
    folder = Path(hf.name_or_path)
    assert main(["export", "hf", "--checkpoint", str(ckpt), "-o", str(tmp_path / "back")]) == 0
    before, after = load_file(folder / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    shared = [k for k in before if k in after and "embed_positions" not in k]
    assert len(shared) > 40 and all(torch.equal(before[k], after[k]) for k in shared), name
    for f in ("source.spm", "target.spm"):
        assert (folder / f).read_bytes() == (tmp_path / "back" / f).read_bytes()
    assert json.loads((folder / "vocab.json").read_text()) == json.loads((tmp_path / "back" / "vocab.json").read_text())
    back = transformers.MarianMTModel.from_pretrained(tmp_path / "back").eval()
    for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id", "vocab_size", "activation_function",
                "scale_embedding", "share_encoder_decoder_embeddings"):
        assert getattr(back.config, key) == getattr(hf.config, key), key
    enc = hf_tok(_lines("test_2016_flickr.en", 4), return_tensors="pt", padding=True)
    start = torch.full((4, 1), hf.config.decoder_start_token_id)
    with torch.no_grad():
        ours, theirs = back(**enc, decoder_input_ids=start).logits, hf(**enc, decoder_input_ids=start).logits
    torch.testing.assert_close(ours, theirs)


def test_export_ct2_of_an_imported_model_decodes_like_aiayn(imported, tmp_path):
    """CTranslate2 (its converter, its kernels) on the imported model: greedy outputs piece for piece,
    50 sentences (CTranslate2 starts the decoder from Marian's <pad>, as the model was trained)."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="export ct2 needs the optional ctranslate2 package")
    name, ckpt, _, _ = imported
    assert main(["export", "ct2", "--checkpoint", str(ckpt), "-o", str(tmp_path / "ct2")]) == 0
    t = Translator.load(ckpt, precision="fp32", max_len_a=0.0, max_len_b=20)
    src = _lines("test_2016_flickr.en", 50)
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    res = ct2.translate_batch([t.tokenizer.pieces(s) + ["</s>"] for s in src], beam_size=1, max_decoding_length=20)
    ours = t.translate_ids(t.encode_sources(src), beam=1, nbest=1)
    assert [t.tokenizer.id_to_piece(h[0].tokens) for h in ours] == [r.hypotheses[0] for r in res], name


def test_the_toolkits_verbs_work_on_an_imported_model(imported, tmp_path):
    """prepare in its split vocabulary, shortlist, translate with and without the shortlist, tune,
    plot attention, heads: one imported model (serve decodes through the same Translator)."""
    name, ckpt, _, _ = imported
    if name != "opus-mt":
        pytest.skip("the verbs need one imported model")
    for split, n in (("train", 1500), ("val", 30)):  # untrained weights write to the length limit: few sentences
        for lang in ("en", "de"):
            (tmp_path / f"{split}.{lang}").write_text("\n".join(_lines(f"{split}.{lang}", n)) + "\n")
    prep = tmp_path / "prep"
    assert main(["prepare", "--data-dir", str(tmp_path), "--src", "en", "--tgt", "de", "--train", "train",
                 "--valid", "val", "--tokenizer-from", str(ckpt), "-o", str(prep)]) == 0
    assert (prep / "spm.model").read_bytes() == Translator.load(ckpt, precision="fp32").tokenizer.proto
    assert main(["shortlist", "--data", str(prep), "-o", str(tmp_path / "sl.safetensors")]) == 0
    for extra in ([], ["--shortlist", str(tmp_path / "sl.safetensors")]):
        assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "val.en"), "-o",
                     str(tmp_path / "out.de"), "--precision", "fp32", *extra]) == 0
        assert len((tmp_path / "out.de").read_text().splitlines()) == 30
    assert main(["tune", "--checkpoint", str(ckpt), "--data", str(prep), "--beams", "1,2", "--alphas", "0.6",
                 "-o", str(tmp_path / "tuned.safetensors")]) == 0
    assert main(["plot", "attention", "--checkpoint", str(ckpt), "--src", "A dog runs.", "--tgt", "Ein Hund läuft.",
                 "-o", str(tmp_path / "maps")]) == 0  # a given target: untrained weights would write 50 subwords
    assert any(p.suffix == ".png" for p in (tmp_path / "maps").iterdir())
    assert main(["heads", "--checkpoint", str(ckpt), "--data", str(prep), "--sentences", "5", "--bleu-sentences",
                 "5", "--random-orders", "2", "-o", str(tmp_path / "heads")]) == 0
    assert (tmp_path / "heads" / "heads.json").is_file()


def test_beam_outputs_equal_hf_generate_short_of_the_length_limit(imported):
    """Beam 4, α 0 (HF's length penalty and GNMT's agree only there), HF's early_stopping "never"
    (aiayn's stopping rule): every hypothesis either equals HF's or, by design, reaches the 20-subword
    limit in both searches (HF forces EOS into its last position and ranks with it; aiayn's search
    ends a row there with EOS's own probability). Random models hit the limit often (6 of 50 seen)."""
    name, ckpt, hf, hf_tok = imported
    t = Translator.load(ckpt, precision="fp32", max_len_a=0.0, max_len_b=20)
    src = _lines("test_2016_flickr.en", 50)
    ours = t.translate_ids(t.encode_sources(src), beam=4, alpha=0.0, nbest=1)
    pad, same = hf.config.pad_token_id, 0
    for s, h in zip(src, ours):
        with torch.no_grad():
            out = hf.generate(**hf_tok([s], return_tensors="pt"), num_beams=4, max_new_tokens=21, length_penalty=0.0,
                              bad_words_ids=[[pad]], early_stopping="never")[0].tolist()
        theirs = [x for x in out[1:] if x not in (pad, 0)]
        mine = [t.tokenizer.marian_ids[i] for i in h[0].tokens]
        same += mine == theirs
        assert mine == theirs or len(mine) == len(theirs) == 20, (name, s)
    assert same >= 25, (name, same)


def test_a_marian_folder_loads_directly_as_its_imported_checkpoint_does(imported, tmp_path):
    """Translator.load(FOLDER) and `translate --checkpoint FOLDER`: imported on the fly, nothing written."""
    name, ckpt, hf, _ = imported
    folder = Path(hf.name_or_path)
    files = sorted(folder.iterdir())
    src = _lines("test_2016_flickr.en", 8)
    direct, imported_file = (Translator.load(p, precision="fp32") for p in (folder, ckpt))
    assert direct.translate(src) == imported_file.translate(src)
    (tmp_path / "in.en").write_text("\n".join(src) + "\n")
    assert main(["translate", "--checkpoint", str(folder), "-i", str(tmp_path / "in.en"), "-o", str(tmp_path / "o"),
                 "--precision", "fp32"]) == 0
    assert sorted(folder.iterdir()) == files


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    d = tmp_path_factory.mktemp("marian-mul")
    folder = make_marian(d / "hf", seed=3, codes=("fra", "deu", "ces"), **VARIANTS["opus-mt"])
    assert main(["import", "hf", str(folder), "-o", str(d / "model.safetensors")]) == 0
    hf = transformers.MarianMTModel.from_pretrained(folder).eval()
    return d / "model.safetensors", hf, transformers.MarianTokenizer.from_pretrained(folder)


def test_language_codes_are_one_piece_each_as_marian_tokenizer_makes_them(multilingual):
    """A multilingual model's >>xx<< codes: cut off before SentencePiece and mapped to their ids, on
    every test2016 sentence with each code (given in the text or as tgt_lang); its languages listed."""
    ckpt, _, hf_tok = multilingual
    t = Translator.load(ckpt, precision="fp32")
    assert t.target_languages() == ["fra", "deu", "ces"]
    src = _lines("test_2016_flickr.en")
    for code in ("fra", "deu", "ces"):
        theirs = hf_tok([f">>{code}<< {s}" for s in src])["input_ids"]
        assert [[t.tokenizer.marian_ids[i] for i in x] for x in t.encode_sources(src, tgt_lang=code)] == theirs
        assert t.encode_sources([f">>{code}<< {s}" for s in src[:20]]) == t.encode_sources(src[:20], tgt_lang=code)
    with pytest.raises(ConfigError, match="translates into fra, deu, ces"):
        t.translate(["A dog."], tgt_lang="ita")


def test_greedy_outputs_with_a_language_code_equal_hf_generate(multilingual, tmp_path, capsys):
    """Each code's greedy translations of 30 sentences, batched: HF's generate's ids; the command
    line's --tgt-lang gives the same text, and a language the model lacks is one line naming its own."""
    ckpt, hf, hf_tok = multilingual
    t = Translator.load(ckpt, precision="fp32", max_len_a=0.0, max_len_b=20)
    src = _lines("test_2016_flickr.en", 30)
    pad = hf.config.pad_token_id
    for code in ("fra", "ces"):
        ours = t.translate_ids(t.encode_sources(src, tgt_lang=code), beam=1, nbest=1)
        enc = hf_tok([f">>{code}<< {s}" for s in src], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = hf.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=21, bad_words_ids=[[pad]])
        theirs = [[x for x in row[1:] if x not in (pad, 0)] for row in out.tolist()]
        assert [[t.tokenizer.marian_ids[i] for i in h[0].tokens] for h in ours] == theirs, code
    (tmp_path / "in.en").write_text("".join(s + "\n" for s in src[:5]))
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in.en"), "--tgt-lang", "fra",
                 "--beam", "1", "--max-len-b", "20"]) == 0
    same = Translator.load(ckpt, max_len_b=20)  # the command line's settings: max_len_a 1, precision auto
    assert capsys.readouterr().out.splitlines() == same.translate(src[:5], beam=1, tgt_lang="fra")
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in.en"), "--tgt-lang", "ita"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'ita'" in err[0] and "fra, deu, ces" in err[0]


def test_the_server_translates_into_the_language_a_request_names(multilingual):
    """`{"tgt": "fra"}`: the same text as Translator.translate(tgt_lang="fra"); /health lists the
    model's languages; a language it lacks is a 400 naming them; alignments never point at the tag."""
    from fastapi.testclient import TestClient

    from aiayn.serve.app import create_app

    ckpt, _, _ = multilingual
    t = Translator.load(ckpt, precision="fp32", max_len_b=12)
    client = TestClient(create_app(t))
    src = _lines("test_2016_flickr.en", 4)
    assert client.get("/health").json()["model"]["target_languages"] == ["fra", "deu", "ces"]
    for code in ("fra", "deu"):
        r = client.post("/translate", json={"sentences": src, "tgt": code, "beam": 2})
        assert r.status_code == 200 and r.json()["translations"] == t.translate(src, beam=2, tgt_lang=code)
    r = client.post("/translate", json={"sentences": src, "tgt": "ita"})
    assert r.status_code == 400 and "fra, deu, ces" in r.json()["detail"]
    r = client.post("/translate", json={"sentences": src, "tgt": "fra", "alignments": True})
    assert r.status_code == 200
    for links, line in zip(r.json()["alignments"], src):  # Pharaoh i-j; the >>fra<< tag is no source word
        assert all(0 <= int(x.split("-")[0]) < len(line.split()) for x in links.split())
