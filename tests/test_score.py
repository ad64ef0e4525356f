"""The paper's tokenized BLEU (§6.1, t2t get_ende_bleu) beside sacreBLEU."""

import math
from collections import Counter

import pytest

from aiayn.cli import main
from aiayn.score import paper_bleu, paper_tokenize


def multi_bleu(hyps: list[str], refs: list[str]) -> float:
    """multi-bleu.perl written out: clipped n-gram matches over the corpus, geometric mean of
    the 4 precisions, brevity penalty exp(1 - r/c) when c < r; 0 when any precision is 0."""
    match, total, c, r = [0] * 4, [0] * 4, 0, 0
    for h, ref in zip(hyps, refs):
        hw, rw = h.split(), ref.split()
        c, r = c + len(hw), r + len(rw)
        for n in range(1, 5):
            hn = Counter(tuple(hw[i:i + n]) for i in range(len(hw) - n + 1))
            rn = Counter(tuple(rw[i:i + n]) for i in range(len(rw) - n + 1))
            match[n - 1] += sum(min(k, rn[g]) for g, k in hn.items())
            total[n - 1] += max(len(hw) - n + 1, 0)
    if min(match) == 0:
        return 0.0
    bp = 1.0 if c >= r else math.exp(1 - r / c)
    return 100 * bp * math.exp(sum(math.log(m / t) for m, t in zip(match, total)) / 4)


def test_moses_tokenization_and_compound_splitting_as_get_ende_bleu():
    assert paper_tokenize("Das ist ein rich-text Format.") == "Das ist ein rich ##AT##-##AT## text Format ."
    # perl's s///g does not rescan a consumed character: "a-b-c" splits once
    assert paper_tokenize("a-b-c") == "a ##AT##-##AT## b-c"
    assert paper_tokenize('Er sagte "Nein" & ging.') == "Er sagte &quot; Nein &quot; &amp; ging ."
    assert paper_tokenize("- Nein -") == "- Nein -"  # a dash between spaces is no compound


def test_paper_bleu_equals_multi_bleu_on_tokenized_text():
    hyps = ["Der Hund läuft über die grüne Wiese.", "Eine Frau liest ein Buch im Park.",
            "Zwei Männer spielen Fußball auf dem Rasen-Platz.", "Das Kind isst."]
    refs = ["Der Hund rennt über die grüne Wiese.", "Eine Frau liest im Park ein Buch.",
            "Zwei Männer spielen auf dem Rasen-Platz Fußball.", "Das kleine Kind isst einen Apfel."]
    want = multi_bleu([paper_tokenize(h) for h in hyps], [paper_tokenize(r) for r in refs])
    got = paper_bleu(hyps, refs).score
    assert want > 10 and got == pytest.approx(want, abs=1e-9)
    # case-sensitive, and compound splitting counts: both change the score
    assert paper_bleu([h.lower() for h in hyps], refs).score < got


def test_score_cli_prints_both_and_labels_the_paper_number(tmp_path, capsys):
    (tmp_path / "h").write_text("Der Hund läuft über die Wiese.\nEin rot-weißes Haus.\n")
    (tmp_path / "r").write_text("Der Hund rennt über die Wiese.\nEin rot-weißes Haus steht da.\n")
    assert main(["score", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"), "--paper"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("BLEU = ") and out[1].startswith("chrF2 = ")
    assert out[2].startswith("paper BLEU (tokenized") and "NOT comparable to sacreBLEU" in out[2]
    value = float(out[2].split("= ")[1].split()[0])
    assert value == pytest.approx(paper_bleu(["Der Hund läuft über die Wiese.", "Ein rot-weißes Haus."],
                                             ["Der Hund rennt über die Wiese.", "Ein rot-weißes Haus steht da."]
                                             ).score, abs=0.005)
