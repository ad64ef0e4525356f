"""Search (§6.1) against independent truth: exhaustive enumeration, a scripted decoder with
hand-computed scores, an uncached decoder, and one-by-one decoding."""

import itertools
import logging
import math

import pytest
import torch

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.data.tokenizer import BOS, EOS, PAD, Tokenizer
from aiayn.decode.search import beam_search, greedy_search, length_penalty, top_lprobs
from aiayn.decode.translator import Translator
from aiayn.models.transformer import Transformer


def random_model(vocab=7, seed=0, max_positions=64):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, d_model=16, d_ff=32, h=2, N=2, p_drop=0.0, max_positions=max_positions)
    m = Transformer(cfg).eval()
    with torch.no_grad():  # sharper distributions make the ranking non-trivial
        m.out_proj.weight.mul_(3.0)
    return m


def full_logprobs(model, src, prefix):
    """Next-token log-probabilities by a full forward pass over BOS + prefix (no cache)."""
    tgt = torch.tensor([[BOS] + prefix])
    with torch.no_grad():
        return torch.log_softmax(model(src, tgt)[0, -1].float(), -1)


def exhaustive(model, src, max_len, alpha):
    """Every output of up to max_len tokens followed by EOS, scored by uncached forwards."""
    alphabet = [i for i in range(model.cfg.vocab_size) if i not in (PAD, BOS, EOS)]
    results = []
    for n in range(max_len + 1):
        for seq in itertools.product(alphabet, repeat=n):
            logp = 0.0
            for t in range(n + 1):
                lp = full_logprobs(model, src, list(seq[:t]))
                logp += float(lp[seq[t]] if t < n else lp[EOS])
            results.append((logp / length_penalty(n + 1, alpha), list(seq)))
    return sorted(results, key=lambda x: -x[0])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_equals_exhaustive_search(alpha):
    model = random_model(vocab=7, seed=1)  # 4 real tokens (UNK included) + EOS
    src = torch.tensor([[4, 5, 6, EOS]])
    truth = exhaustive(model, src, 3, alpha)
    hyps = beam_search(model, src, beam=128, alpha=alpha, max_len_a=0, max_len_b=3, nbest=5)[0]
    assert [h.tokens for h in hyps] == [t for _, t in truth[:5]]
    for h, (score, _) in zip(hyps, truth):
        assert h.score == pytest.approx(score, abs=1e-4)


def test_beam_one_equals_greedy():
    model = random_model(vocab=11, seed=2)
    src = torch.tensor([[4, 5, 6, 7, EOS], [8, 9, EOS, PAD, PAD], [10, EOS, PAD, PAD, PAD]])
    greedy = greedy_search(model, src, 1.0, 6)
    beam = beam_search(model, src, beam=1, alpha=0.0, max_len_a=1.0, max_len_b=6)
    for g, b in zip(greedy, beam):
        assert b[0].tokens == g.tokens
        assert b[0].score == pytest.approx(g.score, abs=1e-4)


def uncached_greedy(model, src, steps, vocab):
    """Greedy decoding by a full forward pass per step (no cache, no batch)."""
    prefix = []
    banned = torch.tensor([i in (PAD, BOS) for i in range(vocab)])
    for _ in range(steps):
        nxt = int(full_logprobs(model, src, prefix).masked_fill(banned, float("-inf")).argmax())
        if nxt == EOS:
            break
        prefix.append(nxt)
    return prefix


def test_cached_greedy_equals_uncached_greedy():
    model = random_model(vocab=11, seed=3)
    src = torch.tensor([[4, 9, 6, 7, EOS]])
    assert greedy_search(model, src, 0.0, 8)[0].tokens == uncached_greedy(model, src, 8, 11)


def test_batched_greedy_with_sentences_leaving_equals_uncached():
    """Sentences that end early leave the batch; the others must not notice."""
    srcs = [[4, 9, 6, 7, EOS], [5, EOS], [8, 8, 10, EOS], [6, 4, EOS]]
    batch = torch.tensor([s + [PAD] * (5 - len(s)) for s in srcs])
    for seed in range(4):
        model = random_model(vocab=11, seed=seed)
        got = [h.tokens for h in greedy_search(model, batch, 0.0, 8)]
        want = [uncached_greedy(model, torch.tensor([s]), 8, 11) for s in srcs]
        assert got == want
        if len({len(w) for w in want}) > 1:
            break
    assert len({len(w) for w in want}) > 1  # some sentence left the batch before another


def test_batch_equals_one_by_one():
    model = random_model(vocab=13, seed=4)
    srcs = [[4, 5, 6, 7, 8, 9, EOS], [10, 11, EOS], [12, 4, 4, 5, EOS]]
    S = max(map(len, srcs))
    batch = torch.tensor([s + [PAD] * (S - len(s)) for s in srcs])
    together = beam_search(model, batch, beam=4, alpha=0.6, max_len_b=5, nbest=2)
    for s, hyps in zip(srcs, together):
        alone = beam_search(model, torch.tensor([s]), beam=4, alpha=0.6, max_len_b=5, nbest=2)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        for a, b in zip(hyps, alone):
            assert a.score == pytest.approx(b.score, abs=1e-4)


