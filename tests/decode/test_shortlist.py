"""The decoding shortlist (shortlist.py): its table against a brute-force count of the training
pairs, its columns against set arithmetic, search through it against search over the whole
vocabulary, batch against one by one in every precision, and its file's errors."""

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import requires_int8

from aiayn.decode.fast import FusedDecoder
from aiayn.decode.search import beam_search, greedy_search
from aiayn.decode.shortlist import (
    MAX_PER_SOURCE,
    Shortlist,
    ShortlistDecoder,
    ShortlistError,
    _pairs,
    build,
    vocabulary_id,
)
from aiayn.device import int8_kernel
from aiayn.models.precision import cast_bf16, quantize_int8
from tests.decode.fast.test_fused import sources, toy


@pytest.mark.parametrize("max_pairs,stride", [(0, 1), (200, 2), (150, 3)])
def test_table_holds_each_source_subwords_best_dice_partners(toy_prepared, max_pairs, stride):
    """Brute force: count sentence pairs in Python (every stride-th when capped), rank
    every target id by Dice, keep the first k."""
    sl = build(toy_prepared, per_source=3, frequent=5, max_pairs=max_pairs)
    src, tgt = _pairs(toy_prepared)
    assert 300 < len(src) <= 400  # so that 200 pairs at most is every 2nd, 150 every 3rd
    src, tgt = src[::stride], tgt[::stride]
    both, cs, ct, freq = Counter(), Counter(), Counter(), Counter()
    for s, t in zip(src, tgt):
        S, T = set(s.tolist()), set(t.tolist())
        cs.update(S)
        ct.update(T)
        freq.update(t.tolist())
        both.update(itertools.product(S, T))
    for s in sorted(cs):
        ranked = sorted((t for (a, t) in both if a == s), key=lambda t: (-2 * both[s, t] / (cs[s] + ct[t]), t))
        assert sl.table[s].tolist() == (ranked + [3, 3, 3])[:3], s
    assert sl.table[0].tolist() == [3, 3, 3]  # PAD co-occurs with nothing: EOS pads its row
    top = sorted(freq, key=lambda t: (-freq[t], t))[:5]
    assert sl.frequent.tolist() == top


def test_a_list_longer_than_the_vocabulary_is_the_whole_vocabulary_and_a_huge_one_is_refused(toy_prepared):
    """per_source past the vocabulary keeps what the vocabulary has (no (V, 10^6) table is allocated);
    past MAX_PER_SOURCE it is refused before anything is read."""
    whole = build(toy_prepared, per_source=60, frequent=5)
    assert whole.table.shape[1] == 60 and torch.equal(build(toy_prepared, per_source=1000, frequent=5).table,
                                                      whole.table)
    with pytest.raises(ValueError, match="per_source must be in"):
        build(toy_prepared, per_source=MAX_PER_SOURCE + 1)


def test_columns_are_the_union_and_each_row_keeps_only_its_own():
    table = torch.tensor([[3, 3], [3, 3], [3, 3], [3, 3], [9, 7], [7, 8], [11, 3]] + [[3, 3]] * 9)
    sl = Shortlist(table, torch.tensor([5]), "v")
    src = torch.tensor([[4, 6, 3], [5, 3, 0]])
    cols, own = sl.columns(src)
    mine = [{0, 1, 2, 3, 5, 9, 7, 11}, {0, 1, 2, 3, 5, 7, 8}]
    assert cols.tolist() == sorted(mine[0] | mine[1])
    assert [set(cols[r].tolist()) for r in own] == mine


def _search(model, src, beam):
    if beam == 1:
        return [[h] for h in greedy_search(model, src, max_len_b=12)]
    return beam_search(model, src, beam, 0.6, max_len_b=12, nbest=2)


def _key(hyps):
    return [[(h.tokens, h.score) for h in hs] for hs in hyps]


def _decoders():
    model = toy()
    out = {"fp32": FusedDecoder(model), "bf16": FusedDecoder(cast_bf16(toy()), torch.bfloat16)}
    if int8_kernel():  # int8 needs AVX2 (conftest.requires_int8)
        out["int8"] = FusedDecoder(model, int8=True, encoder=quantize_int8(model))
    return out


