"""Plain dataclass configs, one per stage, each checked by its `validate` (overrides.py sets them by dotted key).

Every default is the paper's choice (base model, §3 and §5). Presets are plain data: a dict of
dotted overrides applied on top of the defaults, so ``big`` reads exactly as Table 3 describes it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import ConfigError
from .presets import DECODE_LIMITS, MODEL_LIMITS, TRAIN_LIMITS


def _check_numbers(section: str, cfg: Any) -> None:
    """Every number of a section is finite (a NaN passes every `<`/`>` check silently)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ConfigError(f"{section}.{f.name} must be a finite number, got {value}")


def _check_limits(section: str, cfg: Any, limits: dict[str, float]) -> None:
    for name, most in limits.items():
        value = getattr(cfg, name)
        if value is not None and value > most:
            raise ConfigError(f"{section}.{name} must be at most {most:,}, got {show(value)}")


def show(value: Any) -> str:
    """repr(value), short (a 5,000-digit number has no repr in Python 3.11)."""
    try:
        text = repr(value)
    except ValueError:
        return "a number of thousands of digits"
    return text if len(text) <= 60 else text[:57] + "..."


def _check_positive(section: str, cfg: Any, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{section}.{name} must be positive, got {getattr(cfg, name)}")


@dataclass
class ModelConfig:
    """§3: the encoder-decoder Transformer; defaults are the base model of Table 3.

    ``arch: rnn`` selects the recurrent attention baseline of §1-2 instead (models/rnn.py): it reads
    d_model (embedding and hidden size), N (layers per stack) and p_drop, and the rnn_* fields.
    ``arch: conv`` selects ConvS2S (models/conv.py): d_model is its embedding size, N and N_dec
    its encoder and decoder layers, and the conv_* fields.
    """

    arch: str = "transformer"  # transformer (§3) | rnn (the recurrent baseline) | conv (ConvS2S)
    vocab_size: int = 37000  # §5.1 shared vocabulary: set from the prepared data (a value here is replaced)
    d_model: int = 512  # §3: the width of every sublayer's output and of the embeddings
    d_ff: int = 2048  # §3.3 inner width of each position-wise feed-forward network
    h: int = 8  # §3.2.2 attention heads
    d_k: int | None = None  # §3.2.2 width of a head's queries and keys; None -> d_model / h
    d_v: int | None = None  # §3.2.2 width of a head's values; None -> d_model / h
    N: int = 6  # layers in each stack (§3.1)
    N_dec: int | None = None  # decoder layers when not N; None -> N
    p_drop: float = 0.1  # §5.4 residual dropout
    attn_drop: float = 0.0  # dropout on attention weights (not in the paper)
    pre_norm: bool = False  # §3.1 uses post-norm LayerNorm(x + Sublayer(x))
    learned_positions: bool = False  # Table 3 row (E)
    pointer_input: bool = False  # §6.3 option (ours): decoder inputs carry the next source word's state (pointer.py)
    depth_input: bool = False  # §6.3 option (ours): decoder inputs carry the open brackets' count (pointer.py; F1 -3)
    tag_input: bool = False  # §6.3 option (ours): source subwords carry their word's part-of-speech tag (tagger.py)
    share_embeddings: bool = True  # §3.4 one matrix for both embeddings and the softmax
    fp32_logits: bool = True  # under bf16 autocast, the output projection and softmax stay fp32
    max_positions: int = 1024  # the longest sequence the positional encodings cover (§3.5)
    pad_id: int = 0  # the padding token's id in the vocabulary
    rnn_cell: str = "lstm"  # lstm | gru (arch: rnn)
    rnn_variant: str = "luong"  # luong (attends from h_t, input feeding) | bahdanau (from s_{t-1}, context in cell)
    conv_kernel: int = 3  # arch conv: kernel width k (odd)
    conv_channels: int = 0  # arch conv: hidden size of the convolutions; 0 = d_model
    rnn_attention: str = "additive"  # score: additive (Bahdanau's; Luong's "concat") | dot | general (Luong et al.)
    activation: str = "relu"  # §3.3 ReLU; swish | gelu: pretrained Marian models' (aiayn import hf)
    out_bias: bool = False  # §3.4 no bias before the softmax; Marian's final_logits_bias
    scale_embedding: bool = True  # §3.4 embeddings times sqrt(d_model); Marian's scale_embedding false
    # Where a many-direction model reads its target-language tag: source (Johnson et al. 2017's `<2xx>`, the
    # source's first token) | decoder (the encoder skips it; the decoder starts from it instead of BOS) |
    # auto: a new run on several directions' data takes decoder (+1.6 BLEU on validation: bench/multilingual),
    # else source; a checkpoint that does not say reads it in the source
    lang_tag: str = "auto"
    attention: str = "auto"  # Eq. 1's kernel: auto (SDPA on a GPU and in fp32 CPU training) | sdpa | explicit

    @property
    def parser_inputs(self) -> list[str]:
        """The §6.3 parser inputs (ours) this config turns on: a model with any is parsing/model.py's."""
        return [n for n in ("pointer_input", "depth_input", "tag_input") if getattr(self, n)]

    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.h

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.d_model // self.h

    @property
    def n_dec(self) -> int:
        return self.N_dec if self.N_dec is not None else self.N

    def __post_init__(self) -> None:
        self.validate()  # a config made in code is checked once, where it is made; files and overrides: Config.validate

    def validate(self) -> None:
        _check_numbers("model", self)
        for name, allowed in (("arch", ("transformer", "rnn", "conv")), ("rnn_cell", ("lstm", "gru")),
                              ("rnn_variant", ("luong", "bahdanau")),
                              ("rnn_attention", ("additive", "dot", "general")),
                              ("activation", ("relu", "swish", "gelu")), ("attention", ("auto", "sdpa", "explicit")),
                              ("lang_tag", ("auto", "source", "decoder"))):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"model.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.rnn_variant == "bahdanau" and self.rnn_attention != "additive":
            raise ConfigError(f"model.rnn_variant bahdanau scores with the additive attention of Bahdanau et al.; "
                              f"model.rnn_attention {self.rnn_attention!r} is Luong et al.'s (use rnn_variant luong)")
        _check_positive("model", self, "vocab_size", "d_model", "d_ff", "h", "N", "max_positions")
        _check_limits("model", self, MODEL_LIMITS)
        if self.max_positions * self.d_model > 1 << 26:  # the positional table, at most 256 MB
            raise ConfigError(f"model.max_positions x model.d_model must be at most {1 << 26:,} (a 256 MB "
                              f"positional table), got {self.max_positions:,} x {self.d_model:,}")
        for name in self.parser_inputs + (["lang_tag"] if self.lang_tag == "decoder" else []):
            if self.arch != "transformer":
                raise ConfigError(f"model.{name} is a Transformer option; model.arch is {self.arch!r}")
        if self.conv_kernel < 1 or self.conv_kernel % 2 == 0 or self.conv_channels < 0:
            raise ConfigError(f"model.conv_kernel must be odd and positive (the encoder pads (k-1)/2 on each side), "
                              f"got {self.conv_kernel}; model.conv_channels >= 0, got {self.conv_channels}")
        _check_positive("model", self, *(n for n in ("d_k", "d_v", "N_dec") if getattr(self, n) is not None))
        if not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(f"model.pad_id must be a vocabulary id, in [0, {self.vocab_size}), got {self.pad_id}")
        if self.d_k is None and self.d_model % self.h:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.h ({self.h}) "
                "unless model.d_k and model.d_v are set"
            )
        if self.d_model % 2:
            raise ConfigError(f"model.d_model must be even (sinusoidal positions; the two directions of the "
                              f"recurrent encoder), got {self.d_model}")
        for name in ("p_drop", "attn_drop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass
class DataConfig:
    """§5.1: a joint subword vocabulary and length-bucketed token-count batches."""

    vocab_size: int = 37000  # §5.1 the joint vocabulary `aiayn prepare` learns (not given there: sized to the data)
    max_len: int = 256  # subwords per side; longer training pairs are dropped and counted
    max_tokens: int = 4096  # padded tokens per batch (per side)
    strict: bool = False  # fail on an empty line instead of dropping the pair
    dedup: bool = True  # drop repeated training pairs (counted)
    max_ratio: float = 3.0  # drop training pairs whose subword lengths differ more than this factor; 0 = off
    # Many directions in one model (prepare --pairs; the paper trains one pair): sampling temperatures T
    vocab_temperature: float = 5.0  # each language's share of the vocabulary's sample ∝ its lines^(1/T)
    mix_temperature: float = 1.0  # each direction's share of an epoch ∝ its pairs^(1/T); 1 = proportional

    def validate(self) -> None:
        _check_numbers("data", self)
        _check_positive("data", self, "vocab_size", "max_len", "max_tokens", "vocab_temperature", "mix_temperature")
        if self.max_ratio and self.max_ratio < 1:
            raise ConfigError(f"data.max_ratio must be 0 (off) or >= 1, got {self.max_ratio}")
        if self.vocab_size <= 4:
            raise ConfigError(f"data.vocab_size must leave room beyond the 4 special ids, got {self.vocab_size}")


@dataclass
class TrainConfig:
    """§5.2-5.4: Adam with the Eq. 3 warm-up schedule, label smoothing, checkpoints."""

    seed: int = 1  # initial weights, dropout masks and batch order: the same seed, the same run
    max_steps: int = 100_000  # updates to train (§5.2: base 100k, big 300k)
    max_epochs: int = 0  # passes over the training data at most; 0 = no limit
    max_minutes: float = 0.0  # 0 = no limit; wall-clock budget of the training loop
    tokens_per_update: int = 25_000  # §5.1 target tokens per update (batches follow); 0 = use update_freq
    update_freq: int = 1  # gradient accumulation: batches per update (when tokens_per_update is 0)
    lr_scale: float = 1.0  # factor on Eq. 3
    peak_lr: float = 0.0  # 0 = Eq. 3 as written (tied to d_model); > 0: the same shape, peaking at this rate
    schedule: str = "noam"  # Eq. 3; constant: warm-up to peak_lr, then constant (fine-tuning)
    init_from: str = ""  # a checkpoint whose model and weights the run starts from (fine-tuning; train --init-from)
    warmup_steps: int = 4000  # Eq. 3
    adam_betas: tuple[float, float] = (0.9, 0.98)  # §5.3
    adam_eps: float = 1e-9  # §5.3 Adam's epsilon
    label_smoothing: float = 0.1  # §5.4
    clip_norm: float = 0.0  # 0 = no clipping (the paper does not clip)
    # Guided alignment (Garg et al., 2019; the paper has none): weight of a loss pulling one
    # encoder-decoder head toward reference alignments (data/alignments.py); 0 = off
    guided_alignment: float = 0.0
    guided_layer: int = -2  # decoder layer (negative: from the top; Garg et al.: the penultimate)
    guided_head: int = 0  # the head of that layer that guided alignment trains
    precision: str = "auto"  # auto (bf16 where native, fp16 on older GPUs, else fp32: device.py) | fp32 | bf16 | fp16
    compile: bool = False  # torch.compile the model (PyTorch's automatic dynamic shapes)
    compile_buckets: bool = False  # with compile: lengths padded to a ladder, one graph per length (batches.py)
    threads: int = 0  # CPU threads; 0 = OMP_NUM_THREADS if set (one process), else all cores
    log_every: int = 50  # updates between log lines and metrics records (the progress bar moves by time)
    valid_every: int = 1000  # steps; 0 = only at the end
    valid_bleu_sentences: int = 500  # greedy BLEU on the first K validation pairs; 0 = off
    patience: int = 0  # stop after this many validations without a better score; 0 = off (the paper)
    save_every: int = 0  # steps; 0 = off
    save_every_minutes: float = 10.0  # §6.1: checkpoints every 10 minutes
    keep_last: int = 5  # §6.1: interval checkpoints kept, and averaged by `aiayn average` (big: 20)
    dist_timeout_minutes: float = 60.0  # torchrun: how long a rank waits for the others in a collective
    fused_loss: bool = True  # §5.4's loss compiled into fused kernels on a GPU; false: 8,192-row chunks there too

    def validate(self) -> None:
        _check_numbers("train", self)
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(f"train.adam_betas must be two numbers in [0, 1), got {self.adam_betas}")
        for name in ("seed", "max_steps", "max_epochs", "max_minutes", "threads", "valid_every", "valid_bleu_sentences",
                     "save_every", "save_every_minutes", "clip_norm", "patience", "tokens_per_update"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        _check_positive("train", self, "adam_eps", "log_every", "dist_timeout_minutes", "keep_last")
        _check_limits("train", self, TRAIN_LIMITS)
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ConfigError(f"train.precision must be 'auto', 'fp32', 'bf16' or 'fp16', got {self.precision!r}")
        if self.update_freq < 1:
            raise ConfigError(f"train.update_freq must be >= 1, got {self.update_freq}")
        if self.tokens_per_update and self.update_freq != 1:
            raise ConfigError(
                f"train.update_freq ({self.update_freq}) and train.tokens_per_update ({self.tokens_per_update}) "
                "both size the update; set train.tokens_per_update 0 to accumulate a fixed number of batches")
        if self.warmup_steps < 1:
            raise ConfigError(f"train.warmup_steps must be >= 1, got {self.warmup_steps}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.lr_scale <= 0:
            raise ConfigError(f"train.lr_scale must be positive, got {self.lr_scale}")
        if self.peak_lr < 0 or (self.peak_lr > 0 and self.lr_scale != 1.0):
            raise ConfigError(f"train.peak_lr ({self.peak_lr}) must be >= 0, and with a peak_lr the rate is not "
                              f"scaled by train.lr_scale ({self.lr_scale}): set train.lr_scale 1")
        if self.compile_buckets and not self.compile:
            raise ConfigError("train.compile_buckets pads batches for torch.compile: set train.compile true as well")
        if self.schedule not in ("noam", "constant") or (self.schedule == "constant" and self.peak_lr <= 0):
            raise ConfigError(f"train.schedule must be noam (Eq. 3) or constant (with a train.peak_lr > 0), "
                              f"got {self.schedule!r} (peak_lr {self.peak_lr})")
        if not (math.isfinite(self.guided_alignment) and self.guided_alignment >= 0):
            raise ConfigError(f"train.guided_alignment must be a weight >= 0, got {self.guided_alignment}")


@dataclass
class DecodeConfig:
    """§6.1: beam 4, length penalty alpha 0.6, max output length = input length + 50."""

    beam: int = 4  # §6.1 beam size
    alpha: float = 0.6  # §6.1 length penalty alpha (Wu et al., 2016)
    max_len_a: float = 1.0  # §6.1 longest output: max_len_a x input length + max_len_b
    max_len_b: int = 50  # §6.1 the +50 of the longest output
    nbest: int = 1  # translations given per input, best first
    max_tokens: int | None = None  # source tokens per translation batch; None: by the decoding device
    step: str = "auto"  # the decoder step: auto (fused; compiled with --compile) | modules | fused | compiled | graphed
    # Beam for sentences holding dictated terms (decode/constraints.py; not in the paper); 0: 2 x beam, chosen on
    # validation (bank allocation at beam 4 cost 0.7 BLEU, at 8 it gained 1.7: docs/serving.md)
    constraint_beam: int = 0
    # Sampling instead of search (decode/sampling.py; the paper searches): back-translation's sources
    sample: bool = False  # draw each next token from the model's distribution (beam is then ignored)
    temperature: float = 1.0  # sampling: log-probabilities divided by it (< 1 sharper, > 1 flatter)
    top_k: int = 0  # sampling: only the k most probable tokens (0: all)
    top_p: float = 1.0  # sampling: only the most probable tokens holding this much of the mass (1: all)
    seed: int = 1  # sampling: with a sentence's subwords, seeds its draws (the same alone or in a batch)

    def validate(self) -> None:
        _check_numbers("decode", self)
        for name, ok, want in (("temperature", 0 < self.temperature <= 100, "in (0, 100]"),
                               ("top_k", self.top_k >= 0, ">= 0"), ("top_p", 0 < self.top_p <= 1, "in (0, 1]")):
            if not ok:
                raise ConfigError(f"decode.{name} must be {want}, got {getattr(self, name)}")
        if self.sample and self.nbest != 1:
            raise ConfigError(f"decode.sample draws one translation per input: decode.nbest must be 1, got "
                              f"{self.nbest}")
        if self.max_tokens is not None:
            _check_positive("decode", self, "max_tokens")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise ConfigError(f"decode.max_len_a and decode.max_len_b must be >= 0, got {self.max_len_a}, "
                              f"{self.max_len_b}")
        if self.beam < 1:
            raise ConfigError(f"decode.beam must be >= 1, got {self.beam}")
        if self.constraint_beam < 0:
            raise ConfigError(f"decode.constraint_beam must be >= 0 (0: 2 x beam), got {self.constraint_beam}")
        if not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"decode.nbest must be in [1, beam={self.beam}], got {self.nbest}")
        if self.alpha < 0:
            raise ConfigError(f"decode.alpha must be >= 0, got {self.alpha}")
        if self.step not in ("auto", "modules", "fused", "compiled", "graphed"):
            raise ConfigError(f"decode.step must be auto, modules, fused, compiled or graphed, got {self.step!r}")
        _check_limits("decode", self, DECODE_LIMITS)


@dataclass
class Config:
    """Everything a run needs, one dataclass per stage."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def validate(self) -> Config:
        self.model.validate()
        self.data.validate()
        self.train.validate()
        self.decode.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The config as load_yaml reads it back (a run writes it atomically: training/run_folder.py)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
