"""A joint SentencePiece BPE vocabulary shared by source and target (§5.1, §3.4)."""

from __future__ import annotations

import io
from collections.abc import Iterable

import sentencepiece as spm

from ..errors import AiaynError

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # fixed ids, the same in every vocabulary


class TokenizerError(AiaynError):
    pass


class Tokenizer:
    """§5.1: one BPE vocabulary for both languages, so one embedding matrix can serve both (§3.4)."""

    def __init__(self, model_proto: bytes):
        self.proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD, UNK, BOS, EOS):
            raise TokenizerError("SentencePiece model must use ids pad=0, unk=1, bos=2, eos=3")

    @classmethod
    def train(cls, sentences: Iterable[str], vocab_size: int, seed: int = 1, symbols: tuple[str, ...] = ()
              ) -> Tokenizer:
        """Learn a joint BPE model on source+target training text; `symbols` are always one piece
        (the labelled brackets of linearized trees, §6.3)."""
        buf = io.BytesIO()
        extra = {"user_defined_symbols": list(symbols)} if symbols else {}
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
        with open(path, "rb") as f:
            return cls(f.read())

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts)

    def pieces(self, text: str) -> list[str]:
        return self.sp.encode(text, out_type=str)

    def id_to_piece(self, ids: list[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids]

    def pieces_list(self) -> list[str]:
        """Every piece of the vocabulary, by id."""
        return self.id_to_piece(list(range(len(self))))

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.sp.decode([[i for i in seq if i not in (PAD, BOS, EOS)] for seq in ids])
