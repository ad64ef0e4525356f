"""A pretrained Marian / OPUS-MT model (a Hugging Face `MarianMTModel` folder) as an aiayn checkpoint.

Marian's architecture is the paper's (§3: post-norm, sinusoidal positions, √d_model-scaled shared
embeddings), so its weights map onto aiayn's one for one: the inverse of export.py. The model
dimension is permuted back (HF's sin-then-cos positions -> §3.5's interleaved ones, exactly), and
the vocabulary rows are reordered to aiayn's fixed ids (PAD, UNK, BOS, EOS first; BOS is a copy of
Marian's decoder-start row, its <pad>). What Marian models have beyond the paper becomes options
whose defaults stay the paper's (model.activation, model.out_bias, model.scale_embedding, unshared
embeddings); anything of another architecture is refused in one line naming the config key.
Weights are read from model.safetensors only (a pytorch_model.bin is a pickle: never executed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from .config import Config, ModelConfig
from .data.tokenizer import SplitTokenizer
from .errors import AiaynError
from .files import digest
from .models.build import build_model, shapes_only

MAX_JSON = 1 << 20  # config.json, tokenizer_config.json (a few KB)
MAX_VOCAB_JSON = 16 << 20  # vocab.json: 500,000 pieces; refused unparsed above it (JSON takes ~20x its size to parse)
MAX_SPM = 64 << 20
_RECOMPUTED = ("embed_positions.weight", "final_logits_bias")  # sinusoids HF rebuilds; the bias is read apart
_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# keys of older Marian configs that describe another architecture when set the other way
_NOT_THE_PAPER = {"normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": False,
                  "layernorm_embedding": False, "static_position_embeddings": True, "add_bias_logits": False}


class PretrainedError(AiaynError):
    """A folder that is not a MarianMTModel aiayn can read; the message names the file and key."""


def _read(path: Path, limit: int) -> bytes:
    if not path.is_file():
        raise PretrainedError(f"{path.parent}: no {path.name} (a MarianMTModel folder has config.json, "
                              "model.safetensors, source.spm, target.spm, vocab.json)")
    if path.stat().st_size > limit:
        raise PretrainedError(f"{path}: {path.stat().st_size:,} bytes, more than the {limit:,} allowed")
    return path.read_bytes()


def _json(path: Path, limit: int = MAX_JSON) -> Any:
    data = _read(path, limit)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise PretrainedError(f"{path}: not JSON ({str(e)[:100]})") from None


def _typed(hf: dict, path: Path, name: str, kind: type, default: Any) -> Any:
    """hf[name] (or its default) if it is a JSON value of KIND: a count is not true, a switch not "yes"."""
    value = hf.get(name, default)
    ok = (isinstance(value, bool) or value in (0, 1) if kind is bool else not isinstance(value, bool) and (
        isinstance(value, int) if kind is int else isinstance(value, (int, float)) and math.isfinite(value)))
    if not ok:
        want = {int: "an integer", float: "a finite number", bool: "true or false"}[kind]
        raise PretrainedError(f"{path}: {name} is {value!r}, not {want}")
    return kind(value)


def model_config(hf: dict, path: Path) -> ModelConfig:
    """The aiayn ModelConfig of a MarianConfig dict, or a PretrainedError naming the key."""
    def key(name: str, default: Any = None) -> Any:
        return hf.get(name, default)

    if key("model_type") != "marian":
        raise PretrainedError(f"{path}: model_type is {key('model_type')!r}; aiayn imports 'marian' models only")
    for name, paper in _NOT_THE_PAPER.items():
        if name in hf and _typed(hf, path, name, bool, paper) != paper:
            raise PretrainedError(f"{path}: {name} is {hf[name]!r}: not the paper's architecture (§3); aiayn "
                                  "imports post-norm models with sinusoidal positions and no extra norms only")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if key(a) != key(b):
            raise PretrainedError(f"{path}: {a} {key(a)} differs from {b} {key(b)}; aiayn's stacks share them")
    if key("decoder_vocab_size") not in (None, key("vocab_size")):
        raise PretrainedError(f"{path}: decoder_vocab_size {key('decoder_vocab_size')} differs from vocab_size "
                              f"{key('vocab_size')} (separate vocabularies): not supported")
    act = key("activation_function", "gelu")
    if not isinstance(act, str) or act not in _ACTIVATIONS:
        raise PretrainedError(f"{path}: activation_function {act!r}; aiayn has relu, swish (silu) and gelu")

    def typed(name: str, kind: type, default: Any = None) -> Any:
        return _typed(hf, path, name, kind, default)

    try:
        cfg = ModelConfig(vocab_size=typed("vocab_size", int), d_model=typed("d_model", int),
                          d_ff=typed("encoder_ffn_dim", int), h=typed("encoder_attention_heads", int),
                          N=typed("encoder_layers", int), N_dec=typed("decoder_layers", int),
                          p_drop=typed("dropout", float, 0.1), attn_drop=typed("attention_dropout", float, 0.0),
                          max_positions=typed("max_position_embeddings", int, 512), activation=_ACTIVATIONS[act],
                          scale_embedding=typed("scale_embedding", bool, False),
                          share_embeddings=typed("share_encoder_decoder_embeddings", bool, True))
        cfg.validate()
    except PretrainedError:
        raise
    except (TypeError, ValueError, AiaynError) as e:
        raise PretrainedError(f"{path}: {e}") from None
    return cfg


def read_vocabulary(folder: Path, hf: dict) -> SplitTokenizer:
    """vocab.json's pieces in aiayn's row order, with source.spm and target.spm."""
    tok_cfg = _json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    if isinstance(tok_cfg, dict) and _typed(tok_cfg, folder / "tokenizer_config.json", "separate_vocabs", bool, False):
        raise PretrainedError(f"{folder / 'tokenizer_config.json'}: separate_vocabs is true: not supported")
    vocab = _json(folder / "vocab.json", MAX_VOCAB_JSON)
    V = hf.get("vocab_size")
    if not (isinstance(vocab, dict) and all(type(i) is int for i in vocab.values())):
        raise PretrainedError(f"{folder / 'vocab.json'}: not a mapping of pieces to ids")
    if sorted(vocab.values()) != list(range(len(vocab))) or len(vocab) != V:
        raise PretrainedError(f"{folder / 'vocab.json'}: {len(vocab):,} pieces with ids 0..{len(vocab) - 1} "
                              f"expected to match config.json's vocab_size {V}")
    piece = {i: p for p, i in vocab.items()}
    special = [hf.get("pad_token_id"), vocab.get("<unk>"), hf.get("decoder_start_token_id"), hf.get("eos_token_id")]
    for name, i in zip(("pad_token_id", "<unk> in vocab.json", "decoder_start_token_id", "eos_token_id"), special):
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < V:
            raise PretrainedError(f"{folder}: {name} is {i!r}, not an id of the vocabulary")
    if len({special[0], special[1], special[3]}) < 3:
        raise PretrainedError(f"{folder}: pad, <unk> and eos must be three different ids, got {special}")
    rest = [i for i in range(V) if i not in special]
    ids = special + rest  # aiayn row r is Marian's id ids[r]; the decoder start twice where it is <pad>
    return SplitTokenizer(_read(folder / "source.spm", MAX_SPM), _read(folder / "target.spm", MAX_SPM),
                          [piece[i] for i in ids], ids)


def _names(cfg: ModelConfig) -> dict[str, tuple[list[str], str]]:
    """aiayn parameter -> (HF names to read it from, first present wins; how it is laid out)."""
    shared, out = ["model.shared.weight"], {}
    enc = ["model.encoder.embed_tokens.weight"] + shared
    dec = ["model.decoder.embed_tokens.weight"] + (shared if cfg.share_embeddings else [])
    out["src_embed.weight"] = (enc, "rows")
    if not cfg.share_embeddings:
        out["tgt_embed.weight"] = (dec, "rows")
        out["out_proj.weight"] = (["lm_head.weight"] + dec, "rows")
    if cfg.out_bias:
        out["out_proj.bias"] = (["final_logits_bias"], "logits")

    def sub(ours: str, theirs: str, kind: str) -> None:
        out[f"{ours}.weight"] = ([f"{theirs}.weight"], kind)
        out[f"{ours}.bias"] = ([f"{theirs}.bias"], "writes" if kind == "writes" else "vector" if kind == "norm"
                               else "plain")

    def attn(ours: str, theirs: str) -> None:
        for a, b in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj")):
            sub(f"{ours}.{a}", f"{theirs}.{b}", "reads")
        sub(f"{ours}.w_o", f"{theirs}.out_proj", "writes")

    for side, n, norms in (("encoder", cfg.N, ("res_attn", "res_ffn")), ("decoder", cfg.n_dec,
                                                                        ("res_self", "res_cross", "res_ffn"))):
        for i in range(n):
            ours, theirs = f"{side}.{i}", f"model.{side}.layers.{i}"
            attn(f"{ours}.self_attn", f"{theirs}.self_attn")
            if side == "decoder":
                attn(f"{ours}.cross_attn", f"{theirs}.encoder_attn")
            sub(f"{ours}.ffn.w_1", f"{theirs}.fc1", "reads")
            sub(f"{ours}.ffn.w_2", f"{theirs}.fc2", "writes")
            hf_norms = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
            for norm, hf in zip(norms, hf_norms if side == "decoder" else hf_norms[::2]):
                sub(f"{ours}.{norm}.norm", f"{theirs}.{hf}", "norm")
    return out


def read_weights(path: Path, cfg: ModelConfig, rows: list[int], shapes: dict[str, torch.Size]
                 ) -> dict[str, torch.Tensor]:
    """The Marian weights as aiayn's parameters (`shapes`), each shape checked before it is read."""
    d = cfg.d_model
    inv = torch.argsort(torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)]))  # HF dim -> aiayn dim
    rows_t = torch.tensor(rows)
    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            present = set(f.keys())
            for name, (candidates, kind) in _names(cfg).items():
                hf = next((c for c in candidates if c in present), None)
                if hf is None:
                    raise PretrainedError(f"{path}: no {candidates[0]} (the model's {name})")
                V = max(rows) + 1  # Marian's vocabulary
                want = (1, V) if kind == "logits" else ((V, d) if kind == "rows" else tuple(shapes[name]))
                if tuple(f.get_slice(hf).get_shape()) != want:
                    raise PretrainedError(f"{path}: {hf} has shape {tuple(f.get_slice(hf).get_shape())}, "
                                          f"config.json gives {want}")
                t = f.get_tensor(hf).float()
                out[name] = {"rows": lambda t: t[rows_t][:, inv], "logits": lambda t: t[0, rows_t],
                             "reads": lambda t: t[:, inv], "writes": lambda t: t[inv], "norm": lambda t: t[inv],
                             "vector": lambda t: t[inv], "plain": lambda t: t}[kind](t).contiguous()
            _check_unread(f, path, _names(cfg))
    except (SafetensorError, OSError) as e:
        raise PretrainedError(f"{path}: not a readable safetensors file ({str(e)[:120]})") from None
    return out


