"""A joint SentencePiece BPE vocabulary shared by source and target (§5.1, §3.4); and a pretrained
Marian model's: one list of pieces with a SentencePiece model for each side (`SplitTokenizer`)."""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterable

import sentencepiece as spm

from ..errors import AiaynError
from ..files import read_bytes

MAX_VOCABULARY_BYTES = 1 << 26  # a 37,000-piece SentencePiece model is ~1 MB: a stray huge file is never read

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # fixed ids, the same in every vocabulary
_TAG = re.compile(r"<2([A-Za-z0-9_-]{1,16})>")  # a target-language tag (Johnson et al. 2017), `language_tag`


def word_starts(pieces: list[str]) -> list[int]:
    """The word (whitespace-separated, as SentencePiece marks it with ▁) each subword belongs to."""
    out, word = [], -1
    for i, p in enumerate(pieces):
        if p.startswith("\u2581") or i == 0:
            word += 1
        out.append(word)
    return out


def is_language_tag(piece: str) -> bool:
    """A target-language tag of a multilingual vocabulary: aiayn's `<2de>` or Marian's `>>fra<<`."""
    return bool(_TAG.fullmatch(piece)) or (piece.startswith(">>") and piece.endswith("<<") and len(piece) > 4)


class TokenizerError(AiaynError):
    pass


