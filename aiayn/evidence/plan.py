"""The suites as data: rows of config overrides, the protocol they share, and the budget rule.

Every suite trains a fixed number of updates with the main job's schedule (the `multi30k`
preset's warm-up and rate), checkpoints at the same spacing in updates for every architecture and
averages the last 5 (§6.1): machine load can slow a run, never change its result. Clean
throughput is measured apart (throughput.py) and wall-clock comparisons are computed from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..overrides import preset
from .stats import seed_test

# The update budget of every suite: from where the multi30k reference's validation NLL improves by
# less than 2 % over every further 10 % of updates (`converged_at`), measured on its own curve by
# `aiayn reproduce --suite budget --steps 6000` (commit e489e51, 2026-11-23, validation every 250
# updates, results/reproduction/budget/): NLL 2.43 / 1.84 / 1.77 / 1.72 / 1.71 / 1.69 / 1.73 at
# 1,000 / 2,000 / 2,500 / 2,750 / 3,500 / 5,000 (its best) / 6,000 updates: 2,750.
BUDGET_UPDATES = 2750
SUITES = ("budget", "table3", "arch", "tune", "decode", "table1", "quick")  # what `aiayn reproduce --suite` runs
NLL_MARGIN = 0.02  # nats per token: equivalence means the 90 % interval lies inside ±this (TOST at 5 %)
BLEU_MARGIN = 0.5  # BLEU points; a paper Δ within the margins claims something only where its text does (claims.py)


def converged_at(curve: list[tuple[int, float]], tol: float = 0.02, span: float = 0.1) -> int | None:
    """The first update s from which the validation NLL improves by less than `tol` (relative) over
    every further `span` of updates: for each validation t ≥ s, between t and the first validation
    at or after (1 + span)·t. A sustained property, so one flat stretch in a noisy curve does not
    end the search; a rise (over-fitting) is no improvement; None when the curve never gets there."""
    def flat(i: int) -> bool | None:
        t, nll = curve[i]
        later = [v for u, v in curve[i + 1:] if u >= (1 + span) * t]
        return nll - later[0] < tol * nll if later else None

    checks = [flat(i) for i in range(len(curve))]
    for i, ok in enumerate(checks):
        if ok and all(c is not False for c in checks[i:]):
            return curve[i][0]
    return None


def diverged(r: dict, factor: float = 2.0) -> str | None:
    """A run whose final validation perplexity is not finite or more than `factor` times its own
    best along the way did not converge: its scores say nothing about the row's change, only that
    training failed (with the suite's schedule). Returns what happened, or None."""
    curve = [(int(c[0]), float(c[1])) for c in r.get("curve", [])]
    final = float(r["valid_ppl"])
    finite = [c for c in curve if math.isfinite(c[1])]
    if not finite:
        return None if math.isfinite(final) else "diverged: validation perplexity not finite"
    best_step, best = min(finite, key=lambda c: c[1])
    if not math.isfinite(final) or final > factor * best:
        return (f"diverged: validation PPL {best:,.0f} at update {best_step:,}, "
                f"{final:,.0f} at the end")
    return None


STABILITY_RISE = 0.02  # the budget rule's 2 %, read the other way: a rise is no training


def unstable(r: dict, rise: float = STABILITY_RISE) -> str | None:
    """The stability check's reading of an N=6 run (§5.3's warm-up): diverged, or its final validation
    NLL more than `rise` above its best: it got worse when the rate peaked and did not recover (a
    healthy run still improves two warm-ups in). Over-fitting later in a row's budget is a result, not this."""
    if failed := diverged(r):
        return failed
    curve = [(int(c[0]), math.log(float(c[1]))) for c in r.get("curve", []) if math.isfinite(float(c[1]))]
    if not curve:
        return None
    best_step, best = min(curve, key=lambda c: c[1])
    final = float(r["valid_nll"])
    if final > best * (1 + rise):
        return (f"did not train: validation NLL {best:.3f} at update {best_step:,}, {final:.3f} at the end "
                f"(more than {rise:.0%} above its best)")
    return None


@dataclass(frozen=True)
class PaperRow:
    """A row of Table 3 (newstest2013 dev PPL / BLEU) and the row it is compared with."""

    label: str
    ppl: float
    bleu: float
    ref_ppl: float = 4.92  # base
    ref_bleu: float = 25.8


@dataclass(frozen=True)
class Row:
    """One run of a suite: config overrides on a preset, and what the paper measured for it.
    `family` names the reference a row is compared with (rows of different schedules never are)."""

    name: str
    change: str  # what differs from the suite's reference, in the paper's notation
    overrides: dict[str, Any] = field(default_factory=dict)
    preset: str = "multi30k"
    seed: int = 1
    paper: PaperRow | None = None
    group: str = ""  # Table 3's row letter, "ref", or an architecture family
    family: str = "main"
    of: str = ""  # the row this one repeats with another seed (repeat()); "" for a row's first run


def repeat(row: Row, seed: int) -> Row:
    """The same row with another seed, named NAME-sSEED; the report pools it with `row`."""
    return Row(f"{row.name}-s{seed}", row.change, row.overrides, row.preset, seed, row.paper, row.group,
               row.family, of=row.name)


def second_seed_distance(row: float | list[float], reference: list[float], low: float = 1.0,
                         high: float = 2.5) -> float | None:
    """Table 3's seed rule: a row run once whose NLL change lands between `low` and `high` half-widths
    of the reference's 95 % prediction interval (near the line, where a second seed can decide) gets
    a second seed. Returns how far it lies from the line (|ratio − 1|, nearest first), None when the
    rule does not apply."""

    if not isinstance(row, (int, float)) and len(row) != 1:
        return None
    t = seed_test(row, reference)
    if t is None or t.pi95 <= 0:
        return None
    ratio = abs(t.delta) / t.pi95
    return abs(ratio - 1) if low <= ratio <= high else None


_P = PaperRow
DEPTH = ("C-N1", "C-N2", "C-N4", "C-N6")  # with N=3 (the reference's depth): the rows the stability check guards
# The longer rerun (5,000 updates, 2 reference seeds: docs/reproduction-5000, its results in
# results/reproduction-5000), its `--rows`: the references, the rows whose verdict changes along the
# 2,750-update curve (curves.py) and those asked for by name (A-h16, the depth rows, C-dmodel512, D-ls0.0, E)
LONGER = ("ref", "A-h16", *DEPTH, "C-dmodel512", "D-pdrop0.0", "D-ls0.0", "E")
# How each Table 3 suite was designed, by its updates: exploratory when its claims and verdict rule were
# written after its data, confirmatory when they were fixed before its first result. A confirmatory
# suite's tally is a verdict only once its reference has FULL_REFERENCE_SEEDS seeds (the 2,750 suite's).
DESIGNS = {
    2750: ("exploratory", "its claims (evidence/claims.py) and the three-way verdict rule were written on "
                          "2026-11-26, after 39 of its 43 results had finished (2026-11-24 to 2026-11-28)"),
    5000: ("confirmatory", "its rows, claims, verdict rule and second-seed rule were fixed by 2026-11-26 12:19 UTC, "
                           "before its first result (2026-11-26 22:16 UTC)"),
}
FULL_REFERENCE_SEEDS = 5


def table3_rows(seeds: int = 5, depth_scale: float | None = None) -> list[Row]:
    """Table 3 scaled to the multi30k reference (d_model 256, h 4, N 3, d_ff 1024, P_drop 0.2), each
    row against the paper's row that changes the base model the same way. depth_scale: when N=6
    diverged at the suite's schedule, the depth rows and their own reference train with this
    train.lr_scale instead."""
    ref = [Row(f"ref-s{s}", "reference", seed=s, group="ref") for s in range(1, seeds + 1)]
    rows = [
        Row("A-h1", "h=1, d_k=d_v=256", {"model.h": 1}, paper=_P("A h=1, d_k=512", 5.29, 24.9), group="A"),
        Row("A-h2", "h=2, d_k=d_v=128", {"model.h": 2}, paper=_P("A h=4, d_k=128", 5.00, 25.5), group="A"),
        Row("A-h8", "h=8, d_k=d_v=32", {"model.h": 8}, paper=_P("A h=16, d_k=32", 4.91, 25.8), group="A"),
        Row("A-h16", "h=16, d_k=d_v=16", {"model.h": 16}, paper=_P("A h=32, d_k=16", 5.01, 25.4), group="A"),
        Row("B-dk16", "d_k=16", {"model.d_k": 16, "model.d_v": 64}, paper=_P("B d_k=16", 5.16, 25.1), group="B"),
        Row("B-dk32", "d_k=32", {"model.d_k": 32, "model.d_v": 64}, paper=_P("B d_k=32", 5.01, 25.4), group="B"),
        Row("C-N1", "N=1", {"model.N": 1}, paper=_P("C N=2", 6.11, 23.7), group="C"),
        Row("C-N2", "N=2", {"model.N": 2}, paper=_P("C N=4", 5.19, 25.3), group="C"),
        Row("C-N4", "N=4", {"model.N": 4}, paper=_P("C N=8", 4.88, 25.5), group="C"),  # the paper's 1.33× step
        Row("C-N6", "N=6", {"model.N": 6}, paper=_P("C N=8", 4.88, 25.5), group="C"),  # 2×: an observation
        Row("C-dmodel128", "d_model=128, d_k=32", {"model.d_model": 128},
            paper=_P("C d_model=256, d_k=32", 5.75, 24.5), group="C"),
        Row("C-dmodel512", "d_model=512, d_k=128", {"model.d_model": 512},
            paper=_P("C d_model=1024, d_k=128", 4.66, 26.0), group="C"),
        # Eq. 3's d_model^-0.5 lowers the wider row's peak rate by √2: the same row at the reference's peak
        Row("C-dmodel512-rate", "d_model=512, d_k=128, at the reference's peak rate",
            {"model.d_model": 512, "train.lr_scale": round(preset("multi30k").train.lr_scale * math.sqrt(2), 6)},
            paper=_P("C d_model=1024, d_k=128", 4.66, 26.0), group="C"),
        Row("C-dff512", "d_ff=512", {"model.d_ff": 512}, paper=_P("C d_ff=1024", 5.12, 25.4), group="C"),
        Row("C-dff2048", "d_ff=2048", {"model.d_ff": 2048}, paper=_P("C d_ff=4096", 4.75, 26.2), group="C"),
        Row("D-pdrop0.0", "P_drop=0.0", {"model.p_drop": 0.0}, paper=_P("D P_drop=0.0", 5.77, 24.6), group="D"),
        # Our reference drops with 0.2; the paper's base with 0.1 and its D row with 0.2.
        Row("D-pdrop0.1", "P_drop=0.1", {"model.p_drop": 0.1},
            paper=_P("base P_drop=0.1 vs D P_drop=0.2", 4.92, 25.8, 4.95, 25.5), group="D"),
        Row("D-pdrop0.3", "P_drop=0.3", {"model.p_drop": 0.3}, paper=_P("D P_drop=0.2 vs base 0.1", 4.95, 25.5),
            group="D"),
        Row("D-ls0.0", "ε_ls=0.0", {"train.label_smoothing": 0.0}, paper=_P("D ε_ls=0.0", 4.67, 25.3), group="D"),
        Row("D-ls0.2", "ε_ls=0.2", {"train.label_smoothing": 0.2}, paper=_P("D ε_ls=0.2", 5.47, 25.7), group="D"),
        Row("E", "learned positional embedding", {"model.learned_positions": True},
            paper=_P("E positional embedding", 4.92, 25.7), group="E"),
    ]
    if depth_scale is None:
        return ref + rows
    return ref + [r for r in rows if r.name not in DEPTH] + depth_rows(seeds, depth_scale, ref + rows)


def depth_rows(seeds: int, lr_scale: float, rows: list[Row]) -> list[Row]:
    """The depth rows and a reference of their own (the rows' reference overrides, seeds 1..n), all
    at train.lr_scale `lr_scale` (family "depth")."""
    ref = next((r for r in rows if r.group == "ref"), Row("ref", "reference"))
    lr = {"train.lr_scale": lr_scale}
    refs = [Row(f"depth-ref-s{s}", f"reference at lr_scale {lr_scale:g}", {**ref.overrides, **lr}, ref.preset,
                seed=s, group="ref", family="depth") for s in range(1, seeds + 1)]
    deep = [Row(r.name, f"{r.change}, lr_scale {lr_scale:g}", {**r.overrides, **lr}, r.preset, r.seed, r.paper,
                r.group, "depth") for r in rows if r.name in DEPTH]
    return refs + deep


def stability_rows(scales: tuple[float, ...] = (1.0, 0.5, 0.25), base: dict[str, Any] | None = None,
                   lr_scale: float | None = None) -> list[Row]:
    """N=6 at the suite's rate (train.lr_scale `lr_scale`, the multi30k preset's), then at lower
    ones: the first that trains sets the depth rows' rate."""

    lr_scale = preset("multi30k").train.lr_scale if lr_scale is None else lr_scale
    return [Row(f"stability-N6-x{s:g}", f"N=6 at lr ×{s:g}", {**(base or {}), "model.N": 6,
                                                              "train.lr_scale": round(lr_scale * s, 6)},
                group="stability", family="stability") for s in scales]


def arch_rows() -> list[Row]:
    """The three families at one update budget: Table 2's comparison at small scale, each at its
    preset's rate and clipping (the tune suite chooses every family's own on validation)."""
    luong = {"model.rnn_variant": "luong", "model.rnn_attention": "dot"}
    return [
        Row("transformer", "Transformer (multi30k preset)", group="transformer"),
        Row("bahdanau", "bi-LSTM encoder, LSTM decoder attending from s_{t-1} (Bahdanau et al., 2015)",
            {"model.rnn_variant": "bahdanau", "model.rnn_attention": "additive"}, preset="multi30k-rnn",
            group="recurrent"),
        Row("luong", "bi-LSTM encoder, LSTM decoder, global dot attention, input feeding (Luong et al., 2015)",
            luong, preset="multi30k-rnn", group="recurrent"),
        Row("luong-7.6M", "Luong et al. at the Transformer's size (hidden 368)", {**luong, "model.d_model": 368},
            preset="multi30k-rnn", group="recurrent"),
        Row("conv", "ConvS2S: GLU convolutions, kernel 3, 5 + 5 layers, multi-step attention (Gehring et al., 2017)",
            preset="multi30k-conv", group="convolutional"),
    ]


# The tune suite's grid, the same for every family: peak rates (Eq. 3's shape, warm-up 800) × clipping
# (0 = none, the paper's; 1.0). The presets' settings: the Transformer 1.77e-3 unclipped, the recurrent
# models 1e-3 at 1.0, ConvS2S 1e-3 at 0.1 (Gehring et al.'s, with SGD).
TUNE_RATES, TUNE_CLIPS = (1e-3, 2e-3), (0.0, 1.0)
TUNED = {"transformer": ("multi30k", "Transformer", {}),
         "bahdanau": ("multi30k-rnn", "Bahdanau et al.", {"model.rnn_variant": "bahdanau",
                                                            "model.rnn_attention": "additive"}),
         "luong": ("multi30k-rnn", "Luong et al.", {"model.rnn_variant": "luong", "model.rnn_attention": "dot"}),
         "conv": ("multi30k-conv", "ConvS2S", {})}


def tune_rows() -> list[Row]:
    """Every family's peak rate and clipping chosen on validation NLL, the Transformer's included
    (§5.3's schedule shape at each rate; §5 does not clip): one seed a setting, the same grid for all."""
    return [Row(f"{fam}-lr{lr:g}-clip{clip:g}", f"{words}, peak lr {lr:g}, clip {clip:g}",
                {**over, "train.lr_scale": 1.0, "train.peak_lr": lr, "train.clip_norm": clip}, preset=name, group=fam)
            for fam, (name, words, over) in TUNED.items() for lr in TUNE_RATES for clip in TUNE_CLIPS]


TUNE_EXTEND = 4  # doublings of the peak rate beyond the grid, at most, while a family's choice lies at its top


def extended(row: Row, rate: float) -> Row:
    """A tune row at another peak rate, its clipping and all else the same: the grid extended past a
    choice that lies at its highest rate (one seed, as the grid)."""
    clip = row.overrides["train.clip_norm"]
    return Row(f"{row.group}-lr{rate:g}-clip{clip:g}", f"{row.change.split(', peak lr')[0]}, peak lr {rate:g}, "
               f"clip {clip:g}", {**row.overrides, "train.peak_lr": rate}, row.preset, group=row.group)


def equal_flops(row: Row, updates: int) -> Row:
    """A tune suite's choice trained to `updates`: where its training FLOPs equal the Transformer's at
    the suite's budget (a family that spends fewer per update trains longer; the same schedule)."""
    return Row(f"{row.name}-flops", f"{row.change}, {updates:,} updates (the Transformer's training FLOPs)",
               {**row.overrides, "train.max_steps": updates}, row.preset, row.seed, row.paper, row.group, "flops")


def protocol(steps: int, valid_every: int | None = None) -> dict[str, Any]:
    """Settings every row of a suite shares: `steps` updates, no wall-clock limit, validation every
    steps/10 (or `valid_every`: a longer run's curve on a finer grid), checkpoints every steps/20
    updates and the last 5 kept (§6.1)."""
    return {"train.max_steps": steps, "train.max_minutes": 0.0, "train.max_epochs": 0,
            "train.valid_every": valid_every or max(1, steps // 10), "train.valid_bleu_sentences": 0,
            "train.save_every": max(1, steps // 20), "train.save_every_minutes": 0.0, "train.keep_last": 5,
            "train.log_every": max(1, steps // 40)}


# Toy sizes for `--suite quick`: checks the machinery in seconds, not the findings.
TINY = {"model.d_model": 32, "model.d_ff": 64, "model.h": 4, "model.N": 1, "model.max_positions": 128,
        "data.max_tokens": 400, "train.threads": 1, "train.precision": "fp32", "decode.max_len_b": 10,
        "train.warmup_steps": 4}


def quick_rows() -> dict[str, list[Row]]:
    """Every suite's machinery at toy sizes: three reference seeds, rows, the depth group (the
    stability check is set up in suites.py), the five architectures, one tuning row."""
    t3 = [Row("ref-s1", "reference", TINY, group="ref"), Row("ref-s2", "reference", TINY, seed=2, group="ref"),
          Row("ref-s3", "reference", TINY, seed=3, group="ref"),
          Row("A-h1", "h=1", {**TINY, "model.h": 1}, paper=_P("A h=1, d_k=512", 5.29, 24.9), group="A"),
          Row("E", "learned positions", {**TINY, "model.learned_positions": True},
              paper=_P("E positional embedding", 4.92, 25.7), group="E"),
          Row("C-N6", "N=6", {**TINY, "model.N": 6}, paper=_P("C N=8", 4.88, 25.5), group="C")]
    tiny_rnn = {**TINY, "train.peak_lr": 3e-3, "train.lr_scale": 1.0, "model.conv_channels": 32}
    arch = [Row(r.name, r.change, TINY if r.preset == "multi30k" else
                {**tiny_rnn, **r.overrides, "model.d_model": 40 if "model.d_model" in r.overrides else 32},
                r.preset, group=r.group) for r in arch_rows()]
    tune = [Row(r.name, r.change, {**(TINY if r.preset == "multi30k" else tiny_rnn), **r.overrides}, r.preset,
                group=r.group) for r in tune_rows() if r.name in ("transformer-lr0.002-clip0", "conv-lr0.002-clip1")]
    return {"table3": t3, "arch": arch, "tune": tune}
