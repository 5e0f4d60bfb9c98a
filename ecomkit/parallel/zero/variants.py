"""Chapter 03's variant names: ``ddp``, ZeRO stages ``0``-``3``, ``+opt``/``+param`` offload, ``@precision``.

E.g. ``scripts/03_zero3.py --stages ddp,1,2,3,3+opt+param,3@bf16`` trains each in turn (:func:`run_sweep`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

from ecomkit.config import StrategyName, TrainConfig
from ecomkit.errors import ConfigError

_TOKEN = re.compile(r"^(?:(?P<ddp>ddp)|(?P<stage>[0-3])(?P<opt>\+opt)?(?P<param>\+param)?)(?:@(?P<prec>fp32|bf16|fp16))?$")


@dataclass(frozen=True)
class ZeroVariant:
    """One variant of chapter 03's sweep; ``label`` is its name on the command line and its output folder."""

    label: str
    strategy: StrategyName                 # DDP or ZERO
    stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    precision: str | None = None           # None: the run's --precision

    def apply(self, base: TrainConfig) -> TrainConfig:
        """A copy of ``base`` with this variant's settings; its checkpoints go to a sub-folder per variant."""
        cfg = copy.deepcopy(base)
        cfg.strategy = self.strategy.value
        cfg.zero.stage = self.stage
        cfg.zero.offload_optimizer = self.offload_optimizer
        cfg.zero.offload_param = self.offload_param
        if self.precision:
            cfg.precision = self.precision
        if cfg.zero.checkpoint_dir:
            cfg.zero.checkpoint_dir = str(Path(cfg.zero.checkpoint_dir) / self.label)
        return cfg


def parse_variants(text: str) -> list[ZeroVariant]:
    """``"ddp,1,2,3,3+opt"`` → variants; a clear error for anything else."""
    out: list[ZeroVariant] = []
    for raw in (t.strip() for t in text.split(",")):
        m = _TOKEN.match(raw)
        if not m:
            raise ConfigError(
                f"--stages: cannot read '{raw}'. Use a comma-separated list of 'ddp' or a ZeRO stage 0-3 with "
                "optional '+opt' (offload optimizer) and '+param' (stage 3: offload parameters), each optionally "
                "ending in @fp32/@bf16/@fp16, e.g. --stages ddp,1,2,3,3+opt+param,3@bf16.")
        if m["ddp"]:
            out.append(ZeroVariant(raw, StrategyName.DDP, precision=m["prec"]))
            continue
        stage = int(m["stage"])
        if m["param"] and stage != 3:
            raise ConfigError(f"--stages: '{raw}' offloads parameters, which only ZeRO stage 3 partitions.")
        out.append(ZeroVariant(raw, StrategyName.ZERO, stage, bool(m["opt"]), bool(m["param"]), m["prec"]))
    if len({v.label for v in out}) != len(out):
        raise ConfigError(f"--stages '{text}' names a variant twice.")
    return out
