"""Decoding with several trained models at once (ours; the paper decodes single models, and its
Table 2's ensembles are other papers').

At every step each model scores the next token on its own, with its own cache, and the ensemble's
score is the mean of their log-probabilities (a product of the models' distributions, which search
renormalizes). The models must share one vocabulary: the same prepared data, any architecture,
size or seed. Search (search.py) and the tree constraint (treesearch.py) see one model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..checkpoint import Builder, CheckpointError, load_checkpoint, refuse_folder
from ..config import Config
from ..data.tokenizer import Tokenizer
from ..models.build import build_model
from ..pretrained import import_hf


class Ensemble(nn.Module):
    """Several `IncrementalDecoder`s of one vocabulary as one: mean log-probabilities per step."""

    def __init__(self, models: Sequence[nn.Module]):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        # Search's fused steps (fusedstep.FusedDecoder) are not modules: then a plain list.
        self.members = nn.ModuleList(models) if all(isinstance(m, nn.Module) for m in models) else list(models)
        # Sources are truncated to what every member can encode.
        self.cfg = dataclasses.replace(models[0].cfg, max_positions=min(m.cfg.max_positions for m in models))

    def start_decoding(self, src: Tensor, group: int = 1) -> EnsembleState:
        return EnsembleState([m.start_decoding(src, group) for m in self.members])

    def decode_step(self, tokens: Tensor, state: EnsembleState) -> Tensor:
        """(R, V) mean over the members of log softmax of their logits (in fp32)."""
        lp = [torch.log_softmax(m.decode_step(tokens, s).float(), -1) for m, s in zip(self.members, state.states)]
        return torch.stack(lp).mean(0)


@dataclass
class EnsembleState:
    """Each member's own decoding state, reordered together."""

    states: list

    def reorder(self, rows: Tensor, sources: Tensor | None = None) -> None:
        for s in self.states:
            s.reorder(rows, sources)


def _load(path: Path, device: str | torch.device, build: Builder) -> tuple:
    """A checkpoint, or a pretrained MarianMTModel folder read as `aiayn import hf` reads it."""
    if (path / "run.json").is_file() and not (path / "config.json").is_file():
        refuse_folder(path)  # a training run's, not a MarianMTModel's
    if path.is_dir():
        model, cfg, tokenizer, _ = import_hf(path)
        return model.to(device), cfg, tokenizer, 0
    return load_checkpoint(path, device, build)


def load_models(paths: Sequence[str | Path], device: str | torch.device = "cpu", build: Builder = build_model
                ) -> tuple[nn.Module, Config, Tokenizer]:
    """One checkpoint's model, or the `Ensemble` of several that share one vocabulary (else a
    CheckpointError naming the file); the config and the tokenizer are the first checkpoint's.
    `build`: checkpoint.load_checkpoint's (a parser's loader gives its own)."""
    if not paths:
        raise CheckpointError("no checkpoint given")
    loaded = [_load(Path(p), device, build) for p in paths]
    model, cfg, tokenizer, _ = loaded[0]
    for p, (_, _, other, _) in zip(paths[1:], loaded[1:]):
        if other.proto != tokenizer.proto:
            raise CheckpointError(f"{p}: its vocabulary differs from {paths[0]}'s; an ensemble's models must "
                                  "share one (train them on the same prepared data)")
    return (model if len(loaded) == 1 else Ensemble([m for m, _, _, _ in loaded])), cfg, tokenizer
