"""``--precision auto`` resolved for a run: one choice for every rank, logged with its reason.

Why rank 0 decides: the CPU probe is a timing, and two ranks timing at once
on a shared machine could disagree; ranks that autocast differently would
still all-reduce, silently. So rank 0 probes and every rank takes its answer.
"""

from __future__ import annotations

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, gather_objects, log
from ecomkit.envcheck.matmul import choose_precision


def resolve_precision(cfg: TrainConfig, env: DistEnv) -> str:
    """Replace ``cfg.precision == "auto"`` by the precision picked on rank 0's device; return the precision."""
    if cfg.precision != "auto":
        return cfg.precision
    picked, why = choose_precision(env.device) if env.is_main else (None, None)
    picked, why = gather_objects((picked, why), env)[0]
    if env.is_main:
        log.info("precision auto -> %s: %s", picked, why)
    cfg.precision = picked
    return picked


__all__ = ["resolve_precision"]
