"""--compile compiles one BLOOM block for every block, and the head + loss apart (fast/compile.py).

Counted with dynamo's frame counter (the ``eager`` backend: the graphs and guards inductor would get, without
its code generation). The losses of compiled training against eager training are checked under DDP by
``tests/test_train_ddp.py::test_compiled_ddp_matches_one_eager_process`` (inductor, the real path).
"""

from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounter

from ecomkit.fast import compile as compile_module
from ecomkit.fast.attention import install_attention
from ecomkit.models.attention import attention_mask_for
from ecomkit.models.bloom import build_model
from ecomkit.fast.compile import (HEAD_LOSS_ONE_GRAPH_TORCH, compile_blocks, compiled_head_loss, head_loss_graphs,
                                    note_head_loss_graphs)
from ecomkit.models.loss import TokenLoss, lm_loss_sum
from ecomlab.measure.packing import packed_batch, random_rows

VOCAB, PAD = 400, 3


def step(model, loss_fn: TokenLoss, seed: int, train: bool = True) -> torch.Tensor:
    b = packed_batch(random_rows(24, VOCAB, seed=seed, prompted=seed % 2 == 1), 128, PAD)
    b = {k: v[:2] for k, v in b.items()}                   # two sequences of 128: one shape, as packing gives
    with torch.set_grad_enabled(train):
        loss = lm_loss_sum(model, loss_fn, b["input_ids"], attention_mask_for(b), b["labels"])
    if train:
        loss.backward()
    return loss.detach()


def test_every_block_shares_one_compilation_and_evaluation_runs_uncompiled():
    torch._dynamo.reset()
    blocks, head = CompileCounter(), CompileCounter()
    model = build_model("small", vocab_size=VOCAB)          # 4 blocks
    install_attention(model, "sdpa")
    compiled_loss = TokenLoss("chunked", 64, head_loss=compiled_head_loss(backend=head))
    reference = build_model("small", vocab_size=VOCAB)
    install_attention(reference, "sdpa")
    assert compile_blocks(model, dynamic=False, backend=blocks) == 4
    for seed in range(4):     # the steps label different numbers of positions (LM and prompted rows)
        assert torch.allclose(step(model, compiled_loss, seed), step(reference, TokenLoss("chunked", 64), seed),
                              rtol=1e-6)
    assert blocks.frame_count == 1, blocks.frame_count    # one block's graph, compiled once, for all four
    heads = head_loss_graphs()                            # the head + loss: dynamic sizes, compiled once
    assert head.frame_count == heads, head.frame_count    # (as one graph from torch 2.12, two before)
    model.eval()
    step(model, compiled_loss, 9, train=False)            # evaluation: the same weights, uncompiled
    assert (blocks.frame_count, head.frame_count) == (1, heads)
    torch._dynamo.reset()


def test_a_torch_that_compiles_the_head_and_loss_in_two_graphs_is_noted_once_on_rank_0(monkeypatch):
    """An older torch runs --compile correctly with the head + loss as two graphs: a speed note, said once."""
    major, minor = HEAD_LOSS_ONE_GRAPH_TORCH
    older, first = f"{major}.{minor - 1}.0+cu126", f"{major}.{minor}.0"
    said: list[str] = []
    monkeypatch.setattr(compile_module, "_noted", set())
    monkeypatch.setattr(compile_module.log, "warning", said.append)
    monkeypatch.delenv("RANK", raising=False)
    assert [head_loss_graphs(v) for v in (older, first, f"{major}.{minor + 1}.0+cpu", "3.0.0")] == [2, 1, 1, 1]
    assert note_head_loss_graphs(older) and not note_head_loss_graphs(older)            # once a process
    assert len(said) == 1 and "two graphs" in said[0] and f"torch>={major}.{minor}" in said[0] and older in said[0]
    assert not note_head_loss_graphs(first) and not note_head_loss_graphs("3.0.0")      # one graph: silent
    monkeypatch.setenv("RANK", "1")
    assert not note_head_loss_graphs(f"{major}.{minor - 2}.0") and len(said) == 1       # rank 0 only
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(compile_module, "_noted", set())
    monkeypatch.setattr(compile_module.torch, "__version__", older)
    compiled_head_loss()                                  # what --compile calls (ecomkit/fast/__init__.py)
    assert len(said) == 2 and f"torch {older}" in said[1]
