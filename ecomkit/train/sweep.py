"""Several ZeRO variants (DDP, stages 1-3, offload) run one after another in one launch.

Why in one launch: on a small machine most of a short run is start-up
(importing torch, transformers and DeepSpeed, building the data). Comparing
DDP with ZeRO-1/2/3 needs the same data and seed anyway, so
``scripts/03_zero3.py --stages ddp,1,2,3`` trains each variant in turn inside
the same processes, each in its own process-group session and its own
``output_dir/<label>`` folder. The notebook and benchmark read those folders.

Variant names: ``ddp`` (ecomkit's DDP strategy, the reference), ``0``-``3``
(DeepSpeed ZeRO stage), with ``+opt`` (offload optimizer states to the CPU)
and ``+param`` (stage 3: offload parameters too), e.g. ``3+opt+param``; any of
them may end in ``@fp32``/``@bf16``/``@fp16`` to override ``--precision``
(``ddp,3,3@bf16``: the fp32 losses match DDP exactly, the bf16 bytes match the
mixed-precision formulas).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

from ecomkit.config import TrainConfig
from ecomkit.errors import ConfigError

_TOKEN = re.compile(r"^(?:(?P<ddp>ddp)|(?P<stage>[0-3])(?P<opt>\+opt)?(?P<param>\+param)?)(?:@(?P<prec>fp32|bf16|fp16))?$")


@dataclass(frozen=True)
class ZeroVariant:
    label: str
    strategy: str           # "ddp" or "zero"
    stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    precision: str | None = None   # None: the run's --precision


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
            out.append(ZeroVariant(raw, "ddp", precision=m["prec"]))
            continue
        stage = int(m["stage"])
        if m["param"] and stage != 3:
            raise ConfigError(f"--stages: '{raw}' offloads parameters, which only ZeRO stage 3 partitions.")
        out.append(ZeroVariant(raw, "zero", stage, bool(m["opt"]), bool(m["param"]), m["prec"]))
    if len({v.label for v in out}) != len(out):
        raise ConfigError(f"--stages '{text}' names a variant twice.")
    return out


def variant_config(cfg: TrainConfig, variant: ZeroVariant, base_dir: str | Path) -> TrainConfig:
    """A copy of ``cfg`` for one variant, writing into ``base_dir/<label>``."""
    v = copy.deepcopy(cfg)
    v.strategy = variant.strategy
    v.zero.stage = variant.stage
    v.zero.offload_optimizer = variant.offload_optimizer
    v.zero.offload_param = variant.offload_param
    if variant.precision:
        v.precision = variant.precision
    v.output_dir = str(Path(base_dir) / variant.label)
    if v.zero.checkpoint_dir:
        v.zero.checkpoint_dir = str(Path(v.zero.checkpoint_dir) / variant.label)
    return v


def run_variants(cfg: TrainConfig, variants: list[ZeroVariant], train_one) -> dict[str, dict]:
    """Train each variant in turn inside ONE process-group session.

    Why not call ``run_training`` per variant: it destroys the process group at
    the end, and a second ``init_process_group`` under torchrun reuses the
    agent's store, whose keys from the first session point at closed sockets
    ("Connection closed by peer"). So the session is opened once here and
    ``train_one(cfg, env)`` runs a variant inside it.
    """
    from ecomkit.dist import distributed_session, seed_everything

    cfg.validate()
    summaries: dict[str, dict] = {}
    with distributed_session(timeout_s=cfg.timeout_s, seed=cfg.seed) as env:
        for variant in variants:
            v_cfg = variant_config(cfg, variant, cfg.output_dir)
            v_cfg.validate(env.world_size)
            seed_everything(v_cfg.seed, env.rank)
            summaries[variant.label] = train_one(v_cfg, env)
    return summaries


def train_in_session(cfg: TrainConfig, env, callbacks: list) -> dict:
    """One variant in an already open session: the loop's own ``train_in_session`` plus the
    fault-tolerance callbacks ``run_training`` would add (see :func:`run_variants`)."""
    from ecomkit.faults.checkpoint import add_fault_tolerance_callbacks
    from ecomkit.train.loop import train_in_session as loop_train_in_session

    return loop_train_in_session(cfg, env, add_fault_tolerance_callbacks(cfg, callbacks))
