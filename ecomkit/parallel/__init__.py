"""Parallelism strategies found by name: a run imports only the strategy (and the parts) its config asks for.

``tests/test_run_imports.py`` checks every entry, since ``lint-imports`` cannot see these imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ecomkit import find
from ecomkit.config import StrategyName, TrainConfig
from ecomkit.dist import DistEnv


@dataclass(frozen=True)
class StrategySpec:
    """Where a strategy lives: ``module:name`` of its class, and of what it adds to a run (or None)."""

    factory: str                           # the Strategy class, built with (resolved cfg, env)
    run_callbacks: str | None = None       # cfg -> callbacks the strategy adds to a run (FSDP2's --dcp-dir save)
    checkpoint_callback: str | None = None  # the callback a preemption saves and resumes through, where not DCP's


_MIXED = StrategySpec("ecomkit.parallel.mixed:MixedParallelStrategy",
                      run_callbacks="ecomkit.parallel.mixed:sharded_model_callbacks")
STRATEGIES: dict[StrategyName, StrategySpec] = {
    StrategyName.DDP: StrategySpec("ecomkit.parallel.ddp:DDPStrategy"),
    StrategyName.ACCELERATE: StrategySpec("ecomkit.parallel.accelerate_path:AccelerateStrategy"),
    StrategyName.ZERO: StrategySpec("ecomkit.parallel.zero.strategy:ZeroStrategy",
                                    checkpoint_callback="ecomkit.parallel.zero.checkpoint:ZeroCheckpointCallback"),
    StrategyName.FSDP: _MIXED, StrategyName.TP: _MIXED, StrategyName.PP: _MIXED, StrategyName.MIXED: _MIXED,
}
# DDP's gradient all-reduce, replaced by a communication hook: --compression-method (05).
DDP_HOOKS: dict[str, str] = {
    "compression": "ecomkit.parallel.compression.hooks:register_compression",
}
# Model parts a strategy uses only under LoRA.
LORA = "ecomkit.models.lora"
QUANT = "ecomkit.models.quant"
# The tensor byte counter, only for a strategy's memory report (chapters 03 and 06 measure with it).
STATE_BYTES = "ecomkit.parallel.state_bytes"


def strategy_spec(name: str) -> StrategySpec:
    return STRATEGIES[StrategyName(name)]


def build_strategy(cfg: TrainConfig, env: DistEnv) -> Any:   # a parallel.base.Strategy (base imports this module)
    """The strategy ``cfg.strategy`` names, built on a config whose ``auto`` values are resolved (it casts by dtype)."""
    if cfg.precision == "auto":
        raise ValueError("build_strategy needs a resolved precision; resolve the config first "
                         "(ecomkit.train.resolve.precision_choice, or TrainingRun.build)")
    return find(strategy_spec(cfg.strategy).factory)(cfg, env)


def strategy_callbacks(cfg: TrainConfig) -> list[Any]:
    """What ``cfg.strategy`` adds to a run's callbacks (FSDP2/TP's ``--dcp-dir`` save); most add nothing."""
    spec = strategy_spec(cfg.strategy)
    return list(find(spec.run_callbacks)(cfg)) if spec.run_callbacks else []


__all__ = ["DDP_HOOKS", "LORA", "QUANT", "STATE_BYTES", "STRATEGIES", "StrategySpec", "build_strategy",
           "strategy_callbacks", "strategy_spec"]
