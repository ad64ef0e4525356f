"""Checkpoints that carry everything needed to rebuild, written atomically; averaging (§6.1).

A checkpoint is `NAME.safetensors` (weights; the config, vocabulary and step in its metadata,
so `translate` needs nothing else) plus, for training, `NAME.state.pt` (optimizer, RNG and data
position, loaded with `weights_only=True`). Neither load executes pickled code.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .config import Config, ConfigError, ModelConfig
from .data.tokenizer import Tokenizer, read_tokenizer
from .errors import AiaynError
from .files import FileError, atomic_write, check_output_file
from .models.build import build_model, shapes_only
from .overrides import from_dict
from .progress import bar

Builder = Callable[[ModelConfig, "list[str] | None"], torch.nn.Module]


class CheckpointError(AiaynError):
    """A missing, corrupt or incompatible checkpoint; the message names the file."""


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (tied weights once, under their first name); buffers are not saved (a model rebuilds them)."""
    model = getattr(model, "module", model)  # unwrap DDP
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in model.named_parameters()}
    return tensors


def save_weights(path: Path, tensors: dict[str, torch.Tensor], cfg: Config, tokenizer: Tokenizer,
                 step: int, extra: dict[str, Any] | None = None) -> None:
    meta = {
        "format": "aiayn-1",
        "config": json.dumps(cfg.to_dict()),
        "spm_model": base64.b64encode(tokenizer.proto).decode("ascii"),
        "step": str(step),
        "extra": json.dumps(extra or {}),
    }
    atomic_write(path, st_save(tensors, metadata=meta))


def link_last(newest: Path) -> None:
    """last.safetensors beside best: the newest checkpoint under a name that does not change (a hard
    link to it, or a copy where links fail), replaced in one step."""
    tmp = newest.with_name(".last.safetensors.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(newest, tmp)
    except OSError:
        shutil.copyfile(newest, tmp)
    os.replace(tmp, newest.with_name("last.safetensors"))


def save_state(path: Path, state: dict[str, Any]) -> None:
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(path, buf.getvalue())


def refuse_folder(path: str | Path) -> None:
    """One line for a checkpoint argument that names a folder (a training run's: what to give instead)."""
    p = Path(path)
    if p.is_dir():
        run = (p / "run.json").is_file()
        raise CheckpointError(f"{p}: a folder, not a checkpoint file" + (
            f" (a training run's: give its {p / 'checkpoints' / 'best.safetensors'}, the best on validation, or "
            f"the average of its last checkpoints, aiayn average {p} -o avg.safetensors, §6.1)" if run else ""))


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = Path(path)
    refuse_folder(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    data = path.read_bytes()
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + header_len]).get("__metadata__") or {}
    except (SafetensorError, ValueError, json.JSONDecodeError) as e:
        if data[:4] == b"PK\x03\x04" or data[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
            raise CheckpointError(
                f"{path}: a PyTorch pickle (torch.save, e.g. a fairseq checkpoint), not an aiayn safetensors "
                "checkpoint; aiayn never unpickles model files, since a pickle can run code") from None
        raise CheckpointError(f"{path}: not a readable safetensors checkpoint ({e})") from None
    if meta.get("format") != "aiayn-1":
        raise CheckpointError(f"{path}: not an aiayn checkpoint (a safetensors file without aiayn metadata, "
                              "e.g. a Hugging Face model)")
    return tensors, meta


def _read_header(path: Path) -> dict:
    """A safetensors file's header (tensor names, dtypes, shapes, offsets; __metadata__), read alone."""
    refuse_folder(path)
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > Path(path).stat().st_size - 8:  # a pickle's first bytes read as a header of exabytes
                raise ValueError("not a safetensors header")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a mapping")
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable metadata ({e})") from None
    return header


def read_metadata(path: Path) -> dict[str, str]:
    """A checkpoint's metadata (config, vocabulary, step, extra) from its header alone, no tensor read."""
    meta = _read_header(path).get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: unreadable metadata (metadata is not a mapping)")
    return meta


def tensor_bytes(path: Path) -> int:
    """The bytes a checkpoint's tensors take, from its header's offsets (no tensor read)."""
    entries = [v for k, v in _read_header(path).items() if k != "__metadata__" and isinstance(v, dict)]
    try:
        return sum(int(v["data_offsets"][1]) - int(v["data_offsets"][0]) for v in entries)
    except (KeyError, IndexError, TypeError, ValueError):
        raise CheckpointError(f"{path}: unreadable metadata (tensor offsets)") from None


def check_safetensors_output(path: str | Path, flag: str = "--output", inputs: tuple = (),
                             ours: Callable[[dict], bool] = lambda meta: meta.get("format") == "aiayn-1",
                             what: str = "an aiayn checkpoint") -> Path:
    """check_output_file, and a file already there is replaced only if its header says aiayn wrote
    it (`ours` of its metadata): never a user's notes, corpus or another tool's model (the folders' rule,
    for single files that can carry the mark)."""
    out = check_output_file(path, flag, inputs)
    if out.exists():
        try:
            mine = ours(read_metadata(out))
        except CheckpointError:
            mine = False
        if not mine:
            raise FileError(f"{flag} {out}: exists and is not {what}; aiayn replaces only files it wrote: "
                            "choose another name, or move this one away")
    return out


def read_extra(path: Path) -> dict[str, Any]:
    """A checkpoint's `extra` metadata (task, tuning, provenance, alignment head) from its header alone."""
    return meta_extra(read_metadata(path), path)


def meta_extra(meta: dict[str, str], path: Path | str) -> dict[str, Any]:
    """The `extra` field of a checkpoint's metadata: a JSON object, or a CheckpointError naming it."""
    try:
        extra = json.loads(meta.get("extra", "{}"))
    except (ValueError, RecursionError) as e:
        what = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:120]
        raise CheckpointError(f"{path}: damaged metadata (extra is not JSON: {what})") from None
    if not isinstance(extra, dict):
        raise CheckpointError(f"{path}: damaged metadata (extra is a {type(extra).__name__}, not a mapping)")
    return extra


