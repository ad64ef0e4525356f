"""Raw text in, translations out: batching by tokens, search, detokenization (§6.1)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..checkpoint import Builder, CheckpointError, read_extra
from ..config import ConfigError, DecodeConfig
from ..data.tokenizer import BOS, EOS, PAD, Tokenizer
from ..device import PRECISIONS, decode_batch_tokens, huge_pages, pick_device, resolve_precision
from ..models.attention import without_dead_heads
from ..models.build import build_model
from ..models.linear import Int8Linear, kernel_cache
from ..presets import DECODE_LIMITS
from ..score import Links
from .align import cross_attention, links_of, word_links
from .ensemble import Ensemble, load_models
from .fused import FusedDecoder, fusable
from .graphed import search_beams
from .search import Hypothesis, greedy_search
from .shortlist import Shortlist, ShortlistDecoder, ShortlistError, vocabulary_id

log = logging.getLogger("aiayn")
def cast_bf16(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model whose projections hold bf16 weights, for decoding under bf16 autocast:
    autocast would otherwise round every fp32 weight to bf16 again at every step (the same
    rounding, so the results are identical), which for one sentence cost more than the products.
    Embeddings and LayerNorm stay fp32; the tied output layer gets its own bf16 copy unless it
    computes in fp32 (model.fp32_logits)."""
    import copy

    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and not getattr(m, "fp32", False):
            m.weight = torch.nn.Parameter(m.weight.detach().to(torch.bfloat16), requires_grad=False)
            if m.bias is not None:
                m.bias = torch.nn.Parameter(m.bias.detach().to(torch.bfloat16), requires_grad=False)
    return model


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model whose projections (§3.2.2, §3.3) and output layer (§3.4) compute with
    int8 weights (one scale per output channel) and int8 activations (one scale per row, taken on
    the fly): linear.Int8Linear. Embeddings, LayerNorm, softmax and attention stay in fp32; the
    tied output layer gets its own int8 copy of the embedding matrix, the embeddings keep theirs."""
    import copy

    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, Int8Linear(child))
    return model


@dataclass
class Translation:
    """One translation of a sentence: detokenized text, score, subword pieces and their ids."""

    text: str
    score: float
    pieces: list[str]
    ids: list[int]


def _live_heads(model: torch.nn.Module) -> torch.nn.Module:
    """The model without the heads `aiayn heads` pruned (they cost nothing in decoding)."""
    slim, dead = without_dead_heads(model)
    if dead:
        log.info("decoding without the %d attention heads whose W^O columns are zero (pruned)", dead)
    return slim


def _casts_itself(model: torch.nn.Module) -> bool:
    """Whether search runs fused steps only (FusedDecoder computes in its own precision, outside autocast)."""
    if isinstance(model, Ensemble):
        return all(isinstance(m, FusedDecoder) for m in model.members)
    return isinstance(model, FusedDecoder)


class Translator:
    """A trained model, its vocabulary and decoding settings, ready to translate sentences.

    >>> t = Translator.load("model.safetensors")
    >>> t.translate(["A man is riding a bike."])
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, decode: DecodeConfig | None = None,
                 device: str | torch.device | None = None, precision: str = "auto", fused: bool = True,
                 compiled: bool = False):
        """`device` moves the model there; None (the default) uses it where it is, so a model shared
        with other users (the server's, the trainer's) is never moved behind their back.
        `precision`: auto (bf16 where the processor has it natively, else fp32), fp32, bf16 or
        int8 (CPU). bf16 and int8 decode with a converted copy made here (bf16 weights; int8
        weights), so later changes to the model's weights reach them only when `model` is set
        again; the given model is left as it is. `fused`: a Transformer decodes through
        fusedstep.FusedDecoder (identical logits, less overhead per step); False: through its modules.
        `compiled`: that fused step runs under torch.compile (fusedstep.compiled_step; the first
        translations of each batch shape compile it; logits agree with eager to rounding)."""
        kernel_cache(1024)  # decoding reuses its shapes: a larger oneDNN cache pays (linear.py)
        huge_pages()
        self.fused, self.compiled = fused, compiled
        here = next(model.parameters()).device
        self.device = here if device is None else torch.device(device)
        self.precision, why = resolve_precision(precision, self.device)
        (log.warning if why.startswith("int8 refused") else log.info)("decoding in %s (%s)", self.precision, why)
        self.model = model.eval() if self.device == here else model.eval().to(self.device)
        self.tokenizer = tokenizer
        self.decode_cfg = decode = decode or DecodeConfig()
        log.info("translation batches of %d source tokens (%s)", *decode_batch_tokens(self.device, decode.max_tokens))
        self.data_max_len = 0  # subwords per side in training (data.max_len), when loaded from a checkpoint
        self.alignment_head: tuple[int, int | None] | None = None  # `aiayn align`'s choice, when loaded
        self.shortlist: Shortlist | None = None  # see use_shortlist

    def use_shortlist(self, shortlist: Shortlist | str | Path | None) -> None:
        """Decode over each sentence's shortlist of target subwords (shortlist.py; None: the whole
        vocabulary, the paper's). Needs the fused step (a Transformer without parser inputs)."""
        if shortlist is not None and not isinstance(shortlist, Shortlist):
            shortlist = Shortlist.load(Path(shortlist), self.tokenizer.proto)
        if shortlist is not None and shortlist.vocab != vocabulary_id(self.tokenizer.proto):
            raise ShortlistError("the shortlist was built for another vocabulary than this model's")
        if shortlist is not None and not isinstance(self.search_model, FusedDecoder):
            raise ConfigError("a shortlist needs the fused decoder step, which this model does not take "
                              "(parser inputs, forward hooks, an ensemble or not a Transformer)")
        self.shortlist = shortlist

    @property
    def model(self) -> torch.nn.Module:
        """The model as given (attention maps, the trainer's and the server's own use)."""
        return self._model

    @model.setter
    def model(self, model: torch.nn.Module) -> None:
        # What the search runs: bf16 and int8 decode with a converted copy of the model (a wrapper
        # set here, such as parse.LeafCounting, is converted with what it wraps); an ensemble, member by member.
        self._model = model
        if isinstance(model, Ensemble):
            slims = [_live_heads(m) for m in model.members]
            fuse = all(fusable(m) for m in slims)  # all fused or none: one autocast for the whole step
            self.search_model = Ensemble([self._searchable(m, fuse) for m in slims])
        else:
            slim = _live_heads(model)
            self.search_model = self._searchable(slim, fusable(slim))
        if self.compiled and not _casts_itself(self.search_model):
            log.warning("compiled decoding needs the fused step, which this model does not take (parser inputs, "
                        "forward hooks or not a Transformer): decoding without torch.compile")
        if getattr(self, "shortlist", None) is not None:
            self.use_shortlist(self.shortlist)  # the new model must take it too

    def _searchable(self, slim: torch.nn.Module, fuse: bool) -> torch.nn.Module:
        """One model (its live heads only) as search runs it: converted to the precision, fused if `fuse`."""
        out = {"int8": quantize_int8, "bf16": cast_bf16}.get(self.precision, lambda m: m)(slim)
        if self.fused and fuse:  # the same numbers, fewer calls
            if self.precision == "int8":
                return FusedDecoder(slim, int8=True, encoder=out, compiled=self.compiled)
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
            return FusedDecoder(out, dtype, compiled=self.compiled)
        return out

    @classmethod
    def load(cls, path: str | Path | Sequence[str | Path], device: str | torch.device | None = None,
             precision: str = "auto", compiled: bool = False, shortlist: Shortlist | str | Path | None = None,
             build: Builder = build_model, **decode_overrides) -> Translator:
        """Load a checkpoint, or several of one vocabulary as an ensemble.Ensemble (decoding settings
        from the first); decode_overrides are DecodeConfig fields (beam, alpha, max_len_a, max_len_b,
        nbest, max_tokens). device None: CUDA when available, else the CPU.
        shortlist: a file of `aiayn shortlist` (see use_shortlist). build: checkpoint.load_checkpoint's."""
        import dataclasses

        fields = [f.name for f in dataclasses.fields(DecodeConfig)]
        unknown = [k for k in decode_overrides if k not in fields]
        if unknown:
            raise TypeError(f"Translator.load() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                            f"decoding settings are: {', '.join(fields)}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        dev = pick_device(device)
        model, cfg, tokenizer = load_models([path] if isinstance(path, (str, Path)) else list(path), dev, build)
        cfg.decode.max_tokens = None  # a batch's size is the decoding machine's, not the checkpoint's
        for k, v in decode_overrides.items():
            setattr(cfg.decode, k, v)
        cfg.decode.validate()
        if cfg.decode.beam > len(tokenizer):
            raise ConfigError(f"decode.beam ({cfg.decode.beam}) is larger than the vocabulary ({len(tokenizer)})")
        translator = cls(model, tokenizer, cfg.decode, dev, precision, compiled=compiled)
        translator.data_max_len = cfg.data.max_len  # the training length: a server's default sentence limit
        translator.use_shortlist(shortlist)
        first = Path(path if isinstance(path, (str, Path)) else list(path)[0])
        chosen = read_extra(first).get("alignment") if first.is_file() else None
        translator.alignment_head = None if chosen is None else _checked_head(chosen, model.cfg, first)
        return translator

    def _head(self) -> tuple[int, int | None]:
        """The alignment head: `aiayn align`'s choice, else the last layer's mean (which it usually picks)."""
        return self.alignment_head or (self.model.cfg.n_dec - 1, None)

    def align(self, ids: list[list[int]], hyps: list[list[Hypothesis]]) -> list[Links]:
        """Word links of each source (ids with EOS) with its best hypothesis, from the head `aiayn
        align` chose (decode/align.py; without one, the last layer's mean, which it usually picks):
        taken during the search where `translate_ids(alignments=True)` ran the fused step, else
        from one teacher-forced pass over the hypotheses."""
        if isinstance(self.model, Ensemble):
            raise ConfigError("alignments come from one model's attention; translate with one checkpoint")
        head = self._head()
        src = [x[:-1] for x in ids]
        tgt = [h[0].tokens if h else [] for h in hyps]
        out: list[Links] = [set() for _ in ids]
        keep = []
        for k in (k for k in range(len(ids)) if src[k] and tgt[k]):
            if hyps[k][0].attended is None:
                keep.append(k)
            else:
                out[k] = word_links({(i, j) for j, i in enumerate(hyps[k][0].attended)},
                                    self.tokenizer.id_to_piece(src[k]), self.tokenizer.id_to_piece(tgt[k]))
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            for k, weights in cross_attention(self.model, [src[k] for k in keep], [tgt[k] for k in keep],
                                              batch=128, layer=head[0]):
                i = keep[k]
                out[i] = word_links(links_of(weights, (0, head[1])), self.tokenizer.id_to_piece(src[i]),
                                    self.tokenizer.id_to_piece(tgt[i]))
        return out

    def encode_sources(self, lines: list[str], first_line: int = 1) -> list[list[int]]:
        """Subword ids + EOS; sources longer than the model allows are truncated with a warning
        (naming the input's line number: `first_line` is lines[0]'s)."""
        limit = self.model.cfg.max_positions - 1
        ids = self.tokenizer.encode([line.strip() for line in lines])
        out = []
        for n, x in enumerate(ids, first_line):
            if len(x) > limit:
                log.warning("input line %d has %d subwords; truncated to the model's maximum %d", n, len(x), limit)
                x = x[:limit]
            out.append(x + [EOS] if x else [])
        return out

    def _batches(self, ids: list[list[int]], max_tokens: int) -> Iterable[list[int]]:
        order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: len(ids[i]))
        batch: list[int] = []
        for i in order:
            if batch and (len(batch) + 1) * len(ids[i]) > max_tokens:
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    @torch.no_grad()
    def translate_ids(self, ids: list[list[int]], beam: int | None = None, alpha: float | None = None,
                      nbest: int | None = None, progress: bool = False,
                      abandoned: Callable[[], set[int]] | None = None, alignments: bool = False
                      ) -> list[list[Hypothesis]]:
        """Search for every source (ids with EOS); empty sources give no hypotheses. `abandoned`:
        the indices of `ids` nobody waits for any more (asked every few steps; they stop there).
        `alignments`: the fused step also keeps where the alignment head attended (for `align`)."""
        d = self.decode_cfg
        beam = d.beam if beam is None else beam
        alpha, nbest = d.alpha if alpha is None else alpha, d.nbest if nbest is None else nbest
        if not 1 <= beam <= len(self.tokenizer):
            raise ValueError(f"beam must be in [1, vocabulary size {len(self.tokenizer)}], got {beam}")
        if not 0 <= alpha <= DECODE_LIMITS["alpha"]:  # NaN fails too
            raise ValueError(f"alpha must be in [0, {DECODE_LIMITS['alpha']}], got {alpha}")
        if not 1 <= nbest <= beam:
            raise ValueError(f"nbest must be in [1, beam={beam}], got {nbest}")
        results: list[list[Hypothesis]] = [[] for _ in ids]
        limit = self.model.cfg.max_positions - 1
        if isinstance(self.search_model, FusedDecoder):
            self.search_model.align_head = self._head() if alignments else None
        autocast = self.precision == "bf16" and not _casts_itself(self.search_model)
        ctx = (torch.autocast(self.device.type, dtype=torch.bfloat16) if autocast
               else torch.autocast(self.device.type, enabled=False))  # int8: fp32 around the int8 products
        bar = tqdm(total=sum(1 for x in ids if x), unit="sent", disable=not progress, leave=False)
        for batch in self._batches(ids, decode_batch_tokens(self.device, d.max_tokens)[0]):
            S = max(len(ids[i]) for i in batch)
            src = torch.full((len(batch), S), PAD, dtype=torch.long)
            for b, i in enumerate(batch):
                src[b, :len(ids[i])] = torch.tensor(ids[i])
            src = src.to(self.device)
            model = self.search_model if self.shortlist is None else ShortlistDecoder(
                self.search_model, *self.shortlist.columns(src))
            gone = None if abandoned is None else functools.partial(_gone, abandoned, batch)
            with ctx:
                if beam == 1:
                    hyps = [[h] for h in greedy_search(model, src, d.max_len_a, d.max_len_b, limit, gone)]
                else:
                    hyps = search_beams(model, src, beam, alpha, d.max_len_a, d.max_len_b, nbest, limit, gone)
            if isinstance(model, ShortlistDecoder):
                hyps = model.full_ids(hyps)
            for i, h in zip(batch, hyps):
                results[i] = h
            bar.update(len(batch))
        bar.close()
        return results

    def hypotheses(self, lines: list[str], beam: int | None = None, alpha: float | None = None,
                   nbest: int | None = None) -> list[list[Translation]]:
        """The `nbest` best translations of each line, best first, with their scores (beam search:
        log-probability / lp(|Y|), §6.1; greedy, beam=1: log-probability); empty line, empty list."""
        hyps = self.translate_ids(self.encode_sources(lines), beam, alpha, nbest)
        out = []
        for hs in hyps:
            texts = self.tokenizer.decode([h.tokens for h in hs]) if hs else []
            out.append([Translation(t, h.score, self.tokenizer.id_to_piece(h.tokens), h.tokens)
                        for t, h in zip(texts, hs)])
        return out

    def attention(self, src: str, tgt: str | None = None) -> AttentionData:
        """Every attention map of one sentence (numpy arrays of shape (layers, heads, queries, keys)),
        teacher-forced on `tgt` or on this translator's own translation."""
        return attention_data(self.model, self.tokenizer, src, tgt, self.decode_cfg)

    def translate(self, lines: list[str], beam: int | None = None, alpha: float | None = None,
                  progress: bool = False) -> list[str]:
        """Translate raw sentences; one output line per input line (empty in, empty out)."""
        hyps = self.translate_ids(self.encode_sources(lines), beam, alpha, 1, progress)
        return self.tokenizer.decode([h[0].tokens if h else [] for h in hyps])

    def compile_now(self) -> float:
        """With `compiled`, compile the encoder and the decoder step now (their graphs: one sentence
        and a batch; the step's first position and the rest; on a GPU one graph each, the rest of the
        positions only: fused.compiled_step) so no request waits for it; returns the seconds it took."""
        if not (self.compiled and _casts_itself(self.search_model)):
            return 0.0
        start = time.perf_counter()
        # Lengths that equal no other size of the step (beam, h, batch): PyTorch gives equal sizes
        # one symbol, and a real sentence of another length would then compile again.
        ids = [[4 + i % 5 for i in range(n)] + [EOS] for n in (16, 12, 10)]
        self.translate_ids(ids[:1], beam=self.decode_cfg.beam)
        self.translate_ids(ids, beam=self.decode_cfg.beam)
        seconds = time.perf_counter() - start
        log.info("encoder and decoder step compiled in %.1f s (torch.compile; inductor caches it on disk)", seconds)
        return seconds


