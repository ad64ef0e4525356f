"""What the attention heads do, measured (Figures 3-5 beyond pictures; §3.2.2's heads one by one).

- ``HeadGates``: a gate per head on Concat(head_1..head_h) before W^O (§3.2.2): 1 keeps the head,
  0 removes it; with gradients, the gate's derivative is Michel et al. (2019)'s importance proxy.
- ``ablation_importance``: validation NLL per token with each head removed, minus the full model's.
- ``gradient_importance``: E_x |∂L/∂g_h| at g = 1 (Michel et al., 2019, §3.3), one backward pass
  per batch instead of one validation per head.
- role statistics on a head's weights (h, T, S), each defined where it is computed: positional
  (Voita et al., 2019), sink, rare-word (Voita et al., 2019), entropy.

Only the Transformer has heads; the baselines have one attention per layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor, nn

from ..config import Config
from ..data.batches import TokenData, collate, make_batches
from ..data.tokenizer import BOS, EOS, UNK
from ..device import autocast
from ..models.attention import MultiHeadAttention
from ..parsing.deps import PUNCT_TAGS, dependencies
from ..progress import bar
from ..training.loss import label_smoothed_loss

SUBLAYERS = ("encoder_self", "decoder_self", "cross")


def attention_modules(model: nn.Module) -> dict[str, list[MultiHeadAttention]]:
    """Every multi-head attention of the Transformer, by sublayer type, bottom layer first."""
    if not hasattr(model, "encoder") or not isinstance(model.encoder, nn.ModuleList):
        raise ValueError("only the Transformer has attention heads (model.arch transformer)")
    return {"encoder_self": [layer.self_attn for layer in model.encoder],
            "decoder_self": [layer.self_attn for layer in model.decoder],
            "cross": [layer.cross_attn for layer in model.decoder]}


class HeadGates:
    """One gate per head, (layers, h) per sublayer type, multiplying each head's output before W^O."""

    def __init__(self, model: nn.Module, requires_grad: bool = False):
        self.modules = attention_modules(model)
        self.gates = {name: torch.ones(len(ms), ms[0].h, requires_grad=requires_grad)
                      for name, ms in self.modules.items()}

    @contextmanager
    def applied(self) -> Iterator[HeadGates]:
        """While inside, every W^O sees its heads' outputs times their gates."""
        handles = []
        for name, ms in self.modules.items():
            for i, m in enumerate(ms):
                def gate(mod, args, name=name, i=i, d_v=m.d_v):
                    g = self.gates[name][i].repeat_interleave(d_v).to(args[0].device, args[0].dtype)
                    return (args[0] * g,)
                handles.append(m.w_o.register_forward_pre_hook(gate))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


def eval_batches(data: TokenData, cfg: Config, limit: int = 0, part: int | None = None) -> list:
    """The split's batches; `part` 0 or 1: its even- or odd-numbered sentences only (heads ranked on one
    half, the pruning curves measured on the other)."""
    idx = np.arange(len(data)) if part is None else np.arange(part, len(data), 2)
    out = make_batches(data.src_lens[idx], data.tgt_lens[idx], cfg.data.max_tokens, 0, 0)
    return [collate(data, idx[b]) for b in (out[:limit] if limit else out)]


def nll_per_token(model: nn.Module, batches: list, cfg: Config, device: torch.device) -> Tensor:
    """NLL per target token over the batches (a graph when gradients are on)."""
    total, tokens = 0.0, 0
    for b in batches:
        b = b.to(device)
        with autocast(device, cfg.train.precision):
            logits = model(b.src, b.tgt_in)
        nll, _, n = label_smoothed_loss(logits, b.tgt_out, 0.0, cfg.model.pad_id)  # ε = 0: the loss is the NLL
        total, tokens = total + nll, tokens + n
    return total / max(tokens, 1)


