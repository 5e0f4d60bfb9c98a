"""A DeepSpeed ZeRO engine on a one-rank data-parallel group, inside a job of several ranks.

The time model's calibration needs the engine's CPU work without its communication; on one rank every collective
moves nothing. DeepSpeed's module-level ``mpu`` is restored on exit so a later engine spans the world again.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch.distributed as dist
from torch import nn

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.models.bloom import count_parameters
from ecomkit.models.optim import build_optimizer
from ecomkit.parallel.zero.config import build_zero_config
from ecomkit.parallel.zero.env import ensure_deepspeed_env, ensure_process_group, quiet_deprecations


class OneRankMpu:
    """DeepSpeed's "model parallelism unit" interface, answering with one group of this rank alone."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def get_data_parallel_group(self) -> dist.ProcessGroup:
        return self.group

    def get_data_parallel_world_size(self) -> int:
        return 1

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_group(self) -> dist.ProcessGroup:
        return self.group

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@contextlib.contextmanager
def one_rank_engine(model: nn.Module, cfg: TrainConfig, env: DistEnv, group: dist.ProcessGroup,
                    stage: int = 2) -> Iterator[Any]:
    """A ZeRO-``stage`` engine of a copy of ``model`` on ``group`` (this rank alone), destroyed on exit."""
    ensure_deepspeed_env()
    import deepspeed  # lazy: heavy optional dependency
    from deepspeed.utils import groups  # lazy: part of deepspeed

    quiet_deprecations()
    ensure_process_group(env)
    probe_cfg = copy.deepcopy(cfg)
    probe_cfg.zero.stage = stage
    probe = copy.deepcopy(model).train()
    ds = build_zero_config(probe_cfg, 1, 1, n_params=count_parameters(probe))
    previous, engine = groups.mpu, None
    try:
        engine, *_ = deepspeed.initialize(model=probe, optimizer=build_optimizer(probe, probe_cfg), config=ds,
                                          mpu=OneRankMpu(group))
        if engine.dp_world_size != 1:
            raise RuntimeError(f"the probe engine spans {engine.dp_world_size} ranks, not one: DeepSpeed did not "
                               "take its data-parallel group from the mpu")
        yield engine
    finally:
        groups.mpu = previous
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.destroy()


__all__ = ["OneRankMpu", "one_rank_engine"]