def _checked_head(chosen, cfg, path: Path) -> tuple[int, int | None]:
    """A checkpoint's `alignment` metadata as (layer, head or None), checked against the model."""
    layer, head = (chosen.get("layer"), chosen.get("head")) if isinstance(chosen, dict) else (None, None)
    if not (isinstance(layer, int) and 0 <= layer < cfg.n_dec and (head is None or isinstance(head, int) and
                                                                     0 <= head < cfg.h)):
        raise CheckpointError(f"{path}: metadata 'alignment' names no head of this model ({chosen!r})")
    return layer, head


def _gone(abandoned: Callable[[], set[int]], batch: list[int], active: torch.Tensor) -> torch.Tensor:
    """Which of a batch's active sentences (positions in `batch`) are among the abandoned ids."""
    out = abandoned()
    return torch.tensor([batch[i] in out for i in active.tolist()], dtype=torch.bool, device=active.device)


# -- attention maps (Figures 3-5): one extraction for plots, the server and the analysis ----------
@dataclass
class AttentionData:
    """Every attention map for one sentence pair, numpy (layers, heads, query, key)."""

    src_tokens: list[str]  # source pieces + </s>
    tgt_in_tokens: list[str]  # <s> + target pieces (decoder inputs, self-attention keys)
    tgt_out_tokens: list[str]  # target pieces + </s> (what each decoder position predicts)
    encoder_self: np.ndarray  # (N, h, S, S)
    decoder_self: np.ndarray  # (N, h, T, T)
    cross: np.ndarray  # (N, h, T, S)
    translation: str


