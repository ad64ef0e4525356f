"""What the paper claims for each Table 3 row (§6.2, §5.4), per metric, and where it says so.

A row is judged on a metric only where the paper claims something: its Table 3 Δ beyond the
margins (plan.NLL_MARGIN nats, plan.BLEU_MARGIN BLEU), or a sentence of its text, in the
direction that sentence gives. Where the Δ is within the margins and the text is silent the row
claims nothing: it is reported, not judged. Our own extensions (no Table 3 row) and observations
(a row that cannot stand for the paper's step) are never counted. Written before the rows were
re-judged at 5,000 updates: the rule sits here, the numbers in the result files.

SIGN_RULE: where a row's Table 3 Δ lies within the margin, a general sentence of the text ("bigger
models are better") makes a claim on a metric only where the table's Δ has the sentence's sign.
"""

from __future__ import annotations

from dataclasses import dataclass

BETTER, WORSE, SAME = "better", "worse", "no change"  # what a claim can say (NLL: lower is better)
SIGN_RULE = ("Where a row's Table 3 Δ lies within the margin, a general sentence of the paper's text makes a claim "
             "on a metric only where the table's Δ there has the sentence's sign (C-N4: N=8's perplexity is lower, "
             "ΔNLL −0.008, so “bigger models are better” claims better NLL; its BLEU is 0.3 lower, so no BLEU claim). "
             "The claims were written after 39 of the 2,750 suite's 43 results and before the 5,000 suite's first.")


@dataclass(frozen=True)
class Claim:
    """The paper's claim for one row: per metric better / worse / no change, or None (not judged)."""

    nll: str | None
    bleu: str | None
    source: str  # the Table 3 row and the sentence the claim rests on (the report prints the row's Δ)
    kind: str = "paper"  # paper | extension (ours, not counted) | observation (not counted)


_HEADS = "§6.2: “quality also drops off with too many heads”"
_KEYS = "§6.2: “reducing the attention key size d_k hurts model quality”"
_BIGGER = "§6.2: “as expected, bigger models are better”"
_DROPOUT = "§6.2: “dropout is very helpful in avoiding over-fitting”"
_SMOOTHING = "§5.4: label smoothing “hurts perplexity … but improves accuracy and BLEU score”"

CLAIMS: dict[str, Claim] = {
    "A-h1": Claim(WORSE, WORSE, "Table 3 (A) h=1; §6.2: “single-head attention is 0.9 BLEU worse "
                  "than the best setting”"),
    "A-h2": Claim(None, None, "Table 3 (A) h=4, within the margins; §6.2 says nothing of it"),
    "A-h8": Claim(None, None, "Table 3 (A) h=16, within the margins; §6.2 says nothing of it"),
    "A-h16": Claim(WORSE, WORSE, f"Table 3 (A) h=32; {_HEADS}"),
    "B-dk16": Claim(WORSE, WORSE, f"Table 3 (B) d_k=16; {_KEYS}"),
    "B-dk32": Claim(WORSE, WORSE, f"Table 3 (B) d_k=32; {_KEYS}"),
    "C-N1": Claim(WORSE, WORSE, f"Table 3 (C) N=2 (a third of the depth); {_BIGGER}"),
    "C-N2": Claim(WORSE, WORSE, f"Table 3 (C) N=4 (two thirds); {_BIGGER}"),
    "C-N4": Claim(BETTER, None, f"Table 3 (C) N=8 (1.33× the depth); {_BIGGER} (NLL); its BLEU "
                  "went the other way, within the margin: no BLEU claim"),
    "C-N6": Claim(None, None, "2× the reference's depth, where the paper's step (N=8 over 6) is 1.33× (C-N4 is "
                  "that step); it did not train at the suite's rate", kind="observation"),
    "C-dmodel128": Claim(WORSE, WORSE, f"Table 3 (C) d_model=256; {_BIGGER}"),
    "C-dmodel512": Claim(BETTER, BETTER, f"Table 3 (C) d_model=1024; {_BIGGER}; its peak rate is 1.25e-3, "
                         "the reference's 1.77e-3 (Eq. 3's d_model^-0.5)"),
    "C-dmodel512-rate": Claim(None, None, "C-dmodel512 at the reference's peak rate (lr_scale ×√2): the same "
                              "claim, reported beside it and not counted twice", kind="observation"),
    "C-dff512": Claim(WORSE, WORSE, f"Table 3 (C) d_ff=1024; {_BIGGER}"),
    "C-dff2048": Claim(BETTER, BETTER, f"Table 3 (C) d_ff=4096; {_BIGGER}"),
    "D-pdrop0.0": Claim(WORSE, WORSE, f"Table 3 (D) P_drop=0.0; {_DROPOUT}"),
    "D-pdrop0.1": Claim(None, None, "Table 3 base (0.1) against (D) 0.2, within the margins; §6.2's "
                        "sentence on dropout weighs dropout against none (D-pdrop0.0)"),
    "D-pdrop0.3": Claim(None, None, "ours: Table 3 has no P_drop 0.3 row", kind="extension"),
    "D-ls0.0": Claim(BETTER, WORSE, f"Table 3 (D) ε_ls=0.0; {_SMOOTHING}"),
    "D-ls0.2": Claim(WORSE, None, f"Table 3 (D) ε_ls=0.2; {_SMOOTHING} (NLL); its BLEU is within "
                     "the margin and §5.4 weighs smoothing against none"),
    "E": Claim(SAME, SAME, "Table 3 (E); §6.2: learned positional embeddings give “nearly "
               "identical results”"),
}


def claim_of(row: str) -> Claim | None:
    """A row's claim by its name (a repeat, NAME-sSEED, is its row's); None for a row the paper has none for."""
    return CLAIMS.get(row)


def judged(claim: Claim | None, metric: str) -> str | None:
    """What the row claims on `metric` ("nll" or "bleu") when it is judged, else None."""
    if claim is None or claim.kind != "paper":
        return None
    return getattr(claim, metric)
