"""Export to Hugging Face `MarianMTModel`, and through it to CTranslate2.

Marian's architecture is the paper's (post-norm, ReLU, √d_model-scaled shared embeddings,
sinusoidal positions starting at 0), so an aiayn checkpoint maps onto it weight for weight. One
difference: §3.5 interleaves sin and cos (dims 2i, 2i+1), HF's Marian puts every sin first and
every cos second, with the same frequencies, and rebuilds that table on load. Permuting the
model dimension (2i -> i, 2i+1 -> d/2 + i) in every tensor that touches the residual stream
gives an exactly equivalent network whose positions are HF's table.
Needs the optional `transformers` package (`pip install aiayn[export]`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from .checkpoint import load_checkpoint
from .config import ModelConfig
from .data.tokenizer import BOS, EOS, PAD, SplitTokenizer, Tokenizer
from .errors import AiaynError
from .files import new_folder
from .models.build import build_model
from .models.transformer import Transformer


class ExportError(AiaynError):
    pass


# The kind in an export's marker (files.MARKER): only a folder `export hf` or `export ct2` wrote, holding
# nothing else, is replaced by a new export; any other non-empty folder is refused.
EXPORT = "export"


def marian_rows(tokenizer: Tokenizer | SplitTokenizer) -> torch.Tensor | None:
    """An imported model's rows in its Marian ids' order (the decoder start's copy of <pad> left
    out): what `export hf` writes back; None for aiayn's own vocabulary (written as it is)."""
    ids = getattr(tokenizer, "marian_ids", None)
    if ids is None:
        return None
    first = {}
    for row, marian in enumerate(ids):
        first.setdefault(marian, row)
    return torch.tensor([first[j] for j in range(len(first))])


