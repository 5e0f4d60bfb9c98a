"""``--compile``: one BLOOM block compiled once and reused by every block; the LM head and loss compiled apart.

Why per block (torchtitan's regional compilation): the blocks share code and dynamo makes parameters graph inputs,
so one graph serves them all and compile time stays that of one block. Blocks run compiled only while they train;
evaluation and decoding run the same weights uncompiled. The head + loss is compiled with dynamic sizes.
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

# The first torch that compiles the head + loss as one graph; earlier releases make two of it.
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
    Why a note and not a refusal: the two graphs compute the same loss, only slower."""
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
    ``dynamic``: ``False`` for one shape (packed), ``True`` for changing lengths; ``kw`` goes to ``torch.compile``."""
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