@pytest.mark.parametrize("beam", [1, 4])
def test_a_shortlist_of_the_whole_vocabulary_searches_exactly_as_without_one(beam):
    full = Shortlist(torch.arange(97)[:, None], torch.arange(97), "v")
    src = sources()
    for name, fused in _decoders().items():
        if name == "bf16":  # its shortlisted products sum in fp32 (fusedstep.output_rows): scores to rounding
            continue
        short = ShortlistDecoder(fused, *full.columns(src))
        assert _key(short.full_ids(_search(short, src, beam))) == _key(_search(fused, src, beam)), name


@pytest.mark.parametrize("beam", [1, 4])
def test_shortlisted_search_is_the_same_in_any_batch_and_stays_in_each_sentences_set(beam):
    g = torch.Generator().manual_seed(3)
    sl = Shortlist(torch.randint(4, 97, (97, 4), generator=g), torch.tensor([4, 5, 6, 7, 8, 9]), "v")
    src = sources()
    for name, fused in _decoders().items():
        short = ShortlistDecoder(fused, *sl.columns(src))
        batch = short.full_ids(_search(short, src, beam))
        for b in range(src.size(0)):
            one_src = src[b:b + 1, :int((src[b] != 0).sum())]
            alone = ShortlistDecoder(fused, *sl.columns(one_src))
            one = _key(alone.full_ids(_search(alone, one_src, beam)))[0]
            # alone, the encoder's products have other shapes: the same tokens, scores equal to rounding
            assert [t for t, _ in one] == [t for t, _ in _key(batch)[b]], (name, b)
            assert [s for _, s in one] == pytest.approx([s for _, s in _key(batch)[b]], rel=1e-4)
            allowed = set(sl.table[src[b]].flatten().tolist()) | set(range(10))
            assert all(set(h.tokens) <= allowed for h in batch[b]), name


def test_file_round_trip_and_its_errors(tmp_path):
    sl = Shortlist(torch.tensor([[3, 3]] * 4 + [[3, 5], [6, 3], [4, 3]]), torch.tensor([4]), vocabulary_id(b"proto"))
    path = tmp_path / "sl.safetensors"
    sl.save(path)
    back = Shortlist.load(path, b"proto")
    assert torch.equal(back.table, sl.table) and torch.equal(back.frequent, sl.frequent)
    with pytest.raises(ShortlistError, match="another vocabulary"):
        Shortlist.load(path, b"other")
    with pytest.raises(ShortlistError, match="no such"):
        Shortlist.load(tmp_path / "missing.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ShortlistError, match="not a shortlist"):
        Shortlist.load(tmp_path / "bad.safetensors")
    from safetensors.numpy import save_file

    for table in (np.array([3, 5]), np.array([[3, 9], [6, 3]]), np.array([[3.0, 1.0], [1.0, 3.0]])):
        save_file({"table": table, "frequent": np.array([1])}, str(tmp_path / "odd.safetensors"),
                  metadata={"aiayn_shortlist": '{"vocab_sha256": "x"}'})
        with pytest.raises(ShortlistError, match="corrupt"):
            Shortlist.load(tmp_path / "odd.safetensors")
    np.save(tmp_path / "x.npy", np.zeros(3))
    with pytest.raises(ShortlistError, match="not a shortlist"):
        Shortlist.load(tmp_path / "x.npy")


@pytest.mark.long
@pytest.mark.slow
@requires_int8
def test_compiled_shortlisted_search_finds_the_eager_ones_hypotheses_in_a_batch_or_alone():
    """int8 compiled (`translate --precision int8 --compile --shortlist`, the fastest in
    bench/README.md): the compiled step without its output layer, then the shortlist's columns."""
    model = toy(N=1)
    kw = {"int8": True, "encoder": quantize_int8(model)}
    eager, compiled = FusedDecoder(model, **kw), FusedDecoder(model, compiled=True, **kw)
    g = torch.Generator().manual_seed(3)
    sl = Shortlist(torch.randint(4, 97, (97, 4), generator=g), torch.tensor([4, 5, 6, 7, 8, 9]), "v")
    src = sources()

    def tokens(fused, s):
        short = ShortlistDecoder(fused, *sl.columns(s))
        return [[h.tokens for h in hs] for hs in short.full_ids(_search(short, s, 4))]

    ref = tokens(eager, src)
    assert tokens(compiled, src) == ref
    assert [tokens(compiled, src[b:b + 1, :int((src[b] != 0).sum())])[0] for b in range(3)] == ref
