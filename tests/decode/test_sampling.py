"""Sampled translations (decode/sampling.py): the distribution against a brute-force reference, the
draws' frequencies against it, a sentence's draw the same alone and in a batch, its score the model's
own log-probability of what it drew (teacher-forced), and the command line's flags."""

import math

import pytest
import torch
from conftest import random_translator, save_translator
from scipy import stats

from aiayn.cli import main
from aiayn.config import DecodeConfig
from aiayn.data.tokenizer import BOS, EOS
from aiayn.decode.sampling import Sampler, Sampling, sampling_probs
from aiayn.decode.translator import Translator


def brute(row: list[float], s: Sampling) -> list[float]:
    """softmax(x / T), the top k kept, then the smallest most-probable prefix of mass >= p, renormalized."""
    z = [x / s.temperature for x in row]
    m = max(z)
    p = [math.exp(x - m) for x in z]
    total = sum(p)
    p = [x / total for x in p]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    keep = set(order[:s.top_k] if s.top_k else order)
    p = [x if i in keep else 0.0 for i, x in enumerate(p)]
    total = sum(p)
    p = [x / total for x in p]
    if s.top_p < 1:
        mass, kept = 0.0, set()
        for i in sorted(range(len(p)), key=lambda i: -p[i]):
            if mass >= s.top_p:
                break
            kept.add(i)
            mass += p[i]
        p = [x if i in kept else 0.0 for i, x in enumerate(p)]
        total = sum(p)
        p = [x / total for x in p]
    return p


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 5, 1.0), (1.0, 0, 0.6),
                                                     (0.7, 8, 0.9), (1.0, 1, 1.0)])
def test_the_distribution_is_the_brute_force_ones(temperature, top_k, top_p):
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(6, 30) * 2, -1)
    s = Sampling(temperature, top_k, top_p)
    got = sampling_probs(logp, s)
    want = torch.tensor([brute(r, s) for r in logp.tolist()])
    assert torch.allclose(got, want, atol=1e-6)


def test_the_draws_follow_the_distribution():
    """20,000 draws of one row: their counts pass a chi-square test against the distribution."""
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0, 2.0, 1.0, 0.5, -1.0]])  # PAD, UNK, BOS, EOS, then words
    s = Sampling(temperature=0.8, top_p=0.95)
    pick = Sampler(s, torch.tensor([[5, 6, EOS]]))
    counts = torch.zeros(8)
    for _ in range(20_000):
        _, tok = pick(logits, torch.tensor([False]), torch.tensor([0]))
        counts[tok] += 1
    logp = torch.log_softmax(logits, -1)
    logp[:, [0, 2]] = float("-inf")  # PAD and BOS are never drawn
    probs = sampling_probs(logp, s)[0]
    assert counts[probs == 0].sum() == 0
    seen = probs > 0
    assert stats.chisquare(counts[seen], probs[seen] * 20_000).pvalue > 1e-3


@pytest.fixture(scope="module")
def model_and_tok(toy_prepared):
    t = random_translator(toy_prepared / "spm.model")
    return t.model, t.tokenizer


SOURCES = ["the dog runs", "a big red house near the street", "the woman sits", "blue cat", "the man runs near"]


def translator(model_and_tok, **decode) -> Translator:
    model, tok = model_and_tok
    return Translator(model, tok, DecodeConfig(max_len_b=12, **decode), precision="fp32")


def test_a_sentence_draws_the_same_alone_and_in_a_batch_and_top_k_1_is_greedy(model_and_tok):
    t = translator(model_and_tok, sample=True, seed=7)
    batch = t.translate(SOURCES)
    assert batch == [t.translate([s])[0] for s in SOURCES] == t.translate(SOURCES)
    assert batch != translator(model_and_tok, sample=True, seed=8).translate(SOURCES)
    greedy = translator(model_and_tok).translate(SOURCES, beam=1)
    assert translator(model_and_tok, sample=True, top_k=1).translate(SOURCES) == greedy != batch


def test_a_draws_score_is_the_models_log_probability_of_it(model_and_tok):
    """The score is log p(y | x) at temperature 1, summed over the drawn tokens and EOS, as one
    teacher-forced pass of the model computes it (even when the draw was at another temperature)."""
    model, _ = model_and_tok
    t = translator(model_and_tok, sample=True, temperature=1.5, seed=3)
    ids = t.encode_sources(SOURCES)
    for src, (h,) in zip(ids, t.translate_ids(ids)):
        y = h.tokens + [EOS]  # the last step ends the sentence, drawn or at the length limit
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([src]), torch.tensor([[BOS] + y[:-1]])), -1)[0]
        assert h.score == pytest.approx(float(logp.gather(1, torch.tensor(y)[:, None]).sum()), abs=1e-4)


def test_the_command_line_samples_as_the_translator_does_and_refuses_bad_settings(toy_prepared, tmp_path, capsys):
    ckpt = save_translator(random_translator(toy_prepared / "spm.model"), tmp_path / "m.safetensors")
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in SOURCES))
    assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in.txt"), "--sample", "--seed", "5",
                 "--top-p", "0.9", "--precision", "fp32", "--max-len-b", "12"]) == 0
    want = Translator.load(ckpt, precision="fp32", sample=True, seed=5, top_p=0.9, max_len_b=12).translate(SOURCES)
    assert capsys.readouterr().out.splitlines() == want
    for flags, says in ((["--top-p", "0"], "--top-p"), (["--temperature", "-1"], "--temperature"),
                        (["--nbest", "2", "--beam", "2"], "decode.nbest must be 1")):
        assert main(["translate", "--checkpoint", str(ckpt), "-i", str(tmp_path / "in.txt"), "--sample", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
