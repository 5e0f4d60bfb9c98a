"""``--precision auto`` and ``--attn auto`` resolved for a run: one choice for every rank, logged with its reason.

Why rank 0 decides: the CPU probe is a timing, and two ranks timing at once
on a shared machine could disagree; ranks that autocast differently would
still all-reduce, silently. So rank 0 probes and every rank takes its answer.
"""

from __future__ import annotations

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, gather_objects, log
from ecomkit.envcheck.matmul import NO_BF16_UNITS, choose_precision, cpu_bf16_units
from ecomkit.models.attention_rule import pick_attention


def resolve_precision(cfg: TrainConfig, env: DistEnv) -> str:
    """Replace ``cfg.precision == "auto"`` by the precision picked on rank 0's device; return the precision.

    An explicit ``bf16`` on a CPU without bf16 matmul units is kept (numerics can be studied anywhere) but
    warned about, since the run will be far slower than fp32 there.
    """
    if cfg.precision == "bf16" and env.device.type == "cpu" and env.is_main and cpu_bf16_units() is False:
        log.warning("--precision bf16 on a CPU without bf16 matmul units (%s): its GEMMs run converted, many "
                    "times slower than fp32; --precision auto picks fp32 here", NO_BF16_UNITS)
    if cfg.precision != "auto":
        return cfg.precision
    picked, why = choose_precision(env.device) if env.is_main else (None, None)
    picked, why = gather_objects((picked, why), env)[0]
    if env.is_main:
        log.info("precision auto -> %s: %s", picked, why)
    cfg.precision = picked
    return picked


def resolve_attention(cfg: TrainConfig, env: DistEnv) -> str:
    """Replace ``cfg.attn == "auto"`` by the attention the measured rule picks (after the precision is known).

    No gather is needed: the rule reads only the config and the device type, the same on every rank.
    """
    if cfg.attn != "auto":
        return cfg.attn
    picked, why = pick_attention(cfg.attn, cfg.precision, env.device.type, cfg.seq_len)
    if env.is_main:
        log.info("attention %s", why)
    cfg.attn = picked
    return picked


__all__ = ["resolve_attention", "resolve_precision"]
