"""``--compile``: one BLOOM block compiled once and reused by every block; the LM head and loss compiled apart.

Why per block (torchtitan's regional compilation): compiling the whole model
traces all its blocks as one graph, so compile time grows with depth (on an
H200, ``seqgpt-560m``'s 24 blocks had not compiled after 120 s) and one graph
break splits the whole model. Every BLOOM block runs the same code, and dynamo
makes a module's parameters inputs of its graph, so the graph compiled for the
first block serves them all: compile time stays that of one block
(tests/test_compile.py counts one compilation for ``small``'s four blocks).

How: every block's ``forward`` becomes one shared compiled function of the
block class's forward, used when a block trains (grad enabled, ``training``);
evaluation and generation run the same weights uncompiled, so a no-grad
forward or a decoding step's new shapes never trigger a compilation. The LM
head and the loss (``models/loss.py``) are compiled as their own function, with
dynamic sizes, since the number of labeled positions changes every step.
Model code is untouched: the block class, parameters and ``state_dict`` keys are
the same, so DDP and the checkpoints see the model they always saw.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch
from torch import nn
from transformers.models.bloom.modeling_bloom import BloomBlock

from ecomkit.config.vocabulary import COMPILE_MODES
from ecomkit.models.loss import head_loss_sum



def compiled(fn: Callable, mode: str = "default", dynamic: bool | None = None, **kw: Any) -> Callable:
    """``torch.compile(fn)`` with ecomkit's ``--compile-mode`` (``default`` passes no mode)."""
    return torch.compile(fn, mode=None if mode == "default" else mode, dynamic=dynamic, **kw)


def compile_blocks(model: nn.Module, mode: str = "default", dynamic: bool | None = None, **kw: Any) -> int:
    """Give every BLOOM block of ``model`` the one compiled forward (when it trains); returns how many blocks.

    ``dynamic``: ``False`` for batches of one shape (packed sequences), ``True`` for lengths that change
    (bucketed rows), so that neither compiles twice. ``kw`` goes to ``torch.compile`` (a test's backend).
    """
    blocks = [m for m in model.modules() if isinstance(m, BloomBlock)]
    if not blocks:
        return 0
    plain = type(blocks[0]).forward
    fast = compiled(plain, mode, dynamic, **kw)

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.training and torch.is_grad_enabled():
            return fast(self, *args, **kwargs)
        return plain(self, *args, **kwargs)

    for block in blocks:
        block.forward = types.MethodType(forward, block)
    return len(blocks)


def compiled_head_loss(mode: str = "default", **kw: Any) -> Callable:
    """The chunked loss's head + loss function compiled with dynamic sizes (its row count changes every step)."""
    return compiled(head_loss_sum, mode, dynamic=True, **kw)


__all__ = ["COMPILE_MODES", "compile_blocks", "compiled", "compiled_head_loss"]
