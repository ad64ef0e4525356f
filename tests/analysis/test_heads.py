"""Head gates against heads removed by hand, the gradient proxy against finite differences, and
the role statistics on hand-built attention patterns."""

import copy
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import tiny_config

from aiayn.analysis.heads import (
    HeadGates,
    ablation_importance,
    attention_modules,
    entropy,
    gradient_importance,
    positional,
    prune,
    rare_word,
    sink,
)
from aiayn.data.batches import TokenData
from aiayn.models.build import build_model


def tiny_model(vocab: int = 60):
    torch.manual_seed(0)
    cfg = tiny_config()
    cfg.model.vocab_size, cfg.model.p_drop = vocab, 0.0
    return build_model(cfg.model).eval(), cfg


def zeroed(model, sublayer: str, layer: int, head: int):
    """A copy whose W^O ignores one head: its d_v input columns set to zero."""
    m = copy.deepcopy(model)
    mha = attention_modules(m)[sublayer][layer]
    with torch.no_grad():
        mha.w_o.weight[:, head * mha.d_v:(head + 1) * mha.d_v] = 0
    return m


@pytest.mark.parametrize("sublayer,layer,head", [("encoder_self", 0, 1), ("decoder_self", 1, 3), ("cross", 0, 0)])
def test_a_gate_of_zero_removes_the_head_as_zeroing_its_weights_does(sublayer, layer, head):
    model, _ = tiny_model()
    src, tgt = torch.randint(4, 60, (2, 7)), torch.randint(4, 60, (2, 5))
    gates = HeadGates(model)
    with gates.applied():
        assert torch.equal(model(src, tgt), model(src, tgt))  # gates of 1 change nothing
        full = model(src, tgt)
        gates.gates[sublayer][layer, head] = 0.0
        masked = model(src, tgt)
    assert torch.allclose(full, model(src, tgt))  # hooks gone after the block
    assert torch.allclose(masked, zeroed(model, sublayer, layer, head)(src, tgt), atol=1e-5)
    assert not torch.allclose(masked, full)


@pytest.fixture(scope="module")
def valid(toy_prepared):
    return TokenData(toy_prepared, "valid")


def test_ablation_importance_is_the_nll_of_the_model_without_the_head(valid):
    from aiayn.analysis.heads import eval_batches as _batches
    from aiayn.analysis.heads import nll_per_token as _nll

    model, cfg = tiny_model()
    base, delta = ablation_importance(model, valid, cfg, torch.device("cpu"))
    bs = _batches(valid, cfg)
    with torch.no_grad():
        assert base == pytest.approx(float(_nll(model, bs, cfg, torch.device("cpu"))), rel=1e-6)
        by_hand = float(_nll(zeroed(model, "cross", 1, 2), bs, cfg, torch.device("cpu"))) - base
    assert delta["cross"][1, 2].item() == pytest.approx(by_hand, abs=1e-5)
    assert {k: tuple(v.shape) for k, v in delta.items()} == {"encoder_self": (2, 4), "decoder_self": (2, 4),
                                                              "cross": (2, 4)}


def test_gradient_importance_is_the_gates_derivative(valid):
    """|∂L/∂g| at g = 1 against central finite differences, on a one-batch set."""
    from aiayn.analysis.heads import eval_batches as _batches
    from aiayn.analysis.heads import nll_per_token as _nll

    model, cfg = tiny_model()
    model.double()
    model.out_proj.fp32 = False  # its fp32 cast would meet double weights
    imp = gradient_importance(model, valid, cfg, torch.device("cpu"), batches=1)
    bs, eps = _batches(valid, cfg, 1), 3e-3  # the loss computes in fp32: not too narrow a step
    gates = HeadGates(model)
    with gates.applied(), torch.no_grad():
        for name, (i, j) in (("encoder_self", (0, 0)), ("cross", (1, 3))):
            gates.gates[name] = gates.gates[name].double()
            gates.gates[name][i, j] = 1 + eps
            up = float(_nll(model, bs, cfg, torch.device("cpu")))
            gates.gates[name][i, j] = 1 - eps
            down = float(_nll(model, bs, cfg, torch.device("cpu")))
            gates.gates[name][i, j] = 1.0
            assert imp[name][i, j].item() == pytest.approx(abs(up - down) / (2 * eps), rel=5e-3)


