"""§5.1's data: text -> subwords -> token-count batches.

Read first: prepare.py (`aiayn prepare`: a corpus to a prepared folder), then tokenizer.py (the joint
SentencePiece vocabulary), batches.py (batches by target tokens), directions.py (several
directions in one prepared folder, with target-language tags) and mixing.py (weighted training
corpora: back-translated pairs tagged <BT>); passes.py holds the two passes over a split.
"""

from ..doors import lazy

__all__ = [
    "BOS", "BT_TAG", "Batch", "DataError", "EOS", "PAD", "TokenData", "Tokenizer", "TrainingCorpus", "UNK",
    "fetch_multi30k", "load_manifest", "load_tokenizer", "make_batches", "prepare", "prepare_many", "read_lines"
]
__getattr__, __dir__ = lazy(__name__, {
    "prepare": "prepare",
    "prepare_many": "directions",
    "load_manifest": "prepare",
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "BOS": "tokenizer",
    "EOS": "tokenizer",
    "PAD": "tokenizer",
    "UNK": "tokenizer",
    "Batch": "batches",
    "TokenData": "batches",
    "make_batches": "batches",
    "read_lines": "text",
    "DataError": "text",
    "fetch_multi30k": "corpora",
    "BT_TAG": "mixing",
    "TrainingCorpus": "mixing",
})
