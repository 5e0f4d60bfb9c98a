"""The LM head's losses a default run does not take: fused linear cross-entropy kernels (liger, cut-cross-entropy,
CUDA) and the chunked loss with its gradients computed in the forward (ZeRO-3's head, whole only then).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ecomkit.config.vocabulary import LOSS_KERNEL_PACKAGES
from ecomkit.errors import ConfigError
from ecomkit.models.loss import TokenLoss, cross_entropy_sum


def fused_loss(loss: TokenLoss) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of labeled rows ``(head, h, y)`` that ``loss`` runs instead of the chunk loop."""
    if loss.kernel in FUSED_LOSSES:
        return FUSED_LOSSES[loss.kernel]
    return functools.partial(chunks_with_gradients, chunk_tokens=loss.chunk_tokens, cross_entropy=loss.cross_entropy)


class _ChunksWithGradients(torch.autograd.Function):
    """Σ cross-entropy of ``h @ weight.T (+ bias)`` chunk by chunk, each chunk's gradients computed in the forward."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
                chunk_tokens: int, cross_entropy: Callable) -> torch.Tensor:
        grad_h = torch.empty_like(h)   # the head's gradients summed in its dtype, as autograd sums them over chunks
        grad_w = torch.zeros_like(weight)
        grad_b = torch.zeros_like(bias) if bias is not None else None
        total = h.new_zeros((), dtype=torch.float32)
        w, b = weight.detach().requires_grad_(), bias.detach().requires_grad_() if bias is not None else None
        for start in range(0, y.numel(), chunk_tokens):
            part = slice(start, start + chunk_tokens)
            with torch.enable_grad():
                rows = h[part].detach().requires_grad_()
                loss = cross_entropy(F.linear(rows, w, b), y[part])
                grads = torch.autograd.grad(loss, [rows, w] + ([b] if b is not None else []))
            grad_h[part] = grads[0]
            grad_w += grads[1]
            if b is not None:
                grad_b += grads[2]
            total += loss.detach()
        ctx.save_for_backward(grad_h, grad_w, *([grad_b] if bias is not None else []))
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        grad_h, grad_w, *grad_b = ctx.saved_tensors
        return grad_h * grad, grad_w * grad, grad_b[0] * grad if grad_b else None, None, None, None


def chunks_with_gradients(head: nn.Module, h: torch.Tensor, y: torch.Tensor, chunk_tokens: int = 1024,
                          cross_entropy: Callable | None = None) -> torch.Tensor:
    """The chunked loss of rows ``h`` (labels ``y``) with its gradients computed in the forward, as liger's is.
    Why: a head whose weight is whole only during the loss's forward (ZeRO-3) recomputes no chunk in backward."""
    if not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise ConfigError(f"the LM head is a {type(head).__name__} without a weight of its own (an adapter?): the "
                          "chunked loss of a head gathered once takes a plain linear head. Use --loss-kernel full.")
    return _ChunksWithGradients.apply(h, head.weight, head.bias, y, chunk_tokens, cross_entropy or cross_entropy_sum)


# ---------------------------------------------------------------------- fused linear cross-entropy (CUDA)
def _autocast_operands(h: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``h`` and ``weight`` in the dtype autocast would multiply them in (cut-cross-entropy computes in ``h``'s);
    the casts are differentiable, so gradients return in fp32."""
    device = h.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        return h.to(dtype), weight.to(dtype)
    return h, weight.to(h.dtype)


def liger_loss_sum(head: nn.Module, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of token losses of rows ``h`` (``[N, hidden]``) against ``y`` (``[N]``) through liger-kernel (its input
    flat and shifted, as liger's own transformers integration passes it)."""
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss  # lazy: GPU extra

    return LigerFusedLinearCrossEntropyLoss(ignore_index=-100, reduction="sum")(head.weight, h, y, head.bias)


def cce_loss_sum(head: nn.Module, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of token losses of rows ``h`` against ``y`` through cut-cross-entropy (``shift=False``: shifted here)."""
    from cut_cross_entropy import linear_cross_entropy  # lazy: optional GPU extra (Triton)

    if getattr(head, "bias", None) is not None:
        raise ConfigError("--loss-kernel cce: cut-cross-entropy's linear_cross_entropy takes no bias, and this "
                          "model's LM head has one. Use --loss-kernel liger or chunked.")
    e, c = _autocast_operands(h, head.weight)
    return linear_cross_entropy(e, c, y, ignore_index=-100, reduction="sum", shift=False).float()


FUSED_LOSSES: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "liger": liger_loss_sum, "cce": cce_loss_sum}
assert set(FUSED_LOSSES) == set(LOSS_KERNEL_PACKAGES)