def test_roles_on_hand_built_patterns():
    T = 5
    prev = torch.zeros(T, T)
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1  # every query on the token before it
    uniform = torch.full((T, T), 1 / T)
    keys = torch.tensor([7, 9, 8, 11, 3])  # 3 = EOS
    eos = torch.zeros(T, T)
    eos[:, 4] = 1
    w = torch.stack([prev, uniform, eos])  # (h = 3, T, S)
    assert positional(w, -1).tolist() == pytest.approx([1.0, 0.2, 0.0])  # no query after the EOS key
    assert positional(w, +1).tolist() == pytest.approx([0.0, 0.2, 0.25])  # query 3 of queries 0-3
    assert positional(w, 0).tolist() == pytest.approx([0.2, 0.2, 0.2])  # one diagonal 1 each: (0,0), -, (4,4)
    assert positional(torch.eye(T)[None], 0).tolist() == pytest.approx([1.0])  # every query on its own token
    assert entropy(w).tolist() == pytest.approx([0.0, math.log(T), 0.0], abs=1e-6)
    assert sink(w, keys, {3}).tolist() == pytest.approx([0.0, 0.2, 1.0])
    freq = {7: 50, 9: 2, 8: 40, 11: 30, 3: 1000}
    assert rare_word(w, keys, freq, skip={3}).tolist() == pytest.approx([0.2, 0.2, 0.0])  # token 9 at key 1


def test_alignment_agreement_and_prune_order_by_hand():
    from aiayn.analysis.heads import alignment_agreement, prune_order

    w = torch.zeros(2, 3, 4)
    w[0, [0, 1, 2], [1, 2, 3]] = 1.0  # head 1 picks keys 1, 2, 3
    w[1, :, 0] = 1.0  # head 2 always key 0
    others = torch.zeros(3, 4)
    others[[0, 1, 2], [1, 2, 0]] = 1.0
    assert alignment_agreement(w, others).tolist() == pytest.approx([2 / 3, 1 / 3])
    scores = {"encoder_self": torch.tensor([[0.3, 0.1]]), "decoder_self": torch.tensor([[0.2, 0.0]]),
              "cross": torch.tensor([[0.1, 0.5]])}
    assert prune_order(scores) == [("decoder_self", 0, 1), ("encoder_self", 0, 1), ("cross", 0, 0),
                                   ("decoder_self", 0, 0), ("encoder_self", 0, 0), ("cross", 0, 1)]


def test_heads_are_ranked_on_one_half_of_the_sentences_and_measured_on_the_other(toy_prepared):
    from aiayn.analysis.heads import eval_batches, random_band
    from aiayn.config import Config

    data, cfg = TokenData(toy_prepared, "valid"), Config()
    halves = [[tuple(row[row != 0].tolist()) for b in eval_batches(data, cfg, part=p) for row in b.src] for p in (0, 1)]
    every = [tuple(row[row != 0].tolist()) for b in eval_batches(data, cfg) for row in b.src]
    assert sorted(halves[0] + halves[1]) == sorted(every) and len(halves[0]) == (len(data) + 1) // 2
    assert set(halves[0]) == {tuple(data.src(i).tolist()) + (3,) for i in range(0, len(data), 2)}  # + EOS
    curves = [[{"removed": 0, "nll": 1.0}, {"removed": 3, "nll": v}] for v in range(1, 42)]  # 1 .. 41
    assert random_band(curves)[1] == {"removed": 3, "median": 21.0, "lo": 2.0, "hi": 40.0}


