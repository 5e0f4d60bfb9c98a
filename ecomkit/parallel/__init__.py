"""Parallelism strategies, one module each, found by :data:`STRATEGY_FACTORIES` and built by :func:`build_strategy`.

====================  ===========================================  =========
``cfg.strategy``      module                                        chapter
====================  ===========================================  =========
``ddp``               :mod:`ecomkit.parallel.ddp`                   02
``accelerate``        :mod:`ecomkit.parallel.accelerate_path`       02
``zero``              :mod:`ecomkit.parallel.zero.strategy`         03
``fsdp``/``tp``/``pp``/``mixed``  :mod:`ecomkit.parallel.mixed`     04
compression hooks     :mod:`ecomkit.parallel.compression.hooks`     05
====================  ===========================================  =========

Why a typed registry: a factory per :class:`~ecomkit.config.StrategyName` is
checked by the type checker and by ``lint-imports``, where a "module:Class"
string is only found wrong at run time. The strategy modules are imported
here at module level; the heavy optional packages (DeepSpeed, Accelerate) are
imported by those modules only inside the functions that need them, so a
plain DDP run never loads them.
"""

from __future__ import annotations

from typing import Callable

from ecomkit.config import StrategyName, TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.envcheck.matmul import resolve_precision
from ecomkit.parallel.accelerate_path import AccelerateStrategy
from ecomkit.parallel.base import Strategy
from ecomkit.parallel.ddp import DDPStrategy
from ecomkit.parallel.mixed import MixedParallelStrategy
from ecomkit.parallel.zero.strategy import ZeroStrategy

StrategyFactory = Callable[[TrainConfig, DistEnv], Strategy]

STRATEGY_FACTORIES: dict[StrategyName, StrategyFactory] = {
    StrategyName.DDP: DDPStrategy,
    StrategyName.ACCELERATE: AccelerateStrategy,
    StrategyName.ZERO: ZeroStrategy,
    StrategyName.FSDP: MixedParallelStrategy,
    StrategyName.TP: MixedParallelStrategy,
    StrategyName.PP: MixedParallelStrategy,
    StrategyName.MIXED: MixedParallelStrategy,
}


def build_strategy(cfg: TrainConfig, env: DistEnv) -> Strategy:
    """The strategy named by ``cfg.strategy``; ``cfg`` has passed ``TrainConfig.validate`` (name, compression).

    ``--precision auto`` is resolved first (a no-op when the run already did): a strategy casts by a dtype."""
    resolve_precision(cfg, env)
    return STRATEGY_FACTORIES[StrategyName(cfg.strategy)](cfg, env)


__all__ = ["STRATEGY_FACTORIES", "Strategy", "StrategyFactory", "build_strategy"]
