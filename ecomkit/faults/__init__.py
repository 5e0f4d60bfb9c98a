"""Chapter 07: faults. When a run checkpoints, and the callbacks a config asks for, each found by name.

Why here: a run that writes no checkpoint and reads none loads none of the checkpoint code (``callbacks``,
``checkpoint``, ``safe_load``) nor the health monitor; the modules below are one idea each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ecomkit import find
from ecomkit.config import TrainConfig, dcp_unsupported_reason
from ecomkit.dist import max_restarts

# Imported by name (``__import__``: -X importtime counts it) when a run writes or reads a checkpoint, or health is on
CHECKPOINTS = "ecomkit.faults.callbacks"   # CheckpointCallback
HEALTH = "ecomkit.faults.health"           # HealthMonitor: --health-interval or --hang-dump-s


def checkpoint_root(cfg: TrainConfig) -> Path:
    """``--fault-checkpoint-dir``, else ``<output_dir>/checkpoints``: a rerun into the same folder resumes."""
    return Path(cfg.fault.checkpoint_dir or Path(cfg.output_dir) / "checkpoints")


def checkpoints_requested(cfg: TrainConfig) -> bool:
    """Explicitly (interval > 0), or automatically (-1) when a restart (torchrun's --max-restarts, which it exports
    to the workers) or an injected fault can use them."""
    interval = cfg.fault.checkpoint_interval
    auto = interval == -1 and dcp_unsupported_reason(cfg) is None
    return interval > 0 or (auto and (cfg.fail_at_step >= 0 or max_restarts() > 0))


def add_fault_tolerance_callbacks(cfg: TrainConfig, callbacks: Iterable[Any] = ()) -> list[Any]:
    """``callbacks`` plus chapter 07's: checkpoints (when requested) and the health monitor (when on), once each."""
    out = list(callbacks)
    if checkpoints_requested(cfg):
        checkpoint = find(f"{CHECKPOINTS}:CheckpointCallback")
        if not any(isinstance(c, checkpoint) for c in out):
            out.append(checkpoint(cfg))
    if cfg.fault.health_interval > 0 or cfg.fault.hang_dump_s > 0:
        monitor = find(f"{HEALTH}:HealthMonitor")
        if not any(isinstance(c, monitor) for c in out):
            out.append(monitor(cfg))
    return out


__all__ = ["CHECKPOINTS", "HEALTH", "add_fault_tolerance_callbacks", "checkpoint_root", "checkpoints_requested"]
