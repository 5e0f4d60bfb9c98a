"""``--compile``: one BLOOM block compiled once and reused by every block; the LM head and loss compiled apart.

Why per block (torchtitan's regional compilation): compiling the whole model
traces all its blocks as one graph, so compile time grows with depth (on an
H200, ``seqgpt-560m``'s 24 blocks had not compiled after 120 s) and one graph
break splits the whole model. Every BLOOM block runs the same code, and dynamo
makes a module's parameters inputs of its graph, so the graph compiled for the
first block serves them all: compile time stays that of one block
(tests/test_compile.py counts one compilation for ``small``'s four blocks).

How: every block's class becomes one subclass whose forward is one shared compiled function of the
block class's forward, used when a block trains (grad enabled, ``training``);
evaluation and generation run the same weights uncompiled, so a no-grad
forward or a decoding step's new shapes never trigger a compilation. The LM
head and the loss (``models/loss.py``) are compiled as their own function, with
dynamic sizes, since the number of labeled positions changes every step.
Model code is untouched: parameters and ``state_dict`` keys are the same (only the blocks' class is a
subclass, as the attention's is), so DDP and the checkpoints see the model they always saw.

Older torch: before 2.12, dynamo compiles the head + loss as two graphs, not one
(benchmarks/check_compat.py records the count per torch in its artifact). The
step is as correct, with less of it fused, so ``--compile`` says so once per
process (rank 0) rather than refusing: :func:`note_head_loss_graphs`.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

import torch
from torch import nn
from transformers.models.bloom.modeling_bloom import BloomBlock

from ecomkit.config.vocabulary import COMPILE_MODES
from ecomkit.dist import read_torchrun_env
from ecomkit.models.loss import head_loss_sum

log = logging.getLogger("ecomkit")

# The first torch that compiles the head + loss as one graph; earlier releases make two of it (measured per
# torch by benchmarks/check_compat.py; tests/test_compat_floors.py holds this to its newest artifact).
HEAD_LOSS_ONE_GRAPH_TORCH = (2, 12)
_noted: set[str] = set()


def torch_release(version: str | None = None) -> tuple[int, int]:
    """``2.11.0+cu128`` → (2, 11); this process's torch when ``version`` is None."""
    major, minor = re.findall(r"\d+", (version or torch.__version__).split("+")[0])[:2]
    return int(major), int(minor)


def head_loss_graphs(version: str | None = None) -> int:
    """How many graphs ``torch.compile`` makes of the head + loss on this torch: 1, or 2 before 2.12."""
    return 1 if torch_release(version) >= HEAD_LOSS_ONE_GRAPH_TORCH else 2


def note_head_loss_graphs(version: str | None = None) -> bool:
    """Warn once per process, on rank 0, where this torch compiles the head + loss as two graphs; True if it did.

    Why a note and not a refusal: the two graphs compute the same loss (the smoke set's DDP, LoRA and packing
    checks pass on such a torch); only the fusion across their boundary is lost, which costs speed.
    """
    version = version or torch.__version__
    if head_loss_graphs(version) == 1 or version in _noted:
        return False
    _noted.add(version)
    if read_torchrun_env()[0] != 0:
        return False
    wanted = ".".join(map(str, HEAD_LOSS_ONE_GRAPH_TORCH))
    log.warning(f"--compile on torch {version}: the LM head and loss compile as two graphs (one from torch {wanted}), "
                f"so less of each step is fused and it runs slower than it could; the results are the same. "
                f"For the full speed-up, install torch>={wanted} (docs/gpu.md).")
    return True


def compiled(fn: Callable, mode: str = "default", dynamic: bool | None = None, **kw: Any) -> Callable:
    """``torch.compile(fn)`` with ecomkit's ``--compile-mode`` (``default`` passes no mode)."""
    return torch.compile(fn, mode=None if mode == "default" else mode, dynamic=dynamic, **kw)


def compile_blocks(model: nn.Module, mode: str = "default", dynamic: bool | None = None, **kw: Any) -> int:
    """Give every BLOOM block of ``model`` the one compiled forward (when it trains); returns how many blocks.

    ``dynamic``: ``False`` for batches of one shape (packed sequences), ``True`` for lengths that change
    (bucketed rows), so that neither compiles twice. ``kw`` goes to ``torch.compile`` (a test's backend).
    """
    blocks = [m for m in model.modules() if isinstance(m, BloomBlock)]
    if blocks:
        compiled_class = compiled_block_class(type(blocks[0]), compiled(type(blocks[0]).forward, mode, dynamic, **kw))
        for block in blocks:
            block.__class__ = compiled_class
    return len(blocks)


def compiled_block_class(block_class: type, fast: Callable) -> type:
    """A subclass of ``block_class`` whose forward is ``fast`` while it trains (grad enabled), its own otherwise."""
    plain = block_class.forward

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.training and torch.is_grad_enabled():
            return fast(self, *args, **kwargs)
        return plain(self, *args, **kwargs)

    return type(f"Compiled{block_class.__name__}", (block_class,), {"forward": forward, "__module__": __name__})


def compiled_head_loss(mode: str = "default", **kw: Any) -> Callable:
    """The chunked loss's head + loss function compiled with dynamic sizes (its row count changes every step)."""
    note_head_loss_graphs()
    return compiled(head_loss_sum, mode, dynamic=True, **kw)


__all__ = ["COMPILE_MODES", "HEAD_LOSS_ONE_GRAPH_TORCH", "compile_blocks", "compiled", "compiled_head_loss",
           "head_loss_graphs", "note_head_loss_graphs", "torch_release"]
