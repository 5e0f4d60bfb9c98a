"""Run N named variants of one :class:`~ecomkit.config.TrainConfig` in one launch: the one sweep driver.

Why in one launch: on a small machine most of a short run is start-up
(importing torch, transformers and DeepSpeed, joining a process group,
building the data). Comparing variants needs the same data and seed anyway,
so :func:`run_sweep` opens one process-group session and trains every variant
in turn inside it, each in its own ``output_dir/<label>`` folder, re-seeded
before each so every variant starts from the same weights and sees the same
batches. The chapters differ only in their variants and extra callbacks:

- chapter 03: ZeRO stages and offload (:mod:`ecomkit.parallel.zero.variants`,
  driven by :func:`ecomlab.measure.zero.train_zero_variants`);
- chapter 05: compression methods (:mod:`ecomkit.parallel.compression.specs`,
  driven by :func:`ecomlab.measure.compression.train_methods`);
- chapter 06: model states under every strategy
  (:func:`ecomlab.measure.strategy_states.measure_strategy_states`).

Every variant gets the callbacks a single run gets
(:func:`~ecomkit.train.loop.run_callbacks`: checkpoints, resume, health
monitor, ``--dcp-dir``) plus the sweep's own. Why not call ``run_training`` per variant: it destroys the
process group at the end, and a second ``init_process_group`` under torchrun
reuses the agent's store, whose keys from the first session point at closed
sockets ("Connection closed by peer").
"""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar

from ecomkit.config import TrainConfig
from ecomkit.dist import distributed_session, seed_everything
from ecomkit.train.loop import run_callbacks, train_in_session


class Variant(Protocol):
    """What a sweep needs from a variant: a label (its output folder) and the config it trains."""

    @property
    def label(self) -> str: ...

    def apply(self, base: TrainConfig) -> TrainConfig:
        """A changed copy of ``base``; the sweep sets ``output_dir`` itself."""
        ...


@dataclass(frozen=True)
class AsConfigured:
    """The base config unchanged: a script run without a variant list is a sweep of one."""

    label: str = "run"

    def apply(self, base: TrainConfig) -> TrainConfig:
        return copy.deepcopy(base)


V = TypeVar("V", bound=Variant)


def no_extra_callbacks(variant: Any, cfg: TrainConfig) -> Sequence[Any]:
    """The default: each variant gets the callbacks a single run gets, and nothing more."""
    return ()


def variant_configs(base: TrainConfig, variants: Sequence[Variant], subdirs: bool = True) -> list[TrainConfig]:
    """Each variant's config, writing into ``base.output_dir/<label>`` (or ``base.output_dir`` itself)."""
    if subdirs and len({v.label for v in variants}) != len(variants):
        raise ValueError(f"variant labels must be unique (they name the output folders): {[v.label for v in variants]}")
    configs = []
    for variant in variants:
        cfg = variant.apply(base)
        cfg.output_dir = str(Path(base.output_dir) / variant.label) if subdirs else base.output_dir
        configs.append(cfg)
    return configs


def run_sweep(base: TrainConfig, variants: Sequence[V], callbacks: Callable[[V, TrainConfig], Sequence[Any]]
              = no_extra_callbacks, subdirs: bool = True) -> list[dict[str, Any]]:
    """Train each variant in turn inside ONE process-group session; summaries in variant order, on every rank.

    ``callbacks(variant, cfg)`` returns the variant's extra callbacks (a
    memory probe, a byte counter); callbacks that add fields to the summary
    do it in ``on_train_end``. Every config is validated before the session
    opens, so a bad variant fails before any of them trains.
    """
    configs = variant_configs(base, variants, subdirs)
    for cfg in configs:
        cfg.validate()
    summaries: list[dict[str, Any]] = []
    with distributed_session(timeout_s=base.timeout_s, seed=base.seed) as env:
        for variant, cfg in zip(variants, configs):
            seed_everything(cfg.seed, env.rank)
            summaries.append(train_in_session(cfg, env, run_callbacks(cfg, callbacks(variant, cfg))))
            gc.collect()  # the previous variant's model and optimizer go before the next one is built
    return summaries
