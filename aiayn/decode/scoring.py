"""A given translation's score under the model, force-decoded (not in the paper; Marian's and
CTranslate2's `score`): one teacher-forced pass gives log p(y | x) = Σ log p(y_t | y_<t, x) over
the translation's subwords and the end of sentence, the quantity beam search ranks by once divided
by §6.1's length penalty lp(|Y|) (GNMT, α), so a search's own output scores what the search said.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.tokenizer import BOS, EOS, PAD
from .beams import length_penalty


@dataclass
class ForcedScore:
    """One translation's log-probability: in total, per subword (its subwords and EOS), and divided
    by lp(|Y|) at α as beam search ranks it (|Y| counting EOS)."""

    total: float
    per_subword: float
    normalized: float
    subwords: int  # the translation's subwords, EOS not counted


@torch.no_grad()
def force_decoded(model: torch.nn.Module, src: list[list[int]], tgt: list[list[int]], alpha: float,
                  batch_tokens: int = 4096) -> list[ForcedScore]:
    """Each (source ids with EOS, target ids without BOS/EOS) pair's score under `model` (its forward:
    src (B, S), decoder input (B, T) -> logits (B, T, V)), batched by length; a pair with an empty
    source scores -inf (nothing to translate from)."""
    device = next(model.parameters()).device
    out: list[ForcedScore | None] = [None] * len(src)
    order = sorted((i for i in range(len(src)) if src[i]), key=lambda i: (len(src[i]), len(tgt[i])))
    start = 0
    while start < len(order):
        end, longest = start, 0
        while end < len(order):
            i = order[end]
            longest = max(longest, len(src[i]), len(tgt[i]) + 1)
            if end > start and longest * (end - start + 1) > batch_tokens:
                break
            end += 1
        ks = order[start:end]
        S, T = max(len(src[k]) for k in ks), max(len(tgt[k]) for k in ks) + 1
        s = torch.full((len(ks), S), PAD, dtype=torch.long)
        y_in = torch.full((len(ks), T), PAD, dtype=torch.long)
        y_out = torch.full((len(ks), T), PAD, dtype=torch.long)
        for r, k in enumerate(ks):
            s[r, :len(src[k])] = torch.tensor(src[k], dtype=torch.long)
            y_in[r, :len(tgt[k]) + 1] = torch.tensor([BOS] + tgt[k], dtype=torch.long)
            y_out[r, :len(tgt[k]) + 1] = torch.tensor(tgt[k] + [EOS], dtype=torch.long)
        logp = torch.log_softmax(model(s.to(device), y_in.to(device)).float(), dim=-1).cpu()
        picked = logp.gather(2, y_out[:, :, None])[:, :, 0].masked_fill(y_out == PAD, 0.0)
        for r, k in enumerate(ks):
            total, n = float(picked[r].sum()), len(tgt[k]) + 1
            out[k] = ForcedScore(total, total / n, total / float(length_penalty(n, alpha)), n - 1)
        start = end
    return [x if src[i] else ForcedScore(float("-inf"), float("-inf"), float("-inf"), len(tgt[i]))
            for i, x in enumerate(out)]
