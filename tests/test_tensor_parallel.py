"""BLOOM's fused QKV layout and the ALiBi slice the tensor-parallel plan relies on (one process)."""

from __future__ import annotations

import torch

from ecomkit.models.bloom import build_model, preset_config
from ecomkit.parallel.tensor import slice_alibi_to_local_heads


def test_contiguous_qkv_chunks_hold_whole_heads_with_their_q_k_v():
    """Feature f of query_key_value belongs to head f // (3·d): chunk r of 3h holds heads r·H/tp … only."""
    n_head, head_dim, tp = 4, 16, 2
    hidden = n_head * head_dim
    features = torch.arange(3 * hidden)
    # BLOOM's _reshape views the last dim as (heads, 3, head_dim)
    as_heads = features.view(n_head, 3, head_dim)
    head_of = {int(f): h for h in range(n_head) for f in as_heads[h].flatten()}
    which_qkv = {int(f): k for h in range(n_head) for k in range(3) for f in as_heads[h, k]}
    for r, chunk in enumerate(features.chunk(tp)):
        heads = sorted({head_of[int(f)] for f in chunk})
        assert heads == list(range(r * n_head // tp, (r + 1) * n_head // tp))
        assert {which_qkv[int(f)] for f in chunk} == {0, 1, 2}  # q, k and v of those heads


def test_local_heads_of_the_split_layer_equal_the_full_layer():
    """Rank r's rows of query_key_value, run through BLOOM's own _reshape with num_heads=H/tp, give heads r·H/tp…"""
    cfg = preset_config("tiny", 100)
    attn = build_model(cfg, seed=0).transformer.h[0].self_attention
    x = torch.randn(2, 5, cfg.hidden_size)
    q_full, k_full, v_full = attn._reshape(attn.query_key_value(x))  # [b, H, T, d]
    tp, local = 2, cfg.n_head // 2
    rows = attn.query_key_value.weight.shape[0] // tp
    for r in range(tp):
        w = attn.query_key_value.weight[r * rows:(r + 1) * rows]
        b = attn.query_key_value.bias[r * rows:(r + 1) * rows]
        attn.num_heads = local
        q, k, v = attn._reshape(torch.nn.functional.linear(x, w, b))
        attn.num_heads = cfg.n_head
        heads = slice(r * local, (r + 1) * local)
        for got, full in ((q, q_full), (k, k_full), (v, v_full)):
            torch.testing.assert_close(got, full[:, heads])


def test_alibi_slice_matches_the_heads_of_the_full_bias():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    n_head = 8
    full = build_alibi_tensor(mask, n_head, torch.float32)  # [b·H, 1, T]
    local = slice_alibi_to_local_heads(full, n_head, first=4, count=4)
    assert local.shape == (2 * 4, 1, 4)
    torch.testing.assert_close(local.view(2, 4, 1, 4), full.view(2, 8, 1, 4)[:, 4:8])