def test_pruning_keeps_a_head_per_sublayer_and_leaves_the_others_alone():
    """Every step removes one head, never the last of its attention; the heads still kept send
    W^O exactly what they sent in the full model (removing a head changes only its own input
    columns of that layer; later layers see a different input, so compare the first layer)."""
    from aiayn.analysis.heads import prune_order, pruning_curve

    model, _ = tiny_model()
    src, tgt = torch.randint(4, 60, (2, 7)), torch.randint(4, 60, (2, 5))
    mods = attention_modules(model)
    seen = []
    hook = mods["encoder_self"][0].w_o.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        model(src, tgt)
    full = seen.pop()
    gates_seen = []

    def evaluate():
        with torch.no_grad():
            model(src, tgt)
        gates_seen.append(seen.pop())
        return {"nll": 0.0, "bleu": 0.0}

    order = prune_order({n: torch.rand(len(ms), ms[0].h) for n, ms in mods.items()})
    curve = pruning_curve(model, order, evaluate)
    hook.remove()
    assert len(curve) == 1 + 3 * 2 * (4 - 1)  # down to one head per attention of each layer
    removed = {tuple(r["head"]) for r in curve[1:]}
    assert len(removed) == len(curve) - 1
    for name, ms in mods.items():
        for i, m in enumerate(ms):
            assert sum((name, i, j) not in removed for j in range(m.h)) == 1
    d_v = mods["encoder_self"][0].d_v
    gone = set()
    for r, x in zip(curve, gates_seen):
        if r["head"] and r["head"][:2] == ["encoder_self", 0]:
            gone.add(r["head"][2])
        for j in range(4):
            cols = slice(j * d_v, (j + 1) * d_v)
            # the hook sees W^O's input before the gate: every head's own output, unchanged
            assert torch.equal(x[..., cols], full[..., cols])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_gated_model_translates_as_the_hand_pruned_one(toy_prepared, precision):
    """Beam search through Translator (bf16: its converted copy) sees the gates."""
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.decode.translator import Translator

    model, cfg = tiny_model(60)
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    lines = (toy_prepared / "valid.en.txt").read_text().splitlines()[:6]
    gates = HeadGates(model)
    t = Translator(model, tok, cfg.decode, precision=precision)
    with gates.applied():
        gates.gates["cross"][1, :3] = 0.0
        gates.gates["decoder_self"][0, 2] = 0.0
        t.model = model
        gated = t.translate(lines, beam=4)
    by_hand = zeroed(zeroed(zeroed(zeroed(model, "cross", 1, 0), "cross", 1, 1), "cross", 1, 2), "decoder_self", 0, 2)
    assert gated == Translator(by_hand, tok, cfg.decode, precision=precision).translate(lines, beam=4)
    t.model = model  # the hooks are gone: the full model again
    full = Translator(model, tok, cfg.decode, precision=precision).translate(lines, beam=4)
    assert t.translate(lines, beam=4) == full != gated


def test_pruned_heads_are_skipped_at_decode_time(toy_prepared):
    """Translator slices out the heads whose W^O columns are zero: fewer heads computed, the same
    logits as the zeroed model, the same translations."""
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.decode.translator import Translator
    from aiayn.models.attention import MultiHeadAttention, without_dead_heads

    model, cfg = tiny_model(60)
    zeroed_model = prune(copy.deepcopy(model), [("cross", 1, 0), ("cross", 1, 2), ("encoder_self", 0, 3)])
    slim, dead = without_dead_heads(zeroed_model)
    assert dead == 3 and without_dead_heads(model) == (model, 0)
    heads = [m.h for m in slim.modules() if isinstance(m, MultiHeadAttention)]
    assert sum(heads) == sum(m.h for m in model.modules() if isinstance(m, MultiHeadAttention)) - 3
    src, tgt = torch.randint(4, 60, (3, 7)), torch.randint(4, 60, (3, 5))
    assert torch.allclose(slim(src, tgt), zeroed_model(src, tgt), atol=1e-5)
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    lines = (toy_prepared / "valid.en.txt").read_text().splitlines()[:6]
    t = Translator(zeroed_model, tok, cfg.decode, precision="fp32")
    assert t.search_model is not zeroed_model and t.model is zeroed_model  # maps keep every head
    unsliced = Translator(model, tok, cfg.decode, precision="fp32")
    unsliced.search_model = zeroed_model
    assert t.translate(lines, beam=4) == unsliced.translate(lines, beam=4)


