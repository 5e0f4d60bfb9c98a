"""Chunked LM-head loss for transformers' BLOOM: the model's forward returns the loss sum, not logits.

Why: with fused attention (``ecomkit.models_attention``) the largest tensors of
a long-sequence training step are no longer attention scores but the LM
head's ``[batch, T, vocab]`` logits, their fp32 log-softmax and the gradients
of both. :func:`~ecomkit.train.losses.chunked_token_loss_sum` computes head +
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
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

from .errors import ConfigError
from .train.losses import chunked_token_loss_sum


def _forward_with_chunked_loss(self: nn.Module, *args: Any, token_loss_labels: torch.Tensor | None = None,
                               **kwargs: Any) -> Any:
    if token_loss_labels is None:
        return type(self).forward(self, *args, **kwargs)
    kwargs.setdefault("use_cache", False)
    hidden = self.transformer(*args, **kwargs)[0]
    loss = chunked_token_loss_sum(hidden, self.lm_head, token_loss_labels, self.ecomkit_loss_chunk)
    return CausalLMOutputWithCrossAttentions(loss=loss)


def install_chunked_loss(model: nn.Module, chunk_tokens: int) -> None:
    """Make ``model(..., token_loss_labels=labels).loss`` the chunked token-loss sum; call before wrapping."""
    if chunk_tokens < 1:
        raise ConfigError(f"loss_chunk_tokens={chunk_tokens}: give a positive number of positions per chunk, "
                          "or 0 (flag --loss-chunk-tokens 0) to keep the full-logits loss.")
    if not (hasattr(model, "transformer") and isinstance(getattr(model, "lm_head", None), nn.Module)):
        raise ConfigError(f"the chunked loss needs a BLOOM-style causal LM (.transformer and .lm_head); "
                          f"{type(model).__name__} has not. Pass --loss-chunk-tokens 0.")
    model.ecomkit_loss_chunk = int(chunk_tokens)
    model.forward = types.MethodType(_forward_with_chunked_loss, model)


def remove_chunked_loss(model: nn.Module) -> None:
    """Undo :func:`install_chunked_loss` (a no-op when it was not installed)."""
    model.__dict__.pop("forward", None)
    model.__dict__.pop("ecomkit_loss_chunk", None)


def has_chunked_loss(model: nn.Module) -> bool:
    return "ecomkit_loss_chunk" in model.__dict__
