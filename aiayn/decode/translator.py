"""Raw text in, translations out: batching by tokens, search, detokenization (§6.1)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from ..checkpoint import Builder, read_extra
from ..config import ConfigError, DecodeConfig
from ..data.tokenizer import EOS, PAD, Tokenizer
from ..device import PRECISIONS, decode_batch_tokens, huge_pages, pick_device, resolve_precision
from ..models.attention import without_dead_heads
from ..models.build import build_model
from ..models.linear import fp32_kernel_words, kernel_cache
from ..models.precision import cast_bf16, quantize_int8
from ..presets import DECODE_LIMITS
from ..progress import bar as progress_bar
from ..score import Links
from .align import checked_head, hypothesis_links
from .constraints import check_constraints, constrained_beam_search, word_starts_mask
from .ensemble import Ensemble, load_models
from .fast import FusedDecoder, StepOptions, fast_decoder, fusable, search_beams, warm_up
from .glossary import Glossary, target_phrases
from .languages import recorded_languages, tag_lines
from .maps import AttentionData, attention_data
from .prefix import PrefixDecoder, check_prefixes
from .sampling import Sampler, Sampling
from .scoring import ForcedScore, force_decoded
from .search import Hypothesis, greedy_search
from .shortlist import Shortlist, ShortlistDecoder, ShortlistError, vocabulary_id
from .tuned_precision import tuned_precision

log = logging.getLogger("aiayn")


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
                 compiled: bool = False, options: StepOptions | None = None, quiet: bool = False):
        """`device` moves the model there; None (the default) uses it where it is, so a model shared
        with other users (the server's, the trainer's) is never moved behind their back.
        `precision`: auto (bf16 where the processor has it natively, else fp32), fp32, bf16 or
        int8 (CPU). bf16 and int8 decode with a converted copy made here (bf16 weights; int8
        weights), so later changes to the model's weights reach them only when `model` is set
        again; the given model is left as it is. The decoder step is `decode.step`'s: auto takes
        the fused step (decode/fast: identical logits, less overhead per step), or its compiled
        form with `compiled` (torch.compile; the first translations of each batch shape compile
        it; logits agree with eager to rounding), or the modules with `fused` False; modules,
        fused, compiled and graphed (one CUDA graph a step) name one. `options` (decode/fast's
        StepOptions): the fused step's settings in full, over decode.step's (for measurements).
        `quiet`: what runs is logged at DEBUG, not INFO (the trainer's validation builds one each time)."""
        kernel_cache(1024)  # decoding reuses its shapes: a larger oneDNN cache pays (linear.py)
        huge_pages()
        self.decode_cfg = decode = decode or DecodeConfig()
        step = decode.step if decode.step != "auto" else "compiled" if compiled else "fused" if fused else "modules"
        if options is not None:
            step = "compiled" if options.compiled else "graphed" if options.graphs else "fused"
        self.step, self.step_options = step, options
        self.fused, self.compiled = step != "modules", step == "compiled"
        here = next(model.parameters()).device
        self.device = here if device is None else torch.device(device)
        self.precision, why = resolve_precision(precision, self.device)
        info = log.debug if quiet else log.info
        (log.warning if why.startswith("int8 refused") else info)("decoding in %s (%s)", self.precision, why)
        self.model = model.eval() if self.device == here else model.eval().to(self.device)
        self.tokenizer = tokenizer
        info("decoder step: %s (decode.step %s)%s", step, decode.step, fp32_kernel_words(self.device, self.precision))
        info("translation batches of %d source tokens (%s)", *decode_batch_tokens(self.device, decode.max_tokens))
        self.data_max_len = 0  # subwords per side in training (data.max_len), when loaded from a checkpoint
        self.alignment_head: tuple[int, int | None] | None = None  # `aiayn align`'s choice, when loaded
        self.shortlist: Shortlist | None = None  # see use_shortlist
        self.languages: tuple[str, str] | None = None  # (source, target) codes, when the checkpoint names them
        self.tgt_lang: str | None = None  # the target language sources are tagged for when a call names none
        self.directions: list[str] = []  # a multilingual model's trained directions ("en-de"), when it names them
        self.tuned_by_language: dict[str, tuple[int, float]] = {}  # `aiayn tune`'s (beam, α) per target language
        self.glossary: Glossary | None = None  # terms every call holds to unless it gives its own (decode/glossary.py)

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
        if self.fused and fuse:  # the same numbers, fewer calls
            return fast_decoder(slim, self.precision, self.step, self.step_options, check=False)
        return {"int8": quantize_int8, "bf16": cast_bf16}.get(self.precision, lambda m: m)(slim)

    @classmethod
    def load(cls, path: str | Path | Sequence[str | Path], device: str | torch.device | None = None,
             precision: str = "auto", compiled: bool = False, shortlist: Shortlist | str | Path | None = None,
             build: Builder = build_model, **decode_overrides) -> Translator:
        """Load a checkpoint, or several of one vocabulary as an ensemble.Ensemble (decoding settings
        from the first); decode_overrides are DecodeConfig fields (beam, alpha, max_len_a, max_len_b,
        nbest, max_tokens). device None: CUDA when available, else the CPU.
        shortlist: a file of `aiayn shortlist` (see use_shortlist). build: checkpoint.load_checkpoint's."""
        names = [f.name for f in fields(DecodeConfig)]
        unknown = [k for k in decode_overrides if k not in names]
        if unknown:
            raise TypeError(f"Translator.load() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                            f"decoding settings are: {', '.join(names)}")
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
        first = Path(path if isinstance(path, (str, Path)) else list(path)[0])
        extra = read_extra(first) if first.is_file() else {}  # auto: tune's choice for this processor class
        precision = tuned_precision(precision, extra, dev)
        translator = cls(model, tokenizer, cfg.decode, dev, precision, compiled=compiled)
        translator.data_max_len = cfg.data.max_len  # the training length: a server's default sentence limit
        translator.use_shortlist(shortlist)
        chosen = extra.get("alignment")
        translator.languages, translator.directions, translator.tuned_by_language = recorded_languages(extra)
        translator.alignment_head = None if chosen is None else checked_head(chosen, model.cfg, first)
        return translator

    def terms(self, lines: list[str], glossary: Glossary | None = None, constraints: list[list[str]] | None = None
              ) -> list[list[list[int]]] | None:
        """The target phrases each line's output must hold (glossary.target_phrases; `glossary` None:
        the translator's), or None where there are none to hold."""
        glossary = glossary or self.glossary
        return None if glossary is None and constraints is None else target_phrases(self.tokenizer, lines,
                                                                                     glossary, constraints)

    @functools.cached_property
    def word_starts(self) -> torch.Tensor:
        """(V,) which target tokens may follow a dictated term (constraints.word_starts_mask)."""
        return word_starts_mask(self.tokenizer.pieces_list(), self.device)

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
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            return hypothesis_links(self.model, self.tokenizer, ids, hyps, self._head())

    def score(self, sources: list[str], targets: list[str], tgt_lang: str | None = None,
              alpha: float | None = None) -> list[ForcedScore]:
        """Each translation's log-probability, force-decoded (decode/scoring.py): total, per subword and
        over lp(|Y|) at `alpha` (default decode.alpha) as beam search ranks; sources tagged as `translate` does."""
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} translations")
        if isinstance(self.model, Ensemble):
            raise ConfigError("scores come from one model; score with one checkpoint")
        src = self.encode_sources(sources, tgt_lang=tgt_lang)  # a target too long: a ValueError naming its line
        tgt = self.tokenizer.encode_target([t.strip() for t in targets])
        limit = self.model.cfg.max_positions - 1
        for n, y in enumerate(tgt, 1):
            if len(y) > limit:
                raise ValueError(f"translation {n} has {len(y)} subwords; the model reads at most {limit}")
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            return force_decoded(self.model, src, tgt, self.decode_cfg.alpha if alpha is None else alpha)

    def target_languages(self) -> list[str]:
        """The languages this model translates into: a multilingual Marian model's `>>xx<<` codes,
        else the target the checkpoint records (none: unknown)."""
        codes = getattr(self.tokenizer, "language_codes", [])
        return codes or ([self.languages[1]] if self.languages else [])

    def tagged(self, lines: list[str], tgt_lang: str | None) -> list[str]:
        """The lines as the model reads them for target language `tgt_lang` (decode/languages.py)."""
        return tag_lines(self.tokenizer, lines, tgt_lang, self.target_languages())

    def encode_sources(self, lines: list[str], first_line: int = 1, tgt_lang: str | None = None) -> list[list[int]]:
        """Subword ids + EOS, tagged for `tgt_lang` (see `tagged`); sources longer than the model
        allows are truncated with a warning (naming the input's line number: `first_line` is lines[0]'s)."""
        limit = self.model.cfg.max_positions - 1
        tagged = self.tagged(lines, tgt_lang if tgt_lang is not None else self.tgt_lang)
        ids = self.tokenizer.encode([line.strip() for line in tagged])
        out = []
        for n, x in enumerate(ids, first_line):
            if len(x) > limit:
                log.warning("input line %d has %d subwords; truncated to the model's maximum %d", n, len(x), limit)
                x = x[:limit]
            out.append(x + [EOS] if x else [])
        return out

    def _batches(self, ids: list[list[int]], max_tokens: int, apart: list[bool] | None = None
                 ) -> Iterable[list[int]]:
        """Sources by length in batches of at most max_tokens (padded); those `apart` marks never
        share a batch with those it does not."""
        side = apart or [False] * len(ids)
        order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: (side[i], len(ids[i])))
        batch: list[int] = []
        for i in order:
            if batch and ((len(batch) + 1) * len(ids[i]) > max_tokens or side[i] != side[batch[0]]):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    @torch.no_grad()
    def translate_ids(self, ids: list[list[int]], beam: int | None = None, alpha: float | None = None,
                      nbest: int | None = None, progress: bool = False,
                      abandoned: Callable[[], set[int]] | None = None, alignments: bool = False,
                      prefixes: list[list[int]] | None = None, constraints: list[list[list[int]]] | None = None
                      ) -> list[list[Hypothesis]]:
        """Search for every source (ids with EOS); empty sources give no hypotheses. `abandoned`:
        the indices of `ids` nobody waits for any more (asked every few steps; they stop there).
        `alignments`: the fused step also keeps where the alignment head attended (for `align`).
        `prefixes`: target ids each output starts with (decode/prefix.py; not with a shortlist).
        `constraints`: target phrases (ids) each output must hold (decode/constraints.py: beam search
        over the step in use, never batched with unconstrained sentences, which search as without)."""
        d = self.decode_cfg
        beam = d.beam if beam is None else beam
        alpha, nbest = d.alpha if alpha is None else alpha, d.nbest if nbest is None else nbest
        if not 1 <= beam <= len(self.tokenizer):
            raise ValueError(f"beam must be in [1, vocabulary size {len(self.tokenizer)}], got {beam}")
        if not 0 <= alpha <= DECODE_LIMITS["alpha"]:  # NaN fails too
            raise ValueError(f"alpha must be in [0, {DECODE_LIMITS['alpha']}], got {alpha}")
        if not 1 <= nbest <= beam:
            raise ValueError(f"nbest must be in [1, beam={beam}], got {nbest}")
        if prefixes is not None:
            check_prefixes(prefixes, ids, d.max_len_a, d.max_len_b, self.shortlist is not None)
        if constraints is not None:
            check_constraints(constraints, ids, d.max_len_a, d.max_len_b, prefixes, self.shortlist is not None,
                              d.sample)
            log.debug("constrained beam search (decode/constraints.py) over the %s step: %d of %d sentences",
                      "fused eager" if self.step == "graphed" else self.step, sum(map(bool, constraints)), len(ids))
        results: list[list[Hypothesis]] = [[] for _ in ids]
        if isinstance(self.search_model, FusedDecoder):
            self.search_model.align_head = self._head() if alignments else None
        autocast = self.precision == "bf16" and not _casts_itself(self.search_model)
        ctx = (torch.autocast(self.device.type, dtype=torch.bfloat16) if autocast
               else torch.autocast(self.device.type, enabled=False))  # int8: fp32 around the int8 products
        bar = progress_bar(sum(1 for x in ids if x), "sentence", "translating", progress)
        apart = None if constraints is None else [bool(c) for c in constraints]
        for batch in self._batches(ids, decode_batch_tokens(self.device, d.max_tokens)[0], apart):
            S = max(len(ids[i]) for i in batch)
            src = torch.full((len(batch), S), PAD, dtype=torch.long)
            for b, i in enumerate(batch):
                src[b, :len(ids[i])] = torch.tensor(ids[i])
            src = src.to(self.device)
            model = self.search_model if self.shortlist is None else ShortlistDecoder(
                self.search_model, *self.shortlist.columns(src))
            if prefixes is not None:  # decode/prefix.py: each output starts with its sentence's prefix
                model = PrefixDecoder(model, [prefixes[i] for i in batch])
            gone = None if abandoned is None else functools.partial(_gone, abandoned, batch)
            cons = [constraints[i] for i in batch] if apart and apart[batch[0]] else None
            with ctx:
                hyps = self._search(model, src, beam, alpha, nbest, gone, cons)
            if isinstance(model, ShortlistDecoder):
                hyps = model.full_ids(hyps)
            for i, h in zip(batch, hyps):
                results[i] = h
            bar.update(len(batch))
        bar.close()
        return results

    def _search(self, model, src: torch.Tensor, beam: int, alpha: float, nbest: int, gone, cons
                ) -> list[list[Hypothesis]]:
        """One batch's search: constrained (decode/constraints.py), sampled, greedy or §6.1's beam search."""
        d, limit = self.decode_cfg, self.model.cfg.max_positions - 1
        if cons is not None:  # terms the output must hold, with a wider beam (decode.constraint_beam)
            return constrained_beam_search(model, src, cons, self.word_starts, max(d.constraint_beam or 2 * beam,
                                           nbest), alpha, d.max_len_a, d.max_len_b, nbest, limit, gone)
        if d.sample:  # a draw per token (decode/sampling.py), seeded by each sentence's subwords
            pick = Sampler(Sampling(d.temperature, d.top_k, d.top_p, d.seed), src)
            return [[h] for h in greedy_search(model, src, d.max_len_a, d.max_len_b, limit, gone, pick)]
        if beam == 1:
            return [[h] for h in greedy_search(model, src, d.max_len_a, d.max_len_b, limit, gone)]
        return search_beams(model, src, beam, alpha, d.max_len_a, d.max_len_b, nbest, limit, gone)

    def setting_for(self, beam: int | None, alpha: float | None, tgt_lang: str | None
                    ) -> tuple[int | None, float | None]:
        """Beam and α for lines into `tgt_lang` (or the translator's `tgt_lang`): those given, else
        what `aiayn tune` chose for that language, else None (decode_cfg's)."""
        lang = tgt_lang if tgt_lang is not None else self.tgt_lang
        lang = lang[2:-2] if lang and lang.startswith(">>") and lang.endswith("<<") else lang
        tuned = self.tuned_by_language.get(lang) if lang else None
        if tuned is None:
            return beam, alpha
        return (tuned[0] if beam is None else beam), (tuned[1] if alpha is None else alpha)

    def hypotheses(self, lines: list[str], beam: int | None = None, alpha: float | None = None,
                   nbest: int | None = None, tgt_lang: str | None = None) -> list[list[Translation]]:
        """The `nbest` best translations of each line, best first, with their scores (beam search:
        log-probability / lp(|Y|), §6.1; greedy, beam=1: log-probability); empty line, empty list."""
        beam, alpha = self.setting_for(beam, alpha, tgt_lang)
        hyps = self.translate_ids(self.encode_sources(lines, tgt_lang=tgt_lang), beam, alpha, nbest,
                                  constraints=self.terms(lines))
        out = []
        for hs in hyps:
            texts = self.tokenizer.decode([h.tokens for h in hs]) if hs else []
            out.append([Translation(t, h.score, self.tokenizer.id_to_piece(h.tokens), h.tokens)
                        for t, h in zip(texts, hs)])
        return out

    def attention(self, src: str, tgt: str | None = None) -> AttentionData:
        """Every attention map of one sentence (numpy arrays of shape (layers, heads, queries, keys)),
        teacher-forced on `tgt` or on this translator's own translation."""
        search = None if tgt is not None else Translator(self.model, self.tokenizer, self.decode_cfg, precision="fp32")
        return attention_data(self.model, self.tokenizer, src, tgt, self.decode_cfg, search)

    def translate(self, lines: list[str], beam: int | None = None, alpha: float | None = None,
                  progress: bool = False, tgt_lang: str | None = None, prefixes: list[str] | None = None,
                  glossary: Glossary | None = None, constraints: list[list[str]] | None = None) -> list[str]:
        """One output line per input line (empty in, empty out); into `tgt_lang` (see `tagged`), each
        output starting with its line's target `prefixes` text where given (decode/prefix.py), and
        holding the `glossary`'s (default: the translator's) target terms whose source terms the line
        has and the line's own `constraints` (target texts; decode/glossary.py)."""
        beam, alpha = self.setting_for(beam, alpha, tgt_lang)
        forced = None if prefixes is None else self.tokenizer.encode_target([p.strip() for p in prefixes])
        hyps = self.translate_ids(self.encode_sources(lines, tgt_lang=tgt_lang), beam, alpha, 1, progress,
                                  prefixes=forced, constraints=self.terms(lines, glossary, constraints))
        return self.tokenizer.decode([h[0].tokens if h else [] for h in hyps])

    def compile_now(self) -> float:
        """With `compiled`, compile the encoder and the decoder step now (their graphs: one sentence
        and a batch; the step's first position and the rest; on a GPU one graph each, the rest of the
        positions only: fused.compiled_step) so no request waits for it; returns the seconds it took."""
        if not (self.compiled and _casts_itself(self.search_model)):
            return 0.0
        return warm_up(self.translate_ids, self.decode_cfg.beam)


def _gone(abandoned: Callable[[], set[int]], batch: list[int], active: torch.Tensor) -> torch.Tensor:
    """Which of a batch's active sentences (positions in `batch`) are among the abandoned ids."""
    out = abandoned()
    return torch.tensor([batch[i] in out for i in active.tolist()], dtype=torch.bool, device=active.device)