class Tokenizer:
    """§5.1: one BPE vocabulary for both languages, so one embedding matrix can serve both (§3.4)."""

    def __init__(self, model_proto: bytes):
        self.proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD, UNK, BOS, EOS):
            raise TokenizerError("SentencePiece model must use ids pad=0, unk=1, bos=2, eos=3")
        self._codes = {p[2:-1]: i for i in range(len(self)) if self.sp.is_control(i)
                       and _TAG.fullmatch(p := self.sp.id_to_piece(i))}  # language code -> its tag's id
        # the control pieces a source may start with (language tags, `<BT>`): never a source word
        self.markers = frozenset(i for i in range(len(self)) if self.sp.is_control(i) and i not in (PAD, BOS, EOS))

    @classmethod
    def train(cls, sentences: Iterable[str], vocab_size: int, seed: int = 1, symbols: tuple[str, ...] = (),
              languages: tuple[str, ...] = (), markers: tuple[str, ...] = ()) -> Tokenizer:
        """Learn a joint BPE model on source+target training text; `symbols` are always one piece
        (the labelled brackets of linearized trees, §6.3); `languages`: a target-language tag `<2xx>`
        for each (Johnson et al. 2017), a control piece that text never produces (only `encode`'s
        leading tag does); `markers`: more control pieces (`<BT>`, data/mixing.py)."""
        buf = io.BytesIO()
        extra: dict = {"user_defined_symbols": list(symbols)} if symbols else {}
        controls = [language_tag(x) for x in languages] + list(markers)
        extra.update({"control_symbols": controls} if controls else {})
        try:
            spm.SentencePieceTrainer.train(**extra,
                sentence_iterator=iter(sentences), model_writer=buf, model_type="bpe",
                vocab_size=vocab_size, character_coverage=1.0, pad_id=PAD, unk_id=UNK, bos_id=BOS,
                eos_id=EOS, normalization_rule_name="identity", input_sentence_size=2_000_000,
                shuffle_input_sentence=True, num_threads=2, minloglevel=2,
                hard_vocab_limit=False,
            )
        except RuntimeError as e:
            raise TokenizerError(f"SentencePiece training failed (vocab_size={vocab_size}): {e}") from None
        return cls(buf.getvalue())

    @classmethod
    def load(cls, path: str) -> Tokenizer:
        return cls(read_bytes(path, MAX_VOCABULARY_BYTES))

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    @property
    def language_codes(self) -> list[str]:
        """The target languages of a multilingual vocabulary (its `<2xx>` control pieces), in id order."""
        return list(self._codes)

    def tag(self, code: str) -> str:
        """The text that asks for target language `code` in front of a source line."""
        return language_tag(code)

    def tag_id(self, code: str) -> int:
        """The id of target language `code`'s tag."""
        return self._codes[code]

    def control_id(self, piece: str) -> int | None:
        """The id of control piece `piece` (`<BT>`) in this vocabulary, None where it has none."""
        i = self.sp.piece_to_id(piece)
        return i if i in self.markers and self.sp.id_to_piece(i) == piece else None

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        """Source ids; a leading `<2xx>` of this vocabulary's languages is cut off and is its own id."""
        if not self.language_codes:
            return self.sp.encode(texts, num_threads=threads)
        tags = [_leading_tag(t, self._codes) for t in texts]
        ids = self.sp.encode([t[len(tag):].lstrip() for t, tag in zip(texts, tags)], num_threads=threads)
        return [([self._codes[tag[2:-1]]] if tag else []) + x for tag, x in zip(tags, ids)]

    def encode_target(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        """Target-side text (the same joint model here)."""
        return self.sp.encode(texts, num_threads=threads)

    def pieces(self, text: str) -> list[str]:
        return self.sp.encode(text, out_type=str)

    def id_to_piece(self, ids: list[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids]

    def pieces_list(self) -> list[str]:
        """Every piece of the vocabulary, by id."""
        return self.id_to_piece(list(range(len(self))))

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.sp.decode([[i for i in seq if i not in (PAD, BOS, EOS)] for seq in ids])


def language_tag(code: str) -> str:
    """Johnson et al. (2017)'s target-language tag: `<2de>` asks for German."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,16}", code):
        raise TokenizerError(f"a language code is 1-16 letters, digits, '_' or '-'; got {code!r}")
    return f"<2{code}>"


def _leading_tag(text: str, codes: dict[str, int]) -> str:
    """`<2de>` at the start of a line when `de` is one of `codes`, else ""."""
    m = _TAG.match(text)
    return m.group(0) if m and m.group(1) in codes else ""


SPLIT_FORMAT = "aiayn-split-vocabulary-1"
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")


class SplitTokenizer:
    """A pretrained Marian model's vocabulary (aiayn import hf, §3.4's shared matrix kept): the
    pieces of its vocab.json, segmented by source.spm on the source side and target.spm on the
    target side, as MarianTokenizer does (a piece outside the vocabulary is UNK). Rows 0-3 are
    aiayn's PAD, UNK, BOS, EOS; `marian_ids[i]` is row i's id in the Marian model (BOS: its
    decoder start). `proto`: the whole of it as bytes, stored where a SentencePiece model would be."""

    def __init__(self, source: bytes, target: bytes, pieces: list[str], marian_ids: list[int]):
        if len(pieces) != len(marian_ids) or len(pieces) <= len(SPECIALS):
            raise TokenizerError("a split vocabulary needs one Marian id per piece and more than the 4 special ids")
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=source)
            self.target_sp = spm.SentencePieceProcessor(model_proto=target)
        except RuntimeError as e:
            raise TokenizerError(f"not a SentencePiece model: {e}") from None
        self.source_proto, self.target_proto = source, target
        self._pieces, self.marian_ids = list(pieces), list(marian_ids)
        self._ids = {p: i for i, p in reversed(list(enumerate(self._pieces)))}  # first row wins (<pad>: PAD)
        self.markers = frozenset(i for i, p in enumerate(self._pieces) if p.startswith(">>") and p.endswith("<<")
                                 and len(p) > 4)  # language codes: never a source word
        self.proto = json.dumps({"format": SPLIT_FORMAT, "source_spm": base64.b64encode(source).decode(),
                                 "target_spm": base64.b64encode(target).decode(), "pieces": self._pieces,
                                 "marian_ids": self.marian_ids}, ensure_ascii=False).encode()

    def __len__(self) -> int:
        return len(self._pieces)

    def _ids_of(self, sp: spm.SentencePieceProcessor, texts: list[str], threads: int) -> list[list[int]]:
        return [[self._ids.get(p, UNK) for p in x] for x in sp.encode(texts, out_type=str, num_threads=threads)]

    @property
    def language_codes(self) -> list[str]:
        """The target-language codes of a multilingual Marian model (`>>fra<<` pieces: OPUS-MT's
        en-ROMANCE, en-mul ...), without the brackets, in vocabulary order."""
        return [p[2:-2] for p in self._pieces if p.startswith(">>") and p.endswith("<<") and len(p) > 4]

    def tag(self, code: str) -> str:
        """The text that asks for target language `code` in front of a source line (as MarianTokenizer)."""
        return f">>{code}<<"

    def control_id(self, piece: str) -> int | None:
        """None: a Marian vocabulary has no control pieces of aiayn's (`<BT>`)."""
        return None

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        """Source ids, as MarianTokenizer makes them: a leading `>>xx<<` is cut off before
        SentencePiece and is one piece of its own (UNK if the vocabulary lacks it)."""
        codes = [_leading_code(t) for t in texts]
        ids = self._ids_of(self.sp, [t[len(c):] for t, c in zip(texts, codes)], threads)
        return [([self._ids.get(c, UNK)] if c else []) + x for c, x in zip(codes, ids)]

    def encode_target(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        return self._ids_of(self.target_sp, texts, threads)

    def pieces(self, text: str) -> list[str]:
        return self.sp.encode(text, out_type=str)

    def id_to_piece(self, ids: list[int]) -> list[str]:
        return [self._pieces[i] for i in ids]

    def pieces_list(self) -> list[str]:
        return list(self._pieces)

    def decode(self, ids: list[list[int]]) -> list[str]:
        """As MarianTokenizer.decode(skip_special_tokens=True): specials (UNK too) left out, the target
        model's detokenization, then any "▁" left (pieces it does not know) as a space."""
        return [self.target_sp.decode_pieces([self._pieces[i] for i in seq if i not in (PAD, UNK, BOS, EOS)])
                .replace("\u2581", " ").strip() for seq in ids]


def _leading_code(text: str) -> str:
    """`>>fra<<` at the start of a line (MarianTokenizer.remove_language_code's rule), else ""."""
    end = text.find("<<") if text.startswith(">>") else -1
    return text[:end + 2] if end != -1 else ""


def read_tokenizer(data: bytes) -> Tokenizer | SplitTokenizer:
    """The vocabulary stored in a checkpoint or a prepared folder's spm.model: a SentencePiece
    model, or a SplitTokenizer's bytes; a TokenizerError names what is wrong."""
    if not data.startswith(b'{"format": "' + SPLIT_FORMAT.encode()):
        return Tokenizer(data)
    try:
        d = json.loads(data)
        pieces, ids = d["pieces"], d["marian_ids"]
        if not (isinstance(pieces, list) and all(isinstance(p, str) for p in pieces)
                and isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            raise ValueError("pieces must be strings and marian_ids integers")
        source, target = (base64.b64decode(d[k], validate=True) for k in ("source_spm", "target_spm"))
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise TokenizerError(f"damaged split vocabulary ({str(e)[:120]})") from None
    return SplitTokenizer(source, target, pieces, ids)


def load_tokenizer(path: str) -> Tokenizer | SplitTokenizer:
    return read_tokenizer(read_bytes(path, MAX_VOCABULARY_BYTES))  # bounded: a FIFO or a stray huge file refused