@torch.no_grad()
def ablation_importance(model: nn.Module, data: TokenData, cfg: Config, device: torch.device,
                        batches: int = 0, part: int | None = None) -> tuple[float, dict[str, Tensor]]:
    """The full model's validation NLL and, per sublayer type, (layers, h) NLL increases when that
    one head is removed (gate 0); on half the sentences with `part` (eval_batches)."""
    model.eval()
    bs = eval_batches(data, cfg, batches, part)
    gates = HeadGates(model)
    with gates.applied():
        base = float(nll_per_token(model, bs, cfg, device))
        out = {}
        shown = bar(sum(g.numel() for g in gates.gates.values()), "head", "removing each head in turn")
        for name, g in gates.gates.items():
            delta = torch.zeros_like(g)
            for i in range(g.size(0)):
                for j in range(g.size(1)):
                    g[i, j] = 0.0
                    delta[i, j] = float(nll_per_token(model, bs, cfg, device)) - base
                    g[i, j] = 1.0
                    shown.update(1)
            out[name] = delta
        shown.close()
    return base, out


def gradient_importance(model: nn.Module, data: TokenData, cfg: Config, device: torch.device,
                        batches: int = 0, part: int | None = None) -> dict[str, Tensor]:
    """Michel et al. (2019): I_h = E_batches |∂L/∂g_h| at every gate 1, L the NLL per token."""
    model.eval()
    gates = HeadGates(model, requires_grad=True)
    total = {name: torch.zeros_like(g) for name, g in gates.gates.items()}
    bs = eval_batches(data, cfg, batches, part)
    with gates.applied(), torch.enable_grad():
        for b in bs:
            grads = torch.autograd.grad(nll_per_token(model, [b], cfg, device), list(gates.gates.values()))
            for name, gr in zip(gates.gates, grads):
                total[name] += gr.abs()
    return {name: t / max(len(bs), 1) for name, t in total.items()}


# -- roles: statistics of one sentence's weights w (h, T, S) ------------------------------------
def positional(w: Tensor, offset: int) -> Tensor:
    """Mean attention of query i on key i + offset (0: its own token, −1: the previous, +1: the next), over the
    queries that have such a key; (h,). Self-attention only (T = S)."""
    T = w.size(-2)
    i = torch.arange(max(0, -offset), min(T, T - offset))
    return w[:, i, i + offset].mean(-1)


def sink(w: Tensor, keys: Tensor, sink_ids: set[int]) -> Tensor:
    """Mean attention mass on sink tokens (EOS, sentence punctuation) per query; (h,)."""
    on = torch.tensor([int(t) in sink_ids for t in keys], dtype=w.dtype)
    return (w * on).sum(-1).mean(-1)


def rare_word(w: Tensor, keys: Tensor, freq: dict[int, int], skip: set[int] = frozenset()) -> Tensor:
    """Mean attention on the sentence's least frequent key token (Voita et al., 2019), sinks
    skipped; (h,)."""
    candidates = [j for j, t in enumerate(keys.tolist()) if t not in skip]
    j = min(candidates, key=lambda j: (freq.get(int(keys[j]), 0), j))
    return w[:, :, j].mean(-1)


def entropy(w: Tensor) -> Tensor:
    """Mean entropy (nats) of each query's attention distribution; (h,). Uniform over S keys: ln S."""
    p = w.clamp_min(1e-12)
    return -(w * p.log()).sum(-1).mean(-1)


def max_entropy(S: int) -> float:
    return math.log(S)


def alignment_agreement(w: Tensor, others: Tensor) -> Tensor:
    """Share of queries whose most-attended key is the one the other layers' mean attention picks
    (cross-attention's agreement on an alignment); w (h, T, S), others (T, S); (h,)."""
    return (w.argmax(-1) == others.argmax(-1)).float().mean(-1)


# -- roles over sentences, and pruning --------------------------------------------------------
ROLES = {"encoder_self": ("current", "previous", "next", "sink", "rare_word", "entropy"),
         "decoder_self": ("current", "previous", "sink", "rare_word", "entropy"),
         "cross": ("sink", "rare_word", "entropy", "agreement")}