def meta_step(meta: dict[str, str], path: Path | str) -> int:
    """The `step` field of a checkpoint's metadata: the updates it was trained for, 0 <= step < 10^18."""
    text = meta.get("step", "0")
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise CheckpointError(f"{path}: damaged metadata (step is {text[:40]!r}, not a count of updates)")
    return int(text)


def read_task(path: Path) -> dict[str, str]:
    """What the model was trained for, from the metadata alone: {"task": "parse", "linearization": ...}
    for a §6.3 parser, {"task": "translate"} when its data named no task."""
    extra = read_extra(path)
    return {"task": "translate", **{k: str(v) for k, v in extra.items() if k in ("task", "linearization")}}


def load_checkpoint(path: Path, device: str | torch.device = "cpu", build: Builder = build_model
                    ) -> tuple[torch.nn.Module, Config, Tokenizer, int]:
    """Rebuild the model (the architecture its config names, by `build`), config and tokenizer
    from one `.safetensors` file. §6.3's parsers with inputs of their own need parsing/model.py's
    builder (`build_any`); the default refuses them in one line."""
    tensors, meta = read_weights(path)
    cfg, tokenizer = read_meta(meta, path)
    model = build_checked(cfg, tokenizer, tensors, path, build)
    return model.to(device).eval(), cfg, tokenizer, meta_step(meta, path)


def read_meta(meta: dict[str, str], path: Path | str) -> tuple[Config, Tokenizer]:
    """The config and the vocabulary a checkpoint's metadata carries, or a CheckpointError naming
    the file and the damaged field."""
    try:
        d = json.loads(meta["config"])
    except KeyError:
        raise CheckpointError(f"{path}: damaged metadata (no config)") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, a number of 5,000 digits, nesting
        what = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:120]
        raise CheckpointError(f"{path}: damaged metadata (config is not JSON: {what})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: damaged metadata (config is a {type(d).__name__}, not a mapping)")
    try:
        cfg = from_dict(d).validate()  # every field typed and bounded (config.MODEL_LIMITS)
    except (ConfigError, TypeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: damaged metadata (config: {str(e)[:300]})") from None
    try:
        tokenizer = read_tokenizer(base64.b64decode(meta["spm_model"], validate=True))
    except KeyError:
        raise CheckpointError(f"{path}: damaged metadata (no spm_model)") from None
    except Exception as e:  # binascii.Error, SentencePiece's RuntimeError, TokenizerError
        raise CheckpointError(f"{path}: damaged metadata (spm_model is not a SentencePiece model: "
                              f"{type(e).__name__})") from None
    if cfg.model.vocab_size != len(tokenizer):
        raise CheckpointError(f"{path}: damaged metadata (model.vocab_size {cfg.model.vocab_size} but its "
                              f"vocabulary has {len(tokenizer)} pieces)")
    return cfg, tokenizer


def build_checked(cfg: Config, tokenizer: Tokenizer, tensors: dict[str, torch.Tensor], path: Path | str,
                  build: Builder = build_model) -> torch.nn.Module:
    """The model the config names with the file's weights in it. It is built first on the meta
    device (no memory) and its shapes compared with the file's, so a config that does not match
    its weights is refused before anything the size of the model is allocated."""
    try:
        with shapes_only():
            skeleton = build(cfg.model, None)
    except ConfigError as e:  # a parser's config given to the translation models' builder
        raise CheckpointError(f"{path}: {e}") from None
    _check_shapes(skeleton, tensors, path)
    model = build(cfg.model, tokenizer.pieces_list())
    load_into(model, tensors, path)
    return model


def _check_shapes(model: torch.nn.Module, tensors: dict[str, torch.Tensor], path: Path | str) -> None:
    params = dict(model.named_parameters())
    missing, unexpected = set(params) - set(tensors), set(tensors) - set(params)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})"
        )
    for name, p in params.items():
        if p.shape != tensors[name].shape:
            raise CheckpointError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, "
                                  f"model expects {tuple(p.shape)}")