def marian_state_dict(model: Transformer, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """aiayn parameters -> MarianMTModel parameters, residual dimensions permuted (see above);
    `rows`: the vocabulary rows in Marian's order (marian_rows)."""
    cfg = model.cfg
    if cfg.learned_positions:
        raise ExportError("MarianMTModel has sinusoidal positions only; a learned_positions model cannot be exported")
    d = cfg.d_model
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # HF dim j <- aiayn dim perm[j]
    sd: dict[str, torch.Tensor] = {}

    def reads(lin) -> tuple[torch.Tensor, torch.Tensor]:  # input is the residual stream
        return lin.weight.detach()[:, perm], lin.bias.detach()

    def writes(lin) -> tuple[torch.Tensor, torch.Tensor]:  # output is the residual stream
        return lin.weight.detach()[perm, :], lin.bias.detach()[perm]

    rows = torch.arange(cfg.vocab_size) if rows is None else rows
    emb = model.src_embed.weight.detach()[rows][:, perm]
    if cfg.share_embeddings:  # HF's unshared Marian has no `shared` matrix
        sd["model.shared.weight"] = emb
    sd["model.encoder.embed_tokens.weight"] = emb
    sd["model.decoder.embed_tokens.weight"] = model.tgt_embed.weight.detach()[rows][:, perm]
    sd["lm_head.weight"] = model.out_proj.weight.detach()[rows][:, perm]
    bias = model.out_proj.bias
    sd["final_logits_bias"] = torch.zeros(1, len(rows)) if bias is None else bias.detach()[rows][None]

    def attn(prefix: str, m) -> None:
        for ours, theirs in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj")):
            sd[f"{prefix}.{theirs}.weight"], sd[f"{prefix}.{theirs}.bias"] = reads(getattr(m, ours))
        sd[f"{prefix}.out_proj.weight"], sd[f"{prefix}.out_proj.bias"] = writes(m.w_o)

    def norm(prefix: str, ln) -> None:
        sd[f"{prefix}.weight"], sd[f"{prefix}.bias"] = ln.weight.detach()[perm], ln.bias.detach()[perm]

    def ffn(prefix: str, f) -> None:
        sd[f"{prefix}.fc1.weight"], sd[f"{prefix}.fc1.bias"] = reads(f.w_1)
        sd[f"{prefix}.fc2.weight"], sd[f"{prefix}.fc2.bias"] = writes(f.w_2)

    for i, layer in enumerate(model.encoder):
        p = f"model.encoder.layers.{i}"
        attn(f"{p}.self_attn", layer.self_attn)
        norm(f"{p}.self_attn_layer_norm", layer.res_attn.norm)
        ffn(p, layer.ffn)
        norm(f"{p}.final_layer_norm", layer.res_ffn.norm)
    for i, layer in enumerate(model.decoder):
        p = f"model.decoder.layers.{i}"
        attn(f"{p}.self_attn", layer.self_attn)
        norm(f"{p}.self_attn_layer_norm", layer.res_self.norm)
        attn(f"{p}.encoder_attn", layer.cross_attn)
        norm(f"{p}.encoder_attn_layer_norm", layer.res_cross.norm)
        ffn(p, layer.ffn)
        norm(f"{p}.final_layer_norm", layer.res_ffn.norm)
    return {k: v.float().contiguous() for k, v in sd.items()}


def marian_config(model: Transformer, beam: int, max_length: int, tokenizer: Tokenizer | SplitTokenizer | None = None):
    from transformers import MarianConfig

    cfg = model.cfg
    ids = getattr(tokenizer, "marian_ids", None) or list(range(cfg.vocab_size))  # an imported model's own
    V, pad, start, eos = len(set(ids)), ids[PAD], ids[BOS], ids[EOS]
    if cfg.arch != "transformer":
        raise ExportError(f"only the Transformer can be exported (this checkpoint is model.arch={cfg.arch}); "
                          "translate it with `aiayn translate`")
    if cfg.pre_norm:
        raise ExportError("MarianMTModel is post-norm only; a pre_norm model cannot be exported")
    if cfg.parser_inputs:
        raise _parser_refused(cfg)
    if cfg.lang_tag == "decoder":
        raise ExportError("MarianMTModel reads a target-language tag in the source only; this model reads it in the "
                          "decoder (model.lang_tag decoder): translate it with `aiayn translate`")
    if cfg.head_dim_k * cfg.h != cfg.d_model or cfg.head_dim_v * cfg.h != cfg.d_model:
        raise ExportError("MarianMTModel needs d_k = d_v = d_model / h")
    return MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=cfg.d_model,
        encoder_layers=cfg.N, decoder_layers=cfg.n_dec, encoder_attention_heads=cfg.h,
        decoder_attention_heads=cfg.h, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation, max_position_embeddings=cfg.max_positions,
        scale_embedding=cfg.scale_embedding,
        dropout=cfg.p_drop, attention_dropout=cfg.attn_drop, activation_dropout=0.0,
        pad_token_id=pad, eos_token_id=eos, bos_token_id=start, decoder_start_token_id=start,
        forced_eos_token_id=eos, share_encoder_decoder_embeddings=cfg.share_embeddings,
        tie_word_embeddings=cfg.share_embeddings, num_beams=beam, max_length=max_length,
        bad_words_ids=[[pad]] + ([[start]] if start != pad else []),
    )


def export_hf(checkpoint: Path, out: Path) -> Path:
    """Write a directory that `MarianMTModel` and `MarianTokenizer` load (built beside `out`,
    renamed into place)."""
    with new_folder(out, EXPORT) as tmp:
        _write_hf(checkpoint, tmp)
    return Path(out)


def _parser_refused(cfg: ModelConfig) -> ExportError:
    return ExportError(f"a model.{cfg.parser_inputs[0]} parser has inputs Marian and CTranslate2 lack; "
                       "use `aiayn parse`")


def _exportable(cfg: ModelConfig, pieces: list[str] | None) -> torch.nn.Module:
    """checkpoint.load_checkpoint's builder, refusing §6.3's parsers before they are built."""
    if cfg.parser_inputs:
        raise _parser_refused(cfg)
    return build_model(cfg, pieces)


