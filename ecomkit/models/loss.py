"""The LM head's loss of one micro-batch (``--loss-kernel``), as a sum, from the model's last hidden states.

Why from hidden states: the ``[batch, T, vocab]`` logits and their gradients are a step's biggest tensors; sums,
divided once by the global batch's label-token count, give every split of one global batch the same gradient.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ecomkit import find
from ecomkit.config.vocabulary import LOSS_KERNEL_PACKAGES
from ecomkit.errors import ConfigError

# What only a fused kernel (--loss-kernel liger | cce) or ZeRO-3's gradients in the forward uses, imported by name then.
LOSS_KERNELS = "ecomkit.models.loss_kernels"

# Per GPU kind, the loss kernel measured fastest there (ecomlab.derive.loss_kernel of the newest GPU artifact).
# Empty while no GPU artifact has those rows: ``auto`` keeps the chunked loss and says it is unmeasured.
GPU_LOSS_KERNEL: dict[str, str] = {}


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
                           cross_entropy: Callable | None = None, head_loss: Callable = None,
                           fused: Callable | None = None, label_count: int | None = None) -> torch.Tensor:
    """:func:`token_loss_sum` of the labeled positions only, ``chunk_tokens`` at a time under checkpointing.
    Why: never holds the ``[B, T, vocab]`` logits. ``row_multiple``: rows topped up to :func:`head_rows`;
    ``label_count`` (host-side) avoids a device sync; ``fused``: a library's kernel instead of the chunk loop."""
    # Every position, the last of each row labeled -100 (nothing follows it): B × T rows, a multiple of
    # ``row_multiple`` when T is, so a batch with (nearly) every position labeled still tops up to one.
    flat_h = hidden.reshape(-1, hidden.size(-1))
    flat_y = F.pad(labels[:, 1:], (0, 1), value=-100).reshape(-1)
    keep = _positions(flat_y != -100, label_count)
    if keep.numel() == 0:  # no label in this micro-batch: a zero that still reaches every parameter
        if fused is not None:   # one unlabeled row: the kernel's own zero (and its collectives, as on other ranks)
            return fused(head, flat_h[:1], flat_y[:1])
        return F.cross_entropy(head(flat_h[:1]).float(), flat_y[:1].clamp(min=0), reduction="sum") * 0.0
    if row_multiple:
        keep = _topped_up(keep, flat_y, row_multiple)
    h, y = flat_h.index_select(0, keep), flat_y.index_select(0, keep)
    if fused is not None:
        return fused(head, h, y)
    if head_loss in (None, head_loss_sum) or not torch.is_grad_enabled():   # uncompiled; evaluation too, as the blocks
        head_loss = head_loss_sum
    else:   # compiled (--compile): any row count, 1 included, is one graph (no size-1 specialisation)
        head_loss = functools.partial(_unbacked_rows, head_loss)
    if y.numel() <= chunk_tokens:
        return head_loss(head, h, y, cross_entropy)
    total = h.new_zeros((), dtype=torch.float32)
    for start in range(0, y.numel(), chunk_tokens):
        part = slice(start, start + chunk_tokens)
        total = total + checkpoint(head_loss, head, h[part], y[part], cross_entropy, use_reentrant=False)
    return total


def _unbacked_rows(head_loss: Callable, head: nn.Module, h: torch.Tensor, y: torch.Tensor, cross_entropy: Callable
                   ) -> torch.Tensor:
    torch._dynamo.decorators.mark_unbacked(h, 0)
    torch._dynamo.decorators.mark_unbacked(y, 0)
    return head_loss(head, h, y, cross_entropy)


# Under --compile the label selection runs eagerly: its row count changes every step and would recompile a graph
# after it; the graphs on either side see fixed shapes, so packed batches compile once.
chunked_token_loss_sum = torch.compiler.disable(chunked_token_loss_sum, recursive=True)


def _positions(flags: torch.Tensor, count: int | None) -> torch.Tensor:
    """Indices of the true ``flags``: ``count`` of them when the host knows how many (no device sync)."""
    if count is None:
        return flags.nonzero().squeeze(1)
    return torch.nonzero_static(flags, size=count).squeeze(1)