def test_word_attention_and_dependency_hits_by_hand():
    from aiayn.analysis.heads import dependency_hits, word_attention

    # 3 words over 5 pieces: word 0 = pieces 0-1, word 1 = piece 2, word 2 = pieces 3-4
    spans = [(0, 2), (2, 3), (3, 5)]
    w = torch.zeros(1, 5, 5)
    w[0, 0, 3], w[0, 0, 4] = 0.5, 0.5  # piece 0 -> word 2 (both its pieces)
    w[0, 1, 2] = 1.0  # piece 1 -> word 1
    w[0, 2, 0] = 1.0  # word 1 -> word 0
    w[0, 3:, 2] = 1.0  # word 2 -> word 1
    a = word_attention(w, spans)
    assert a[0].tolist() == [[0.0, 0.5, 0.5], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    # arcs: word 0 -> 2 (tied with word 1: argmax takes the first, word 1, a miss), 1 -> 0 (hit), 2 root
    hits, n = dependency_hits(a, [2, 0, -1], skip=set())
    assert (hits.tolist(), n) == ([1.0], 2)
    # self-attention names no arc: a word attending only to itself predicts some other word
    hits, n = dependency_hits(torch.eye(3)[None], [1, -1, 1], skip={2})
    assert n == 1 and hits.tolist() == [1.0]  # word 0's best other word is word 1 (ties to the first)


@pytest.mark.slow
def test_heads_command_end_to_end(toy_prepared, tmp_path, capsys, monkeypatch, caplog):
    import json
    import logging

    import aiayn
    from aiayn import device
    from aiayn.checkpoint import list_checkpoints
    from aiayn.cli import main

    run = tmp_path / "run"
    aiayn.train(tiny_config(max_steps=30, lr_scale=0.5), str(toy_prepared), str(run))
    ckpt = list_checkpoints(run)[-1]
    out = tmp_path / "heads"
    bank = tmp_path / "bank"
    bank.mkdir()
    (bank / "wsj_0160.mrg").write_text(
        "( (S (NP-SBJ (DT A) (NN man)) (VP (VBZ rides) (NP (DT a) (NN bike))) (. .)) )\n"
        "( (S (NP-SBJ (NNS Dogs)) (VP (VBP run) (PP (IN in) (NP (DT the) (NN park)))) (. .)) )\n")
    args = ["heads", "--checkpoint", str(ckpt), "--data", str(toy_prepared), "--treebank", str(bank), "-o", str(out),
            "--sentences", "5", "--bleu-sentences", "6"]
    # bad input: named, and refused before any measuring (nothing written)
    other = tmp_path / "other-vocabulary"  # another prepared folder: its ids would be read as the model's
    shutil.copytree(toy_prepared, other)
    (other / "spm.model").write_bytes((other / "spm.model").read_bytes()[:-1] + b"?")
    bad = [("--checkpoint", str(tmp_path / "none.safetensors"), "no such file"),
           ("--data", str(tmp_path), "manifest.json"), ("--treebank", str(tmp_path / "nobank.zip"), "nobank.zip"),
           ("--data", str(other), "its vocabulary is not the checkpoint's")]
    for flag, value, words in bad:
        argv = [value if i and args[i - 1] == flag else a for i, a in enumerate(args)]
        assert main(argv) != 0
        assert words in capsys.readouterr().err and not out.exists()
    assert main([*args[:-1], "0"]) != 0 and "--bleu-sentences must be at least 1" in capsys.readouterr().err
    monkeypatch.setattr(device, "cpu_flags", lambda *a, **k: {"avx2"})  # measured on an AVX2 CPU:
    with caplog.at_level(logging.INFO, logger="aiayn"):  # in its precision, not the checkpoint's
        assert main(args) == 0
    assert "measuring in fp32 (auto: the CPU has no native bf16" in caplog.text
    assert sorted(p.name for p in out.iterdir()) == [".aiayn-output.json", "examples.png", "heads.json",
                                                     "importance.png", "pruned.safetensors", "pruning.png", "roles.png"]
    r = json.loads((out / "heads.json").read_text())
    # the example maps: each sublayer's most important head by ablation, rows are distributions over the
    # keys, and the decoder's self-attention never looks ahead (§3.2.3)
    for e in r["examples"]:
        t = np.array(r["ablation"][e["sublayer"]])
        assert (e["layer"], e["head"]) == np.unravel_index(t.argmax(), t.shape)
        w = np.array(e["weights"])
        assert w.shape == (len(e["rows"]), len(e["cols"])) and np.allclose(w.sum(1), 1, atol=1e-3)
        if e["sublayer"] == "decoder_self":
            assert np.triu(w, 1).max() == 0
    assert sorted({e["sublayer"] for e in r["examples"]}) == ["cross", "decoder_self", "encoder_self"]
    # the pruned checkpoint (weights zeroed by hand) scores what the gated model scored at that step
    from aiayn.analysis.heads import eval_batches, nll_per_token
    from aiayn.checkpoint import load_checkpoint

    pruned, cfg, _, _ = load_checkpoint(out / "pruned.safetensors")
    k = r["removable_at_0.5_bleu"]["importance"]
    assert len(r["pruned_heads"]) == k
    with torch.no_grad():
        nll = float(nll_per_token(pruned.eval(), eval_batches(TokenData(toy_prepared, "valid"), cfg, part=1), cfg,
                                  torch.device("cpu")))  # the curves are measured on the odd-numbered sentences
    assert nll == pytest.approx(r["pruning"]["importance"][k]["nll"], rel=1e-4)
    assert r["pruning"]["importance"][0]["nll"] == r["valid_nll"] and "even-numbered" in r["split"]
    assert len(r["pruning"]["importance"]) == 1 + 3 * 2 * 3
    # the control: 20 random orders, each measured at the same counts of heads removed, and their median
    # within the 95 % range at each count
    counts = {str([x["removed"] for x in c]) for c in r["pruning"]["random"]}
    assert len(r["pruning"]["random"]) == 20 and len(counts) == 1
    band = r["pruning"]["random_band"]
    assert [b["removed"] for b in band] == [x["removed"] for x in r["pruning"]["random"][0]]
    assert [b["removed"] for b in band] == [4, 7, 11, 14, 18]  # five counts, the last the curve's end (3 * 2 * 3)
    assert all(b["lo"] <= b["median"] <= b["hi"] for b in band)
    assert band[-1]["hi"] > r["valid_nll"]  # one head left per attention: worse than the whole model
    printed = capsys.readouterr().out
    assert "heads removable at <= 0.5 BLEU by importance" in printed and "random orders" in printed
    assert "syntactic role" in printed
    assert main([*args, "--random-orders", "-1"]) != 0 and "--random-orders must be >= 0" in capsys.readouterr().err
    # arcs by hand (head - dependent): A->man +1, man->rides +1, a->bike +1, bike->rides -2; Dogs->run +1,
    # in->run -1, the->park +1, park->in -2; roots and the two full stops are not scored
    syn = r["syntactic"]
    assert (syn["arcs"], syn["baseline_offset"], syn["baseline_accuracy"]) == (8, 1, 5 / 8)
    assert len(r["roles"]["encoder_self"]["syntactic"]) == 2  # layers of the tiny model
    for sub in ("encoder_self", "decoder_self"):  # the share on its own token, per layer and head
        assert np.array(r["roles"][sub]["current"]).shape == (2, len(r["ablation"][sub][0]))
        assert 0 < np.array(r["roles"][sub]["current"]).min() and np.array(r["roles"][sub]["current"]).max() <= 1

    assert main(args) == 0  # its own earlier output is replaced
    foreign = tmp_path / "other"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main([*args[:-5], str(foreign), *args[-4:]]) != 0
    assert (foreign / "notes.txt").read_text() == "mine"


def test_the_pruned_checkpoint_keeps_the_models_metadata(toy_prepared, tmp_path):
    """A parser pruned by `aiayn heads` stays a parser: its task label (and a tagged parser's tagger) survive."""
    import json

    import aiayn
    from aiayn.analysis.heads_report import _save_pruned
    from aiayn.checkpoint import list_checkpoints, read_task, read_weights, save_weights
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.overrides import from_dict

    aiayn.train(tiny_config(max_steps=2), str(toy_prepared), str(tmp_path / "run"))
    tensors, meta = read_weights(list_checkpoints(tmp_path / "run")[-1])
    ckpt = tmp_path / "parser.safetensors"  # the same weights, labelled as a parse model's checkpoint is
    save_weights(ckpt, tensors, from_dict(json.loads(meta["config"])), Tokenizer.load(str(toy_prepared / "spm.model")),
                 2, {"task": "parse", "linearization": "words"})
    heads = [["encoder_self", 0, 1]]
    _save_pruned({"checkpoint": str(ckpt), "pruned_heads": heads}, tmp_path / "pruned.safetensors")
    assert read_task(tmp_path / "pruned.safetensors") == {"task": "parse", "linearization": "words"}
    pruned, extra = read_weights(tmp_path / "pruned.safetensors")
    assert json.loads(extra["extra"])["pruned_heads"] == heads
    changed = [k for k in tensors if not torch.equal(tensors[k], pruned[k])]
    assert changed == ["encoder.0.self_attn.w_o.weight"]  # the one head's W^O columns, nothing else
