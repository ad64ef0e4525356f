"""Eq. 1 and §3.2.2 against a direct implementation."""

import math

import torch

from aiayn.models.attention import MultiHeadAttention, attention


def reference_attention(q, k, v, mask=None):
    """softmax(Q Kᵀ / √d_k) V, written out loop-free but without any library attention."""
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(-1e30, dtype=scores.dtype))
    w = torch.exp(scores - scores.max(-1, keepdim=True).values)
    w = w / w.sum(-1, keepdim=True)
    return torch.einsum("bhts,bhsd->bhtd", w, v), w


def test_attention_matches_formula_with_padding_mask():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 6)
    lengths = torch.tensor([7, 4])
    mask = (torch.arange(7)[None, :] < lengths[:, None])[:, None, None, :]
    ref, ref_w = reference_attention(q, k, v, mask)
    fast, none = attention(q, k, v, mask, kernel="sdpa")
    explicit, _ = attention(q, k, v, mask, kernel="explicit")
    torch.testing.assert_close(explicit, ref, atol=1e-5, rtol=1e-5)
    slow, w = attention(q, k, v, mask, need_weights=True)
    assert none is None
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(slow, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    assert torch.all(w[1, :, :, 4:] == 0)  # padded keys get no weight


def test_causal_paths_agree_and_match_formula():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    ref, ref_w = reference_attention(q, k, v, causal)
    fast, _ = attention(q, k, v, causal=True, kernel="sdpa")
    slow, w = attention(q, k, v, causal=True, need_weights=True)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(slow, ref, atol=1e-5, rtol=1e-5)
    assert torch.all(w.triu(1) == 0)


def test_explicit_causal_with_fewer_queries_than_keys():
    # Incremental decoding: the last query attends to every key.
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    out, w = attention(q, k, v, causal=True, need_weights=True)
    ref, _ = reference_attention(q, k, v)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


def test_multi_head_equals_per_head_concat():
    """§3.2.2: Concat(head_1..head_h) W^O with per-head projections, computed head by head."""
    torch.manual_seed(3)
    d_model, h, d_k, d_v = 12, 3, 5, 7  # d_k, d_v set separately (Table 3 rows A/B)
    mha = MultiHeadAttention(d_model, h, d_k, d_v)
    x, mem = torch.randn(2, 4, d_model), torch.randn(2, 6, d_model)
    k, v = mha.project_kv(mem)
    out, w = mha(x, k, v, need_weights=True)
    heads = []
    for i in range(h):
        Wq = mha.w_q.weight[i * d_k:(i + 1) * d_k]
        bq = mha.w_q.bias[i * d_k:(i + 1) * d_k]
        Wk = mha.w_k.weight[i * d_k:(i + 1) * d_k]
        bk = mha.w_k.bias[i * d_k:(i + 1) * d_k]
        Wv = mha.w_v.weight[i * d_v:(i + 1) * d_v]
        bv = mha.w_v.bias[i * d_v:(i + 1) * d_v]
        qi, ki, vi = x @ Wq.T + bq, mem @ Wk.T + bk, mem @ Wv.T + bv
        a = torch.softmax(qi @ ki.transpose(1, 2) / math.sqrt(d_k), -1)
        heads.append(a @ vi)
    ref = torch.cat(heads, -1) @ mha.w_o.weight.T + mha.w_o.bias
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    fast, _ = mha(x, k, v)
    torch.testing.assert_close(fast, out, atol=1e-5, rtol=1e-5)
    assert w.shape == (2, h, 4, 6)


def test_a_module_told_its_attention_path_takes_it_and_computes_the_same():
    """`MultiHeadAttention`'s kernel (model.attention; bench/gpu/gpu.py times both on a GPU): SDPA and Eq. 1
    written out give the same outputs and gradients; the module really calls the path it is told."""
    from unittest import mock

    import aiayn.models.attention as mod

    torch.manual_seed(2)
    x, mask = torch.randn(3, 9, 16), (torch.arange(9)[None, :] < torch.tensor([9, 5, 2])[:, None])[:, None, None, :]
    outs, grads = [], []
    for use_sdpa in (True, False):
        torch.manual_seed(3)
        m = MultiHeadAttention(16, 4, 4, 4, kernel="sdpa" if use_sdpa else "explicit")
        k, v = m.project_kv(x)
        with mock.patch.object(mod.F, "scaled_dot_product_attention", wraps=mod.F.scaled_dot_product_attention) as f:
            out, _ = m(x, k, v, mask, causal=True)
        assert f.called == use_sdpa
        out.square().sum().backward()
        outs.append(out)
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-4, rtol=1e-4)


def test_sdpa_with_a_mask_and_causal_stays_causal_and_aligns_fewer_queries_to_the_last_keys():
    """SDPA's is_causal is ignored beside a mask and aligns top-left when T < S; both paths must agree with
    Eq. 1 under the combined mask (the last query sees every key)."""
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    pad = (torch.arange(6)[None, :] < torch.tensor([6, 5])[:, None])[:, None, None, :]
    for mask in (None, pad):
        future = torch.ones(3, 6, dtype=torch.bool).tril(3)
        ref, _ = reference_attention(q, k, v, future if mask is None else mask & future)
        for use_sdpa in (True, False):
            out, _ = attention(q, k, v, mask, causal=True, kernel="sdpa" if use_sdpa else "explicit")
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