@pytest.mark.parametrize("look_every", [2, 3, 4])
def test_looking_at_done_sentences_every_few_steps_finds_the_same_hypotheses(look_every):
    """On a GPU the search reads which sentences are done every few steps (each read waits for the
    GPU); in between, done sentences search on. Every hypothesis is the one of looking every step:
    sentences that end early, ones cut at their maximum length, n-best lists, any α."""
    srcs = [[4, 5, 6, 7, 8, 9, EOS], [10, 11, EOS], [12, 4, 4, 5, EOS], [6, EOS], [7, 7, 8, 9, 10, EOS]]
    S = max(map(len, srcs))
    batch = torch.tensor([s + [PAD] * (S - len(s)) for s in srcs])
    ends = set()
    for seed, (beam, nbest, alpha, max_b) in enumerate([(4, 2, 0.6, 5), (2, 1, 0.0, 2), (5, 5, 1.0, 9)]):
        model = random_model(vocab=13, seed=seed)
        every = beam_search(model, batch, beam, alpha, 1.0, max_b, nbest, look_every=1)
        few = beam_search(model, batch, beam, alpha, 1.0, max_b, nbest, look_every=look_every)
        for a, b in zip(every, few):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
        ends |= {len(h[0].tokens) for h in every}
    assert len(ends) >= 3  # sentences left at different steps


def test_bf16_batch_equals_one_by_one():
    """The bf16 decoding path (autocast, explicit attention, fp32 logits from the bf16 decoder):
    batched search gives each sentence what searching it alone gives."""
    model = random_model(vocab=13, seed=4)
    srcs = [[4, 5, 6, 7, 8, 9, EOS], [10, 11, EOS], [12, 4, 4, 5, EOS], [6, 6, EOS]]
    S = max(map(len, srcs))
    batch = torch.tensor([s + [PAD] * (S - len(s)) for s in srcs])
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        assert model.decode_step(batch[:, 0], model.start_decoding(batch)).dtype == torch.float32
        together = beam_search(model, batch, beam=4, alpha=0.6, max_len_b=6)
        alone = [beam_search(model, torch.tensor([s]), beam=4, alpha=0.6, max_len_b=6)[0] for s in srcs]
    for hyps, ref in zip(together, alone):
        assert hyps[0].tokens == ref[0].tokens
        assert hyps[0].score == pytest.approx(ref[0].score, abs=0.05)


# -- a scripted decoder with hand-set probabilities -------------------------------------------
A, B = 4, 5
TABLE = {  # P(next | prefix); UNK never
    (): {A: 0.5, B: 0.4, EOS: 0.1},
    (A,): {EOS: 0.6, A: 0.2, B: 0.2},
    (B,): {A: 0.7, EOS: 0.05, B: 0.25},
    (B, A): {EOS: 0.9, A: 0.05, B: 0.05},
}
OTHER = {EOS: 0.8, A: 0.1, B: 0.1}


class ScriptedDecoder:
    """Has the two methods search needs; its log-probabilities come from TABLE."""

    def __init__(self):
        self.calls = 0

    class Cache:
        def __init__(self, n):
            self.prefixes = [() for _ in range(n)]

        def reorder(self, rows, sources=None):
            self.prefixes = [self.prefixes[i] for i in rows.tolist()]

    def start_decoding(self, src, group=1):
        return self.Cache(src.size(0) * group)

    def decode_step(self, tokens, cache):
        self.calls += 1
        out = torch.full((len(cache.prefixes), 6), float("-inf"))
        for row, tok in enumerate(tokens.tolist()):
            if tok != BOS:
                cache.prefixes[row] = cache.prefixes[row] + (tok,)
            for nxt, p in TABLE.get(cache.prefixes[row], OTHER).items():
                out[row, nxt] = math.log(p)
        return out


def run_scripted(alpha, nbest=1, beam=2):
    dec = ScriptedDecoder()
    hyps = beam_search(dec, torch.tensor([[4, 4, EOS]]), beam=beam, alpha=alpha, max_len_a=0, max_len_b=5,
                       nbest=nbest)[0]
    return hyps, dec.calls


def test_blockwise_top_candidates_equal_full_log_softmax():
    """The per-block log-softmax/top-k gives what one log_softmax and top-k over all rows give,
    with PAD/BOS excluded and EOS forced (keeping its log-probability) where the length ends."""
    torch.manual_seed(0)
    logits = torch.randn(37, 50) * 3
    at_max = torch.zeros(37, dtype=torch.bool)
    at_max[[0, 5, 36]] = True
    lp = torch.log_softmax(logits, -1)
    lp[:, [PAD, BOS]] = float("-inf")
    forced = torch.full_like(lp, float("-inf"))
    forced[:, EOS] = lp[:, EOS]
    ref = torch.where(at_max[:, None], forced, lp).topk(8, -1)
    for chunk_bytes, branchless in itertools.product((1, 4 * 50 * 4, 1 << 30), (False, True)):  # rows: 1, 4, all
        vals, idx = top_lprobs(logits, 8, at_max, chunk_bytes, branchless)  # branchless: the GPU's way
        torch.testing.assert_close(vals, ref.values)
        assert torch.equal(idx[~at_max], ref.indices[~at_max])
        assert (idx[at_max, 0] == EOS).all()
    vals, _ = top_lprobs(logits[:, :5], 8, at_max)  # fewer tokens than asked for
    assert vals.shape == (37, 5)


