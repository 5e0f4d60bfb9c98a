"""Chunked LM-head loss for transformers' BLOOM: the model's forward returns the loss sum, not logits.

Why: with fused attention (``ecomkit.models.attention``) the largest tensors of
a long-sequence training step are no longer attention scores but the LM
head's ``[batch, T, vocab]`` logits, their fp32 log-softmax and the gradients
of both. :func:`~ecomkit.models.loss.chunked_token_loss_sum` computes head +
cross-entropy a chunk of positions at a time instead.

Why inside the model's forward: the loss needs the LM head's weight, and a
wrapper owns that weight only *during* the wrapped forward (DDP prepares its
reducer there; FSDP2 unshards the root's parameters there). So the loss is
computed in the forward, through ``model(input_ids, attention_mask,
token_loss_labels=labels).loss``.

How it is installed (the one place that changes the model): an instance
attribute ``model.forward`` that handles ``token_loss_labels`` and passes every
other call to the class's own forward (eval, generation, HF Trainer). The
class, parameters, ``state_dict`` keys and ``save_pretrained`` output are
untouched. :func:`remove_chunked_loss` deletes it again.

Which strategies use it: those that run the whole model in one forward on
each rank (single process, DDP, Accelerate, FSDP2 without TP/PP); see
``Strategy.supports_chunked_loss``. ZeRO-3 gathers a module's weight only
around that module's own calls, tensor parallelism shards the head's
output, and a pipeline's last stage computes its own loss, so those keep the
full-logits loss.

Token-level loss sums (the first half of this module): Token-level loss sums, so the loop can normalise by the *global* token count.

Why sums and not ``model(..., labels=...).loss``: the model's mean is over the
micro-batch's tokens, so averaging micro-batch means weights short and long
batches equally, and 1-process vs 2-process vs accumulation runs stop being
comparable. Summing here and dividing once by the global batch's label-token
count makes every split of the same global batch produce the same gradient.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

from ecomkit.errors import ConfigError
from ecomkit.models.cpu_kernels import cross_entropy_sum




def shifted_token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position next-token losses ``[B, T-1]`` (0 where labels are -100)."""
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    losses = F.cross_entropy(shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1),
                             ignore_index=-100, reduction="none")
    return losses.view(shift_labels.shape)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return shifted_token_losses(logits, labels).sum()


def count_label_tokens(labels: torch.Tensor) -> int:
    """Positions that contribute to the loss after the causal shift."""
    return int((labels[:, 1:] != -100).sum())


def chunked_token_loss_sum(hidden: torch.Tensor, head: torch.nn.Module, labels: torch.Tensor,
                           chunk_tokens: int, row_multiple: int | None = None,
                           cpu_kernel: bool = False, head_loss: Callable = None) -> torch.Tensor:
    """:func:`token_loss_sum` from the last hidden state, never holding the ``[B, T, vocab]`` logits.

    Why: at long sequences the LM head's logits, their fp32 log-softmax and
    the gradients of both are the biggest tensors of a training step (each
    ``B × T × vocab`` floats; BLOOM's vocabulary is 250,880). This keeps only
    the positions that have a label (NLU answers are a small part of each
    sequence), then computes head + cross-entropy ``chunk_tokens`` positions
    at a time under activation checkpointing: the forward keeps no logits and
    the backward recomputes one chunk's logits at a time. The cost is one
    extra head matmul per chunk in backward; when everything fits in one
    chunk nothing is recomputed.

    ``row_multiple`` (bf16/fp16 autocast on CPU, ``train/shapes.py``): the
    kept positions are topped up with unlabeled ones (label -100, so they add
    exactly 0 and no gradient) to a multiple of it. Why: the number of labeled
    positions changes almost every step, and each new row count is a new
    shape of the head's matmul, for which oneDNN builds and keeps a primitive
    (forward, and both backward products). With AMX on a Xeon that was most
    of a bf16 run's memory growth after batch lengths were rounded
    (docs/perf.md, "bf16 on CPU: memory"). It also keeps the products on
    whole 16-row tiles: oneDNN's bf16 GEMM on ``B × (T − 1)`` rows (1016 for
    8 × 128) ran about 20 % slower than on 1024, so the candidates are all
    ``B × T`` positions, not only those with a successor.

    ``cpu_kernel``: the cross-entropy runs through ecomkit's fused CPU kernel
    (``models/cpu_kernels.py``) where it applies, one pass each way instead of
    ATen's cast, ``log_softmax``, zero-filled ``nll_loss`` gradient and cast back.

    Equal to ``token_loss_sum(head(hidden), labels)`` up to the order of the
    floating-point sum (tested). ``head`` is called as a module, so wrappers'
    hooks on it (FSDP2 unsharding, autocast) still run.
    """
    # Every position, the last of each row labeled -100 (nothing follows it): B × T rows, a multiple of
    # ``row_multiple`` when T is, so a batch with (nearly) every position labeled still tops up to one.
    flat_h = hidden.reshape(-1, hidden.size(-1))
    flat_y = F.pad(labels[:, 1:], (0, 1), value=-100).reshape(-1)
    keep = (flat_y != -100).nonzero().squeeze(1)
    if keep.numel() == 0:  # no label in this micro-batch: a zero that still reaches every parameter
        return F.cross_entropy(head(flat_h[:1]).float(), flat_y[:1].clamp(min=0), reduction="sum") * 0.0
    if row_multiple:
        keep = _topped_up(keep, flat_y, row_multiple)
    h, y = flat_h.index_select(0, keep), flat_y.index_select(0, keep)
    if head_loss is None or not torch.is_grad_enabled():   # without grad (evaluation) uncompiled, as the blocks
        head_loss = head_loss_sum
    else:   # compiled (--compile): any row count, 1 included, is one graph (no size-1 specialisation)
        head_loss = functools.partial(_unbacked_rows, head_loss)
    if y.numel() <= chunk_tokens:
        return head_loss(head, h, y, cpu_kernel)
    total = h.new_zeros((), dtype=torch.float32)
    for start in range(0, y.numel(), chunk_tokens):
        part = slice(start, start + chunk_tokens)
        total = total + checkpoint(head_loss, head, h[part], y[part], cpu_kernel, use_reentrant=False)
    return total