def _sublayer_roles(name: str, w: Tensor, keys: Tensor, others: Tensor | None, facts: dict) -> dict[str, Tensor]:
    """Every role statistic of one sublayer's weights w (h, T, S) on one sentence; keys (S,)."""
    freq = facts["src_freq"] if name != "decoder_self" else facts["tgt_freq"]
    out = {"sink": sink(w, keys, facts["sinks"]), "entropy": entropy(w),
           "rare_word": rare_word(w, keys, freq, facts["sinks"] | {BOS})}
    if name != "cross":
        out["current"] = positional(w, 0)
        out["previous"] = positional(w, -1)
    if name == "encoder_self":
        out["next"] = positional(w, 1)
    if name == "cross" and others is not None:
        out["agreement"] = alignment_agreement(w, others)
    return out


@torch.no_grad()
def role_table(model: nn.Module, data: TokenData, facts: dict, sentences: int = 200) -> dict[str, dict[str, Tensor]]:
    """Mean role statistics per head, (layers, h) per sublayer type and role, over the first
    `sentences` pairs, one at a time (no padding), teacher-forced on the reference. `facts`:
    sinks (ids of EOS and sentence punctuation), src_freq and tgt_freq (training counts per id)."""
    model.eval()
    sums: dict[str, dict[str, Tensor]] = {}
    n = min(sentences, len(data))
    for i in range(n):
        b = collate(data, [i])
        _, maps = model.attention_maps(b.src, b.tgt_in)
        per = {"encoder_self": (maps.encoder_self, b.src[0]), "decoder_self": (maps.decoder_self, b.tgt_in[0]),
               "cross": (maps.cross, b.src[0])}
        for name, (layers, keys) in per.items():
            ws = [layer[0].float() for layer in layers]  # each (h, T, S)
            for li, w in enumerate(ws):
                others = None
                if name == "cross" and len(ws) > 1:
                    others = torch.stack([x.mean(0) for j, x in enumerate(ws) if j != li]).mean(0)
                for role, v in _sublayer_roles(name, w, keys, others, facts).items():
                    table = sums.setdefault(name, {}).setdefault(role, torch.zeros(len(ws), w.size(0)))
                    table[li] += v
    return {name: {role: t / max(n, 1) for role, t in roles.items()} for name, roles in sums.items()}


def prune_order(scores: dict[str, Tensor]) -> list[tuple[str, int, int]]:
    """Every head as (sublayer, layer, head), least important first; ties by position."""
    heads = [(float(t[i, j]), name, i, j) for name, t in scores.items()
             for i in range(t.size(0)) for j in range(t.size(1))]
    return [(name, i, j) for _, name, i, j in sorted(heads, key=lambda x: (x[0], SUBLAYERS.index(x[1]), x[2], x[3]))]


@torch.no_grad()
def prune(model: nn.Module, heads: list[tuple[str, int, int]]) -> nn.Module:
    """Remove heads for good: zero their input columns of W^O (what a gate of 0 does), in place."""
    mods = attention_modules(model)
    for name, i, j in heads:
        m = mods[name][i]
        m.w_o.weight[:, j * m.d_v:(j + 1) * m.d_v] = 0.0
    return model


def pruning_curve(model: nn.Module, order: list[tuple[str, int, int]], evaluate,
                  at: set[int] | None = None) -> list[dict]:
    """Remove heads in `order`, skipping any that is the last of its attention module (one head per
    sublayer stays); before the first and after each removal (or only at the counts in `at`),
    `evaluate()` (with the gates applied) gives the scores. Returns one row per evaluation: heads
    removed so far, the last head removed, and the scores."""
    gates = HeadGates(model)
    rows, removed = [], 0
    with gates.applied():
        if at is None or 0 in at:
            rows.append({"removed": 0, "head": None, **evaluate()})
        for name, i, j in order:
            g = gates.gates[name][i]
            if int(g.sum()) <= 1:
                continue
            g[j] = 0.0
            removed += 1
            if at is None or removed in at:
                rows.append({"removed": removed, "head": [name, i, j], **evaluate()})
    return rows