def test_scripted_no_length_penalty_stops_early():
    hyps, calls = run_scripted(alpha=0.0)
    # Step 1 finishes "A EOS" (0.5 * 0.6); the best live prefix "B A" has 0.4 * 0.7 = 0.28 < 0.3
    # already and can only fall, so the search stops after two steps.
    assert [h.tokens for h in hyps] == [[A]]
    assert hyps[0].score == pytest.approx(math.log(0.5 * 0.6))
    assert calls == 2


def test_scripted_length_penalty_prefers_longer():
    # With alpha = 2: "A EOS" = log(0.3) / (7/6)^2 = -0.885, "B A EOS" = log(0.252) / (8/6)^2 = -0.775.
    hyps, _ = run_scripted(alpha=2.0, nbest=2)
    assert [h.tokens for h in hyps] == [[B, A], [A]]
    assert hyps[0].score == pytest.approx(math.log(0.4 * 0.7 * 0.9) / ((5 + 3) / 6) ** 2)
    assert hyps[1].score == pytest.approx(math.log(0.5 * 0.6) / ((5 + 2) / 6) ** 2)


def test_scripted_nbest_collects_in_order():
    hyps, calls = run_scripted(alpha=0.0, nbest=2)
    assert [h.tokens for h in hyps] == [[A], [B, A]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.3), math.log(0.252)])
    assert calls == 3  # the third step finishes "B A EOS"; every live score is then below it


def test_scripted_max_length_forces_eos():
    dec = ScriptedDecoder()
    hyps = beam_search(dec, torch.tensor([[4, EOS]]), beam=2, alpha=0.0, max_len_a=0, max_len_b=1, nbest=2)[0]
    # At most one token before EOS: "A EOS" (0.3), "B EOS" (0.4 * 0.05 = 0.02).
    assert [h.tokens for h in hyps] == [[A], [B]]
    assert hyps[1].score == pytest.approx(math.log(0.4 * 0.05))


# -- the Translator on raw text --------------------------------------------------------------
@pytest.fixture
def translator(toy_prepared):
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), d_model=16, d_ff=32, h=2, N=1, p_drop=0.0, max_positions=20)
    return Translator(Transformer(cfg), tok, DecodeConfig(max_len_b=5, max_tokens=50))


def test_translator_preserves_lines_and_order(translator):
    lines = ["the dog runs", "", "a big red house near the park", "   ", "cat"]
    out = translator.translate(lines)
    assert len(out) == 5 and out[1] == "" and out[3] == ""
    for i in (0, 2, 4):
        assert out[i] == translator.translate([lines[i]])[0]


def test_translator_truncates_long_lines_and_handles_unknown_characters(translator, caplog):
    with caplog.at_level(logging.WARNING, logger="aiayn"):
        out = translator.translate(["dog " * 60, "猫 ☃ émoji 🙂"])
    assert len(out) == 2
    assert "truncated" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aiayn"):  # a later chunk of a long input names its own line
        translator.encode_sources(["dog", "dog " * 60], first_line=5001)
    assert "input line 5002 has" in caplog.text


@pytest.mark.parametrize("beam", [1, 4])
def test_an_abandoned_sentence_leaves_within_a_few_steps_and_the_others_do_not_notice(beam):
    """A server's request that gave up mid-chunk: its sentence stops costing rows at the next look
    (every ABANDON_EVERY steps), the batch's other sentences translate as they would have."""
    from aiayn.decode.search import ABANDON_EVERY

    model = random_model(vocab=13, seed=4)
    with torch.no_grad():
        model.out_proj.weight[EOS].fill_(-5.0)  # searches run to their limit
    srcs = [[4, 5, 6, 7, EOS], [10, 11, 12, 9, EOS]]
    batch = torch.tensor(srcs)
    rows, real = [], model.decode_step

    def step(tokens, cache):
        rows.append(tokens.numel())
        return real(tokens, cache)

    model.decode_step = step

    def search(abandoned=None):
        rows.clear()
        if beam == 1:
            return [[h] for h in greedy_search(model, batch, 0.0, 30, abandoned=abandoned)]
        return beam_search(model, batch, beam=beam, alpha=0.6, max_len_a=0.0, max_len_b=30, abandoned=abandoned)

    full = search()
    full_rows = list(rows)
    half = search(lambda active: active == 0)  # sentence 0's request gave up
    assert rows[:ABANDON_EVERY] == full_rows[:ABANDON_EVERY]
    assert rows[ABANDON_EVERY:] == [r // 2 for r in full_rows[ABANDON_EVERY:]]
    assert [h.tokens for h in half[1]] == [h.tokens for h in full[1]]