def load_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor], path: Path | str) -> None:
    model = getattr(model, "module", model)
    model = getattr(model, "_orig_mod", model)
    _check_shapes(model, tensors, path)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name])


class DamagedState(CheckpointError):
    """A training state that cannot be read: not torch.save's zip, past its bound, or incomplete."""


STATE_SLACK_BYTES = 64 << 20  # RNG, data position and pickle beside the optimizer's moments


def state_bound(path: Path) -> int:
    """What NAME.state.pt may hold, unpacked: Adam's two moments are twice the fp32 weights in
    NAME.safetensors beside it; 8x their size (weights stored in 16 bits) plus 64 MiB."""
    weights = Path(path).with_name(Path(path).name.replace(".state.pt", ".safetensors"))
    return 8 * (weights.stat().st_size if weights.is_file() else 0) + STATE_SLACK_BYTES


def load_state(path: Path) -> dict[str, Any]:
    """NAME.state.pt, its records' unpacked sizes checked against `state_bound` before torch reads it
    (torch allocates each record's declared size: a small deflated file could claim gigabytes)."""
    if not Path(path).is_file():
        raise DamagedState(f"{path}: not a regular file (a folder, a FIFO or a device), where the training "
                              "state belongs" if Path(path).exists() else f"training state not found: {path}")
    try:
        with zipfile.ZipFile(path) as z:
            unpacked = sum(info.file_size for info in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise DamagedState(f"{path}: corrupt training state, not the zip torch.save writes "
                              f"({type(e).__name__})") from None
    if unpacked > state_bound(path):
        raise DamagedState(f"{path}: corrupt training state: its records unpack to {unpacked:,} bytes, more "
                              f"than the {state_bound(path):,} a state beside its weights may hold")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's advice to unpickle unsafely is not for us
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for corrupt files
        raise DamagedState(f"{path}: corrupt training state, or one holding more than tensors and numbers "
                              f"(not unpickled: {type(e).__name__})") from None


def average_checkpoints(paths: list[Path], progress: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """§6.1: the element-wise mean of the parameters of several checkpoints of one run (a bar with
    `progress`)."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    with bar(len(paths), "checkpoint", "averaging", progress) as shown:
        for path in paths:
            tensors, meta_i = read_weights(path)
            if total and (set(tensors) != set(total) or any(tensors[k].shape != total[k].shape for k in total)):
                raise CheckpointError(f"{path}: parameters differ from {paths[0]}; cannot average")
            for k, v in tensors.items():
                total[k] = total[k] + v.double() if k in total else v.double()
            meta = meta_i  # config/vocabulary of the last checkpoint
            shown.update(1)
    read_meta(meta, paths[-1]), meta_step(meta, paths[-1]), meta_extra(meta, paths[-1])  # whole, as it is copied
    return {k: (v / len(paths)).float() for k, v in total.items()}, meta


def write_averaged(paths: list[Path], out: Path, progress: bool = False) -> None:
    tensors, meta = average_checkpoints(paths, progress)
    extra = meta_extra(meta, paths[-1])
    extra["averaged"] = [str(p) for p in paths]
    meta = {**meta, "extra": json.dumps(extra)}
    atomic_write(out, st_save(tensors, metadata=meta))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Step checkpoints of a run, oldest first."""
    return sorted((Path(run_dir) / "checkpoints").glob("step-*.safetensors"))
