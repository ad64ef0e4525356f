"""§6.3's parser with the inputs we added (ours; off by default): the Transformer of model.py plus
the next source word's state and the open brackets' count beside each decoder input (pointer.py),
and each source subword's part-of-speech tag beside its embedding (tagger.py).

The Transformer itself knows no parser: it offers four places for extra inputs (`add_inputs`,
`source_extra`, `decoder_extra`, `input_states`), and this model fills them. Its modules keep the
names and the order they always had (`pointer_proj`, `depth`, `tag_embed`, registered after the
decoder), so checkpoints and training states written before load and resume unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from ..checkpoint import CheckpointError, meta_extra, read_weights
from ..config import ModelConfig
from ..data.tokenizer import Tokenizer
from ..models.build import build_model
from ..models.transformer import Transformer
from .pointer import BracketDepth, PointerState, bracket_deltas, gather, next_positions
from .tagger import N_TAGS, SourceTagger, Tagger, TaggerError


def build_any(cfg: ModelConfig, pieces: list[str] | None = None) -> nn.Module:
    """The model any config names: this parser when it turns on one of its inputs, else
    models/build.py's. `pieces`, the vocabulary, tells a model.depth_input parser which pieces are
    brackets (without them none counts, e.g. to count parameters or to check shapes)."""
    if not cfg.parser_inputs:
        return build_model(cfg)
    model = ParserTransformer(cfg)
    if cfg.depth_input and pieces is not None:
        model.depth.delta.copy_(bracket_deltas(pieces))
    return model


def attach_tagger(model: nn.Module, tagger: Tagger, tokenizer: Tokenizer) -> None:
    """Gives a model.tag_input parser the tagger that tags the sources it is given without tags."""
    model.src_tagger = SourceTagger(tagger, tokenizer.pieces_list())


def read_tagger(path: Path | str) -> Tagger:
    """The part-of-speech tagger a `model.tag_input` checkpoint carries in its metadata."""
    _, meta = read_weights(Path(path))
    try:
        text = meta_extra(meta, path)["tagger"]
    except KeyError:
        raise CheckpointError(f"{path}: damaged metadata (model.tag_input is on but no tagger is stored)") from None
    try:
        return Tagger.from_json(text, str(path))
    except TaggerError as e:
        raise CheckpointError(str(e)) from None


class ParserTransformer(Transformer):
    """§6.3 with pointer, bracket-depth and tag inputs, as the config turns each on."""

    def add_inputs(self, cfg: ModelConfig) -> None:
        d = cfg.d_model
        if cfg.pointer_input:  # the next source word's state joins each decoder input
            self.pointer_proj = nn.Linear(d, d, bias=False)
        if cfg.depth_input:  # so does the number of open brackets
            self.depth = BracketDepth(cfg.vocab_size, d)
        if cfg.tag_input:  # each source subword's word class joins its embedding (tagger.py)
            self.tag_embed = nn.Embedding(N_TAGS, d, padding_idx=0)
        self.src_tagger: Callable[[Tensor], Tensor] | None = None  # tags sources given without (the checkpoint's)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.cfg.tag_input:
            with torch.no_grad():
                self.tag_embed.weight[0].zero_()

    def source_extra(self, src: Tensor, src_tags: Tensor | None) -> Tensor | None:
        """The tags' embedding, from `src_tags` (B, S) or, without them, from the model's tagger."""
        if not self.cfg.tag_input:
            return None
        if src_tags is None:
            if self.src_tagger is None:
                raise ValueError("this model reads part-of-speech tags beside its words (model.tag_input), and "
                                 "neither tags nor a tagger were given")
            src_tags = self.src_tagger(src)
        return self.tag_embed(src_tags) * math.sqrt(self.cfg.d_model)

    def decoder_extra(self, src: Tensor, memory: Tensor, tgt_in: Tensor) -> Tensor | None:
        """The pointer's and the depth's additions to the teacher-forced decoder inputs (pointer.py)."""
        parts = [self.pointer_proj(gather(memory, next_positions(src, tgt_in)))] if self.cfg.pointer_input else []
        parts += [self.depth(tgt_in)] if self.cfg.depth_input else []
        return sum(parts) if parts else None

    def input_states(self, memory: Tensor, src: Tensor, group: int) -> list:
        inputs = [PointerState.start(self.pointer_proj(memory), src, group)] if self.cfg.pointer_input else []
        inputs += [self.depth.start(src.size(0) * group)] if self.cfg.depth_input else []
        return inputs

    @property
    def decoder_inputs(self) -> bool:
        return self.cfg.pointer_input or self.cfg.depth_input
