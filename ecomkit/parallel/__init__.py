"""Parallelism strategies, one module each, composed by ``build_strategy``.

====================  ===========================================  =========
``cfg.strategy``      module                                        chapter
====================  ===========================================  =========
``ddp``               :mod:`ecomkit.parallel.ddp`                   02
``accelerate``        :mod:`ecomkit.parallel.accelerate_path`       02
``zero``              :mod:`ecomkit.parallel.zero.strategy` (DeepSpeed)      03
``fsdp``/``tp``/``pp``/``mixed``  :mod:`ecomkit.parallel.mixed`     04
compression hooks     :mod:`ecomkit.parallel.compression.hooks`           05
====================  ===========================================  =========

Modules are imported lazily so that, e.g., DeepSpeed is only imported by runs
that use it.
"""

from __future__ import annotations

import importlib

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.errors import ConfigError
from ecomkit.parallel.base import Strategy

# strategy name -> "module:Class"
STRATEGY_CLASSES: dict[str, str] = {
    "ddp": "ecomkit.parallel.ddp:DDPStrategy",
    "accelerate": "ecomkit.parallel.accelerate_path:AccelerateStrategy",
    "zero": "ecomkit.parallel.zero.strategy:ZeroStrategy",
    "fsdp": "ecomkit.parallel.mixed:MixedParallelStrategy",
    "tp": "ecomkit.parallel.mixed:MixedParallelStrategy",
    "pp": "ecomkit.parallel.mixed:MixedParallelStrategy",
    "mixed": "ecomkit.parallel.mixed:MixedParallelStrategy",
}


def build_strategy(cfg: TrainConfig, env: DistEnv) -> Strategy:
    """Instantiate the strategy named by ``cfg.strategy``."""
    target = STRATEGY_CLASSES.get(cfg.strategy)
    if target is None:
        raise ConfigError(f"Unknown strategy '{cfg.strategy}'. Choose one of: {', '.join(STRATEGY_CLASSES)}.")
    if cfg.compression.method != "none" and cfg.strategy not in ("ddp",):
        raise ConfigError(
            f"Gradient compression '{cfg.compression.method}' is a DDP communication hook, and strategy "
            f"'{cfg.strategy}' has no DDP hooks (ZeRO and FSDP reduce-scatter gradients themselves). Use "
            "--strategy ddp with compression, or --compression-method none.")
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(cfg, env)