def _write_hf(checkpoint: Path, out: Path) -> None:
    try:
        from transformers import MarianMTModel
    except ImportError:
        raise ExportError("export needs the `transformers` package: pip install 'aiayn[export]'") from None
    model, cfg, tokenizer, _ = load_checkpoint(checkpoint, build=_exportable)
    hf_cfg = marian_config(model, cfg.decode.beam, min(cfg.model.max_positions, 512), tokenizer)
    hf = MarianMTModel(hf_cfg)
    missing, unexpected = hf.load_state_dict(marian_state_dict(model, marian_rows(tokenizer)), strict=False)
    missing = [m for m in missing if "embed_positions" not in m]  # HF builds its own table
    if missing or unexpected:
        raise ExportError(f"weight mapping mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    hf.tie_weights()
    hf.save_pretrained(out)
    write_marian_tokenizer(tokenizer, out)


def write_marian_tokenizer(tokenizer: Tokenizer | SplitTokenizer, out: Path) -> None:
    """The joint SentencePiece model serves as both source.spm and target.spm; an imported model's
    vocabulary is written back as it came (its two models, its pieces under their Marian ids)."""
    if isinstance(tokenizer, SplitTokenizer):
        (out / "source.spm").write_bytes(tokenizer.source_proto)
        (out / "target.spm").write_bytes(tokenizer.target_proto)
        pieces = tokenizer.pieces_list()
        vocab = {pieces[r]: tokenizer.marian_ids[r] for r in marian_rows(tokenizer).tolist()}
    else:
        for name in ("source.spm", "target.spm"):
            (out / name).write_bytes(tokenizer.proto)
        vocab = {tokenizer.sp.id_to_piece(i): i for i in range(len(tokenizer))}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "MarianTokenizer", "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
        "model_max_length": 512, "separate_vocabs": False,
    }))


def export_ct2(checkpoint: Path, out: Path, quantization: str | None = None) -> Path:
    """CTranslate2 model through the HF export and CTranslate2's own Transformers converter.

    CTranslate2's Marian loader assumes OPUS-MT conventions that aiayn does not share: the
    decoder starts from a zero embedding and the last vocabulary row is padding. Its BART loader
    reads the same module layout without those assumptions (decoder starts from <s>, every row
    kept), so the conversion runs with that loader registered for MarianConfig.
    """
    try:
        from ctranslate2.converters import transformers as ct2t
    except ImportError:
        raise ExportError("export ct2 needs the `ctranslate2` package: pip install 'aiayn[export]'") from None
    with new_folder(out, EXPORT) as tmp, tempfile.TemporaryDirectory(prefix=".hf.", dir=tmp.parent) as hf_dir:
        _write_hf(checkpoint, Path(hf_dir))
        _convert(Path(hf_dir), tmp, quantization, ct2t)
    return Path(out)


def _convert(hf_dir: Path, out: Path, quantization: str | None, ct2t) -> None:
    """CTranslate2's converter, with the loader below for aiayn's Marian layout; `out` is our own
    temporary folder (the converter's force=True empties it)."""

    class AiaynMarianLoader(ct2t.BartLoader):
        @property
        def architecture_name(self) -> str:
            return "MarianMTModel"

        def get_model_spec(self, model):
            model.config.normalize_before = False  # post-norm (§3.1)
            model.config.normalize_embedding = False
            return super().get_model_spec(model)

        def set_config(self, config, model, tokenizer):
            # aiayn's BOS, a learned embedding; an imported OPUS-MT model's decoder start (its <pad>)
            start = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)
            config.bos_token, config.eos_token, config.unk_token = start, "</s>", "<unk>"
            config.decoder_start_token = start

    previous = ct2t._MODEL_LOADERS.get("MarianConfig")
    ct2t.register_loader("MarianConfig")(AiaynMarianLoader)
    try:
        converter = ct2t.TransformersConverter(str(hf_dir), copy_files=["source.spm", "target.spm"])
        converter.convert(str(out), quantization=quantization, force=True)
    finally:
        ct2t._MODEL_LOADERS["MarianConfig"] = previous
