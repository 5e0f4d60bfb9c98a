"""How many graphs ``--compile`` makes of a packed training step, step by step: the blocks and the head + loss.

Why measured here, once: the same count is a correctness check for the test suite (no recompilation after
the first step: one shape every step) and a speed note for ``benchmarks/check_compat.py`` (how many graphs
the head + loss becomes on each torch: one from 2.12, two before, see ``fast/compile.py``). Dynamo's
``CompileCounter`` backend counts graphs and guards without generating code, so this runs in seconds on a CPU.
"""

from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounter

from ecomkit.fast.attention import install_attention
from ecomkit.fast.compile import compile_blocks, compiled_head_loss
from ecomkit.models.attention import attention_mask_for
from ecomkit.models.bloom import build_model
from ecomkit.models.loss import TokenLoss, lm_loss_sum
from ecomlab.measure.packing import packed_batch, random_rows

VOCAB, SEQ_LEN, PAD = 400, 96, 3


def packed_step_graphs(steps: int = 5) -> list[tuple[int, int]]:
    """(block graphs, head + loss graphs) compiled so far, after each of ``steps`` packed training steps.

    The steps differ in how rows are laid out and how many positions are labeled (the chunked loss keeps only
    those) but not in shape: two packed sequences of 96. Compiled as the loop compiles: the blocks with static
    shapes, the head + loss with dynamic row counts.
    """
    torch._dynamo.reset()
    blocks, head = CompileCounter(), CompileCounter()
    model = build_model("tiny", vocab_size=VOCAB)
    install_attention(model, "sdpa")
    loss_fn = TokenLoss("chunked", 64, head_loss=compiled_head_loss(backend=head))
    compile_blocks(model, dynamic=False, backend=blocks)
    counts = []
    try:
        for step in range(steps):
            rows = random_rows(12, VOCAB, seed=step, prompted=step % 2 == 1)
            batch = {k: v[:2] for k, v in packed_batch(rows, SEQ_LEN, PAD).items()}
            loss = lm_loss_sum(model, loss_fn, batch["input_ids"], attention_mask_for(batch), batch["labels"])
            loss.backward()
            counts.append((blocks.frame_count, head.frame_count))
    finally:
        torch._dynamo.reset()
    return counts


__all__ = ["packed_step_graphs"]