def random_band(curves: list[list[dict]], key: str = "nll") -> list[dict]:
    """The random orders' control at each count of heads removed: median and the 2.5-97.5 % range."""
    out = []
    for rows in zip(*curves):
        v = np.array([r[key] for r in rows])
        out.append({"removed": rows[0]["removed"], "median": float(np.median(v)),
                    "lo": float(np.percentile(v, 2.5)), "hi": float(np.percentile(v, 97.5))})
    return out


# -- the syntactic role: encoder self-attention against dependency arcs ---------------------------
_PTB_TEXT = {"-LRB-": "(", "-RRB-": ")", "-LCB-": "{", "-RCB-": "}", "``": '"', "''": '"'}


def word_attention(w: Tensor, spans: list[tuple[int, int]]) -> Tensor:
    """Subword attention w (h, T, S) to word attention (h, n, n): the mean over a word's query
    pieces of the sum over each word's key pieces (Clark et al., 2019)."""
    rows = torch.stack([w[:, a:b].mean(1) for a, b in spans], 1)  # (h, n, S)
    return torch.stack([rows[:, :, a:b].sum(-1) for a, b in spans], -1)


def dependency_hits(attn: Tensor, heads: list[int], skip: set[int]) -> tuple[Tensor, int]:
    """Per attention head, the dependents (root and `skip` left out) whose most-attended other word
    is their syntactic head; and how many dependents were scored. attn (h, n, n)."""
    n = attn.size(-1)
    a = attn.clone()
    a[:, torch.arange(n), torch.arange(n)] = -1.0  # a word attending to itself names no arc
    deps = [d for d, g in enumerate(heads) if g >= 0 and d not in skip]
    if not deps:
        return torch.zeros(attn.size(0)), 0
    pred = a.argmax(-1)[:, deps]
    return (pred == torch.tensor([heads[d] for d in deps])).float().sum(-1), len(deps)


@torch.no_grad()
def syntactic_agreement(model: nn.Module, tokenizer, trees: list, max_subwords: int = 120) -> dict:
    """Encoder self-attention (English source) against dependency arcs from head rules (deps.py):
    per (layer, head), the share of dependents whose most-attended other word is their syntactic
    head; beside it the best fixed-offset guess (always the word k positions away) on the same arcs.
    Punctuation dependents are not scored; words are encoded one by one, so spans are exact."""

    model.eval()
    hits, total, offsets = None, 0, {}
    for tree in trees:
        tagged, heads = tree.tagged(), dependencies(tree)
        spans, ids = [], []
        for word, _ in tagged:
            pieces = tokenizer.encode([_PTB_TEXT.get(word, word)])[0] or [UNK]
            spans.append((len(ids), len(ids) + len(pieces)))
            ids += pieces
        if len(ids) + 1 > max_subwords:
            continue
        _, _, maps = model.encode(torch.tensor([ids + [EOS]]), need_weights=True)
        skip = {i for i, (_, tag) in enumerate(tagged) if tag in PUNCT_TAGS}
        per_layer = [dependency_hits(word_attention(w[0].float(), spans), heads, skip) for w in maps]
        layer_hits = torch.stack([k for k, _ in per_layer])
        hits = layer_hits if hits is None else hits + layer_hits
        total += per_layer[0][1]
        for d, g in enumerate(heads):
            if g >= 0 and d not in skip:
                offsets[g - d] = offsets.get(g - d, 0) + 1
    if not total:
        raise ValueError("no tree fits: every sentence is longer than the model's subword limit")
    best = max(offsets, key=offsets.get)
    return {"accuracy": hits / total, "arcs": total, "sentences": len(trees),
            "baseline_offset": best, "baseline_accuracy": offsets[best] / total}