def head_rows(count: int, multiple: int, positions: int) -> int:
    """The LM head's rows for ``count`` labels: a multiple of ``multiple`` and of an eighth of ``count``'s power of 2.
    Why: under bf16 on CPU every row count is a new cached oneDNN primitive; the ladder keeps them few."""
    step = max(multiple, 1 << max(count.bit_length() - 4, 0))
    return min(-(-count // step) * step, positions)


def _topped_up(keep: torch.Tensor, flat_y: torch.Tensor, multiple: int) -> torch.Tensor:
    """``keep`` plus the first unlabeled positions, to :func:`head_rows` rows."""
    want = head_rows(keep.numel(), multiple, flat_y.numel())
    if want == keep.numel():
        return keep
    unlabeled = _positions(flat_y == -100, flat_y.numel() - keep.numel())[:want - keep.numel()]
    return torch.cat([keep, unlabeled])


def cross_entropy_sum(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Σ of the rows' next-token losses in fp32 (a target of -100 adds 0): ATen's cross-entropy."""
    return F.cross_entropy(logits.float(), target, ignore_index=-100, reduction="sum")


def head_loss_sum(head: torch.nn.Module, h: torch.Tensor, y: torch.Tensor,
                  cross_entropy: Callable | None = None) -> torch.Tensor:
    return (cross_entropy or cross_entropy_sum)(head(h), y)


def last_hidden_state(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The last hidden states ``[B, T, hidden]`` (after ``ln_f``) through ``model``'s own forward, wrappers' too.
    Why the forward and not ``model.transformer``: a wrapper prepares there (DDP its reducer, FSDP2 and ZeRO-3
    their gathers, DeepSpeed its step). The head runs on no position (``logits_to_keep`` of none), so no logits."""
    none = torch.empty(0, dtype=torch.long, device=input_ids.device)
    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=none, output_hidden_states=True,
                use_cache=False)
    return out.hidden_states[-1]


@dataclass(frozen=True)
class TokenLoss:
    """Σ token losses of a micro-batch from its last hidden states and the LM head: ``loss(hidden, head, labels)``."""

    kernel: str = "full"              # full | chunked | liger | cce (--loss-kernel, resolved)
    chunk_tokens: int = 1024          # chunked: labeled positions per head call (--loss-chunk-tokens)
    row_multiple: int | None = None   # bf16 on CPU: the head's rows on the head_rows ladder (train/shapes.py)
    cross_entropy: Callable = cross_entropy_sum   # Σ of rows' losses; fast paths: the CPU kernel (fast/cpu_kernels.py)
    head_loss: Callable = head_loss_sum   # head + cross-entropy of one chunk; --compile: compiled (fast/compile.py)
    grads_in_forward: bool = False    # chunked: gradients computed in the forward (a head whole only then: ZeRO-3)

    def __post_init__(self) -> None:
        if self.kernel not in ("full", "chunked", *LOSS_KERNEL_PACKAGES):
            fused = " or ".join(LOSS_KERNEL_PACKAGES)
            raise ConfigError(f"--loss-kernel {self.kernel}: choose full, chunked or {fused}.")
        if self.kernel == "chunked" and self.chunk_tokens < 1:
            raise ConfigError(f"loss_chunk_tokens={self.chunk_tokens}: give a positive number of positions per "
                              "chunk, or 0 (flag --loss-chunk-tokens 0) to keep the full-logits loss.")

    @property
    def from_logits(self) -> bool:
        """Whether this is the full-logits loss, which the model's own forward computes the logits of."""
        return self.kernel == "full"

    def __call__(self, hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor,
                 label_count: int | None = None) -> torch.Tensor:
        if self.from_logits:
            return token_loss_sum(head(hidden), labels)
        fused = None
        if self.kernel in LOSS_KERNEL_PACKAGES or self.grads_in_forward:
            fused = find(f"{LOSS_KERNELS}:fused_loss")(self)
        return chunked_token_loss_sum(hidden, head, labels, 1 << 30 if fused else self.chunk_tokens,
                                      self.row_multiple, self.cross_entropy, self.head_loss, fused, label_count)


def lm_loss_sum(model: nn.Module, loss: TokenLoss, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor, head: nn.Module | None = None, label_count: int | None = None) -> torch.Tensor:
    """Σ token losses of a batch: ``model``'s forward (to logits, or to hidden states), then ``loss``.
    ``head``: the LM head module (default ``model.lm_head``; a wrapper's caller passes the inner model's)."""
    if loss.from_logits:
        return token_loss_sum(model(input_ids=input_ids, attention_mask=attention_mask).logits, labels)
    hidden = last_hidden_state(model, input_ids, attention_mask)
    return loss(hidden, head if head is not None else model.lm_head, labels, label_count)


# ---------------------------------------------------------------------- --loss-kernel auto
def pick_loss_kernel(requested: str, device_type: str, gpu_kind: str | None = None, chunk_tokens: int = 1024,
                     measured: dict[str, str] | None = None, installed: Callable[[str], bool] | None = None
                     ) -> tuple[str, str]:
    """(kernel, why) for ``--loss-kernel requested``; anything but ``auto`` is returned as asked.
    ``gpu_kind``: :func:`ecomkit.hardware.gpu_kind` of the device; ``measured``: kind -> kernel
    (default :data:`GPU_LOSS_KERNEL`); ``installed(kernel)``: whether a fused kernel's package imports here."""
    if requested != "auto":
        return requested, f"--loss-kernel {requested} as asked"
    if chunk_tokens == 0:
        return "full", "auto: full logits, since --loss-chunk-tokens 0 asks for them"
    if device_type != "cuda":
        return "chunked", (f"auto: chunked, ecomkit's loss on {device_type} (no [B, T, vocab] logits; its CPU "
                           "cross-entropy kernel measured in bench_kernels; liger and cce need CUDA)")
    table = GPU_LOSS_KERNEL if measured is None else measured
    pick = table.get(gpu_kind or "")
    if pick is None:
        return "chunked", (f"auto: chunked; unmeasured on this GPU ({gpu_kind}): no gpu_bench artifact of this "
                           "repository has loss-kernel rows for it yet (python benchmarks/gpu_bench.py --parts "
                           "loss_kernel measures chunked, full, liger and cce)")
    if pick in LOSS_KERNEL_PACKAGES and installed is not None and not installed(pick):
        return "chunked", (f"auto: chunked; {pick} was measured fastest on {gpu_kind} but its package "
                           f"{LOSS_KERNEL_PACKAGES[pick][1]} is not installed here (pip install 'ecomkit[gpu]')")
    return pick, f"auto: {pick}, measured fastest on {gpu_kind} at BLOOM's vocabulary (gpu_bench loss-kernel rows)"