def _check_unread(f, path: Path, names: dict[str, tuple[list[str], str]]) -> None:
    """Every tensor of the file is read, or one HF recomputes (positions) or reads apart (the logits'
    bias); an lm_head tied to the embedding is its copy. Else config.json describes less than the file."""
    present = set(f.keys())
    read = {c for candidates, _ in names.values() for c in candidates}
    left = sorted(n for n in present - read - {"lm_head.weight"} if not n.endswith(_RECOMPUTED))
    if left:
        raise PretrainedError(f"{path}: {len(left)} tensor(s) config.json does not describe, e.g. {left[0]} (more "
                              "layers than it says, or parts of another architecture); nothing imported")
    if "lm_head.weight" in present and "lm_head.weight" not in read:
        tied = next(c for c in ("model.decoder.embed_tokens.weight", "model.shared.weight",
                                "model.encoder.embed_tokens.weight") if c in present)  # one was read: the source's
        if f.get_slice("lm_head.weight").get_shape() != f.get_slice(tied).get_shape() or not torch.equal(
                f.get_tensor("lm_head.weight"), f.get_tensor(tied)):
            raise PretrainedError(f"{path}: lm_head.weight differs from {tied} while config.json shares the "
                                  "embeddings (tie_word_embeddings false): an untied output layer is not supported")