def attention_data(model: torch.nn.Module, tokenizer: Tokenizer, src: str, tgt: str | None = None,
                   decode: DecodeConfig | None = None, search: Translator | None = None) -> AttentionData:
    """Attention weights through the explicit path, returned as values (§3.2). With `tgt` the
    decoder is teacher-forced on it; otherwise on the model's own beam-search translation, found
    by `search` where given (a server's translator, rather than a new one per call)."""
    model.eval()
    limit = model.cfg.max_positions - 1
    src_ids = tokenizer.encode([src.strip()])[0][:limit] + [EOS]
    if tgt is None:
        search = search or Translator(model, tokenizer, decode, precision="fp32")
        hyps = search.translate_ids([src_ids], beam=(decode or search.decode_cfg).beam, nbest=1)[0]
        tgt_ids = hyps[0].tokens if hyps else []
    else:
        tgt_ids = tokenizer.encode_target([tgt.strip()])[0][:limit - 1]
    device = next(model.parameters()).device
    with torch.no_grad():
        _, maps = model.attention_maps(torch.tensor([src_ids], device=device),
                                       torch.tensor([[BOS] + tgt_ids], device=device))

    def stack(ws: list[torch.Tensor]) -> np.ndarray:  # the recurrent model has no self-attention
        return torch.stack([w[0].float() for w in ws]).cpu().numpy() if ws else np.zeros((0, 1, 0, 0))

    return AttentionData(
        src_tokens=tokenizer.id_to_piece(src_ids),
        tgt_in_tokens=tokenizer.id_to_piece([BOS] + tgt_ids),
        tgt_out_tokens=tokenizer.id_to_piece(tgt_ids + [EOS]),
        encoder_self=stack(maps.encoder_self), decoder_self=stack(maps.decoder_self), cross=stack(maps.cross),
        translation=tokenizer.decode([tgt_ids])[0],
    )
