"""``--precision``, ``--attn`` and ``--loss-kernel auto`` resolved for a run: one choice for every rank, logged with its reason.

Why rank 0 decides: the CPU probe is a timing, and two ranks timing at once
on a shared machine could disagree; ranks that autocast differently would
still all-reduce, silently. So rank 0 probes and every rank takes its answer.
"""

from __future__ import annotations

import importlib.util

from ecomkit.config import TrainConfig
from ecomkit.config.vocabulary import LOSS_KERNEL_PACKAGES
from ecomkit.dist import DistEnv, log
from ecomkit.envcheck.matmul import resolve_precision   # re-exported: the loop's and HF Trainer's name for it
from ecomkit.hardware import device_kind
from ecomkit.models.attention_rule import pick_attention
from ecomkit.models.loss import pick_loss_kernel


def resolve_attention(cfg: TrainConfig, env: DistEnv) -> str:
    """Replace ``cfg.attn == "auto"`` by the attention the measured rule picks (after the precision is known).

    No gather is needed: the rule reads only the config and the device type, the same on every rank.
    """
    if cfg.attn != "auto":
        return cfg.attn
    picked, why = pick_attention(cfg.attn, cfg.precision, env.device.type, cfg.seq_len, gpu_kind=device_kind(env.device))
    if env.is_main:
        log.info("attention %s", why)
    cfg.attn = picked
    return picked


def resolve_loss_kernel(cfg: TrainConfig, env: DistEnv, in_forward: bool) -> str:
    """Replace ``cfg.loss_kernel == "auto"`` by the kernel the measured rule picks; say once which and why.

    ``in_forward``: whether each rank's forward ends in the whole LM head (``Strategy.supports_chunked_loss``:
    not under tensor or pipeline parallelism); without it every kernel but the full logits is out of reach
    (``validate()`` has refused liger and cce there), and ``auto`` and ``chunked`` become ``full``.
    """
    if not in_forward:
        picked, why = "full", (f"full logits: --strategy {cfg.strategy} shards or stages the LM head (tensor or "
                               "pipeline parallelism), so no rank holds it whole for ecomkit's losses")
    else:
        picked, why = pick_loss_kernel(cfg.loss_kernel, env.device.type, device_kind(env.device),
                                       cfg.loss_chunk_tokens, installed=_installed)
    if env.is_main:
        log.info("loss kernel %s (%s)", picked, why)
    cfg.loss_kernel = picked
    return picked


def _installed(kernel: str) -> bool:
    return importlib.util.find_spec(LOSS_KERNEL_PACKAGES[kernel][0]) is not None


__all__ = ["resolve_attention", "resolve_loss_kernel", "resolve_precision"]
