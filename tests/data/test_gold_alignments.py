"""The hand-made gold alignments (bench/data/) and the AER they are scored with."""

import gzip
from pathlib import Path

import pytest

from aiayn.score import aer, pharaoh, read_pharaoh

ROOT = Path(__file__).resolve().parents[2]
GOLD = ROOT / "bench" / "data" / "gold_test2016_en-de.align"
CORPUS = ROOT.parent / "shared" / "data" / "multi30k"


def test_aer_with_sure_and_possible_links_by_hand():
    sure, possible = [{(0, 0), (1, 1)}], [{(2, 1)}]
    assert aer([{(0, 0), (1, 1), (2, 1)}], sure, possible) == 0.0  # every sure link, one possible: perfect
    assert aer([{(0, 0), (2, 2)}], sure, possible) == 0.5  # 1 - (1 + 1) / (2 + 2)
    assert aer([{(2, 1)}], sure, possible) == pytest.approx(1 - 1 / 3)  # only a possible link: 1 - (0 + 1) / (1 + 2)
    assert aer([set()], sure, possible) == 1.0


def test_pharaoh_round_trip():
    line = "0-0 1-2 3-1"
    assert pharaoh(read_pharaoh(line)[0]) == line and read_pharaoh("0-0 2?1") == ({(0, 0)}, {(2, 1)})
    with pytest.raises(ValueError):
        read_pharaoh("0-x")


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/data/multi30k is not beside the repository")
def test_gold_links_name_words_of_the_first_100_test2016_pairs():
    lines = GOLD.read_text().splitlines()
    with gzip.open(CORPUS / "test_2016_flickr.en.gz", "rt") as f_en, gzip.open(CORPUS / "test_2016_flickr.de.gz",
                                                                                "rt") as f_de:
        en, de = f_en.read().splitlines()[:100], f_de.read().splitlines()[:100]
    assert len(lines) == 100
    n_sure = 0
    for line, e, d in zip(lines, en, de):
        sure, possible = read_pharaoh(line)
        assert sure and not sure & possible
        assert all(i < len(e.split()) and j < len(d.split()) for i, j in sure | possible), (line, e, d)
        n_sure += len(sure)
    assert n_sure == 1087  # as bench/data/README.md says