def import_hf(folder: Path) -> tuple[torch.nn.Module, Config, SplitTokenizer, dict[str, Any]]:
    """The model of a MarianMTModel folder, its config, vocabulary and provenance."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PretrainedError(f"{folder}: not a folder (aiayn import hf reads a MarianMTModel folder)")
    weights = folder / "model.safetensors"
    if not weights.is_file() and (folder / "pytorch_model.bin").is_file():
        raise PretrainedError(f"{folder}: only pytorch_model.bin, a pickle that aiayn never executes; save the "
                              "model with safetensors (MarianMTModel.save_pretrained does by default)")
    hf = _json(folder / "config.json")
    if not isinstance(hf, dict):
        raise PretrainedError(f"{folder / 'config.json'}: not a mapping")
    mcfg = model_config(hf, folder / "config.json")
    tokenizer = read_vocabulary(folder, hf)
    mcfg.vocab_size = len(tokenizer)
    bias = _logits_bias(weights, hf.get("vocab_size"))
    mcfg.out_bias = bool(bias is not None and bias.any())
    with shapes_only():
        shapes = {k: p.shape for k, p in build_model(mcfg, None).named_parameters()}
    tensors = read_weights(weights, mcfg, tokenizer.marian_ids, shapes)
    model = build_model(mcfg, tokenizer.pieces_list())
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name])
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".spm", ".safetensors"))
    provenance = {"imported_from": str(folder.resolve()), "sha256": {n: digest(folder / n) for n in files}}
    return model.eval(), Config(model=mcfg), tokenizer, provenance


def _logits_bias(path: Path, V: int) -> torch.Tensor | None:
    """Marian's final_logits_bias (zeros in most models: then the paper's bias-free output layer)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            if "final_logits_bias" not in f.keys() or tuple(f.get_slice("final_logits_bias").get_shape()) != (1, V):
                return None  # read_weights names a wrong shape
            return f.get_tensor("final_logits_bias")
    except (SafetensorError, OSError) as e:
        raise PretrainedError(f"{path}: not a readable safetensors file ({str(e)[:120]})") from None

