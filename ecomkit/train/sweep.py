"""Run N named variants of one :class:`~ecomkit.config.TrainConfig` in one launch: the one sweep driver.

Most of a short run is start-up, so one process-group session trains every variant in turn, re-seeded so each
starts from the same weights and batches. Not ``run_training`` per variant: a second ``init_process_group`` under
torchrun reuses the agent's store, whose old keys point at closed sockets.
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

    ``callbacks(variant, cfg)`` gives a variant's extra callbacks. Every config is validated before the session opens.
    """
    configs = variant_configs(base, variants, subdirs)
    for cfg in configs:
        cfg.validate()
    summaries: list[dict[str, Any]] = []
    with distributed_session(timeout_s=base.timeout_s, seed=base.seed) as env:
        for variant, cfg in zip(variants, configs):
            seed_everything(cfg.seed, env.rank)
            summaries.append(train_in_session(cfg, env, run_callbacks(cfg, callbacks(variant, cfg))))
            gc.collect()
    return summaries