def _unbacked_rows(head_loss: Callable, head: nn.Module, h: torch.Tensor, y: torch.Tensor, cpu_kernel: bool
                   ) -> torch.Tensor:
    torch._dynamo.decorators.mark_unbacked(h, 0)
    torch._dynamo.decorators.mark_unbacked(y, 0)
    return head_loss(head, h, y, cpu_kernel)


# Under torch.compile (--compile) the label selection runs eagerly: its row count (the labeled positions) changes
# every step, and a compiled graph after it would be specialised to that count and recompiled for the next one.
# The graphs on either side see only fixed shapes ([B, T, h] hidden states, [B, T] labels), so packed batches,
# which have one shape, compile once (tests/test_packing.py counts).
chunked_token_loss_sum = torch.compiler.disable(chunked_token_loss_sum, recursive=True)


def _topped_up(keep: torch.Tensor, flat_y: torch.Tensor, multiple: int) -> torch.Tensor:
    """``keep`` plus the first unlabeled positions, to a multiple of ``multiple`` rows (or every position)."""
    want = min(-(-keep.numel() // multiple) * multiple, flat_y.numel())
    if want == keep.numel():
        return keep
    unlabeled = (flat_y == -100).nonzero().squeeze(1)[:want - keep.numel()]
    return torch.cat([keep, unlabeled])


def head_loss_sum(head: torch.nn.Module, h: torch.Tensor, y: torch.Tensor, cpu_kernel: bool = False) -> torch.Tensor:
    return cross_entropy_sum(head(h), y, cpu_kernel)


def _head_loss(model: nn.Module) -> Callable:
    """The head + loss function of an installed chunked loss: compiled with ``--compile`` (models/compile.py)."""
    return model.__dict__.get("ecomkit_head_loss") or head_loss_sum


def _forward_with_chunked_loss(self: nn.Module, *args: Any, token_loss_labels: torch.Tensor | None = None,
                               **kwargs: Any) -> Any:
    if token_loss_labels is None:
        return type(self).forward(self, *args, **kwargs)
    kwargs.setdefault("use_cache", False)
    hidden = self.transformer(*args, **kwargs)[0]
    loss = chunked_token_loss_sum(hidden, self.lm_head, token_loss_labels, self.ecomkit_loss_chunk,
                                  self.ecomkit_loss_rows, self.ecomkit_loss_kernel, _head_loss(self))
    return CausalLMOutputWithCrossAttentions(loss=loss)


def install_chunked_loss(model: nn.Module, chunk_tokens: int, row_multiple: int | None = None,
                         cpu_kernel: bool = False, head_loss: Callable | None = None) -> None:
    """Make ``model(..., token_loss_labels=labels).loss`` the chunked token-loss sum; call before wrapping.

    ``row_multiple`` and ``cpu_kernel``: see :func:`chunked_token_loss_sum` (None: exactly the labeled positions);
    ``head_loss``: the head + loss function of a chunk (``--compile``: the compiled one, models/compile.py).
    """
    if chunk_tokens < 1:
        raise ConfigError(f"loss_chunk_tokens={chunk_tokens}: give a positive number of positions per chunk, "
                          "or 0 (flag --loss-chunk-tokens 0) to keep the full-logits loss.")
    if not (hasattr(model, "transformer") and isinstance(getattr(model, "lm_head", None), nn.Module)):
        raise ConfigError(f"the chunked loss needs a BLOOM-style causal LM (.transformer and .lm_head); "
                          f"{type(model).__name__} has not. Pass --loss-chunk-tokens 0.")
    model.ecomkit_loss_chunk = int(chunk_tokens)
    model.ecomkit_loss_rows = row_multiple
    model.ecomkit_loss_kernel = cpu_kernel
    if head_loss is not None:
        model.ecomkit_head_loss = head_loss
    model.forward = types.MethodType(_forward_with_chunked_loss, model)


def remove_chunked_loss(model: nn.Module) -> None:
    """Undo :func:`install_chunked_loss` (a no-op when it was not installed)."""
    model.__dict__.pop("forward", None)
    model.__dict__.pop("ecomkit_loss_chunk", None)
    model.__dict__.pop("ecomkit_loss_rows", None)
    model.__dict__.pop("ecomkit_loss_kernel", None)
    model.__dict__.pop("ecomkit_head_loss", None)


def has_chunked_loss(model: nn.Module) -> bool:
    return "ecomkit_loss_chunk" in model.__dict__
