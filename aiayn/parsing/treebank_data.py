"""§6.3's data: a treebank's splits as words -> linearized trees, prepared like a corpus (§5.1),
and, for a model.tag_input parser (ours), the part-of-speech tags beside every source subword."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from ..config import Config
from ..data.prepare import PREPARED, Task, check_prepared_output, prepare
from ..data.text import read_lines
from ..data.tokenizer import Tokenizer
from ..files import add_to_marker, read_bounded
from .tagger import Tagger, jackknife, tagger_text, write_tag_arrays
from .trees import TreeError, is_bracket, read_trees, write_splits

log = logging.getLogger("aiayn")
GOLD_MAX_BYTES = 1 << 30  # a prepared folder's train.gold.mrg: the whole WSJ training split is ~40 MB


def prepare_treebank(treebank: Path, out: Path, cfg: Config, linearization: str = "words", subtrees: int = 0,
                     tags: bool = False, strict: bool = False) -> dict:
    """The treebank's splits prepared into `out` (its manifest returned): brackets kept whole as
    subwords, no deduplication or length-ratio filter (trees outgrow their sentences), the raw
    words and gold trees carried into the folder; with `tags`, a tagger trained on the training
    trees (when the folder is built, not when it is reused) and its tags written beside the ids."""
    if subtrees < 0:
        raise TreeError(f"prepare --subtrees must be 0 (off) or a number of words, got {subtrees}")
    out = check_prepared_output(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    built: list[tuple] = []
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".trees", dir=out.parent) as tmp:
        files = write_splits(Path(treebank), Path(tmp), linearization, subtrees)
        symbols = {"▁" + x for line in files["train"][1].read_text().split("\n") for x in line.split() if is_bracket(x)}
        task = Task({"task": "parse", "linearization": linearization,
                     **({"subtrees": str(subtrees)} if subtrees else {}),
                     **({"tags": "perceptron-jackknife"} if tags else {})},
                    symbols=tuple(symbols), carry=Path(tmp),
                    on_build=(lambda: built.append(_train_tagger(Path(tmp)))) if tags else None)
        manifest = prepare(files, out, "words", "parse", cfg.data.vocab_size, cfg.data.max_len,
                           cfg.data.strict or strict, cfg.train.seed, dedup=False, max_ratio=0.0, task=task)
    if tags and (built or not all((out / f"{s}.src.tag.npy").exists() for s in ("train", "valid"))):
        write_tag_arrays(out, *(built[0] if built else _read_tagging(out)),
                         Tokenizer.load(str(out / "spm.model")).pieces_list())
        add_to_marker(out, PREPARED, [f"{s}.src.tag.npy" for s in ("train", "valid")])
    return manifest


def _train_tagger(folder: Path) -> tuple[Tagger, dict[str, list[str]]]:
    """A part-of-speech tagger from the training trees' gold tags (tagger.py), written to `tagger.json`, and
    the training sentences' jackknifed tags (words -> tags, also in raw/train.tags)."""
    sents = [[(w, t) for t, w in tree.tagged()] for tree in read_trees((folder / "train.gold.mrg").read_text())]
    log.info("training a part-of-speech tagger on %d trees, and %d more for jackknifed training tags", len(sents), 10)
    tagger = Tagger.train(sents)
    tags = jackknife(sents)
    (folder / "tagger.json").write_text(tagger.to_json())
    (folder / "raw" / "train.tags").write_text("".join(" ".join(t) + "\n" for t in tags))
    return tagger, {" ".join(w for w, _ in s): t for s, t in zip(sents, tags)}


def _read_tagging(folder: Path) -> tuple[Tagger, dict[str, list[str]]]:
    """The tagger and jackknifed training tags that _train_tagger wrote into a prepared folder."""
    words = [" ".join(t.words()) for t in read_trees(read_bounded(folder / "train.gold.mrg", GOLD_MAX_BYTES))]
    tags = read_lines(folder / "raw" / "train.tags")
    tagger = Tagger.from_json(tagger_text(folder), str(folder / "tagger.json"))
    return tagger, {w: t.split() for w, t in zip(words, tags)}
