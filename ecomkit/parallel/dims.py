"""Parallel degrees (dp × tp × pp) in one small object, validated before anything is built.

Why one object (torchtitan's ``ParallelDims``): the degrees decide the device
mesh, which ranks share data, how the model is cut and which collectives run.
Checking them once, up front, turns "rank 3 crashed in a reshape" into one
sentence that names the flag to change.

Rank layout: ranks fill a ``(pp, dp, tp)`` grid with **tp innermost**, so the
ranks of one tensor-parallel group are neighbours (on a GPU server: the same
node, where NVLink makes TP's per-layer all-reduces affordable), and pipeline
stages are outermost (their point-to-point traffic is the lightest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

MESH_DIMS = ("pp", "dp", "tp")
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data (FSDP2), tensor and pipeline parallelism; ``dp * tp * pp == world_size``."""

    dp: int
    tp: int
    pp: int
    world_size: int

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"parallel.{name}={value!r} must be a whole number >= 1 (flag --parallel-{name}"
                    f"{'' if name == 'world_size' else f' or --{name}'}).")
        if self.dp * self.tp * self.pp != self.world_size:
            raise ConfigError(
                f"The parallel degrees do not multiply to the number of processes: dp={self.dp} × tp={self.tp} × "
                f"pp={self.pp} = {self.dp * self.tp * self.pp}, but torchrun started {self.world_size}. Change "
                f"--parallel-dp/--parallel-tp/--parallel-pp (or --dp/--tp/--pp) so that their product is "
                f"{self.world_size}, set --parallel-dp -1 to let dp take whatever is left, or launch "
                f"--nproc_per_node {self.dp * self.tp * self.pp}.")

    # ------------------------------------------------------------------ model checks
    def validate_for_model(self, n_head: int, n_layer: int, where: str = "the model") -> "ParallelDims":
        """Reject degrees the model's shape cannot take (heads split by tp, layers by pp)."""
        if n_head % self.tp:
            divisors = [d for d in range(1, n_head + 1) if n_head % d == 0]
            raise ConfigError(
                f"Tensor parallelism splits the attention heads between ranks, but tp={self.tp} does not divide "
                f"the {n_head} heads of {where} (config field n_head). Use --parallel-tp (or --tp) with one of "
                f"{divisors}.")
        if self.pp > n_layer:
            raise ConfigError(
                f"Pipeline parallelism gives each stage at least one transformer block, but pp={self.pp} is larger "
                f"than the {n_layer} blocks of {where} (config field n_layer). Use --parallel-pp (or --pp) "
                f"<= {n_layer}.")
        return self

    # ------------------------------------------------------------------ layout
    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    def coordinates(self, rank: int) -> dict[str, int]:
        """``{"pp": i, "dp": j, "tp": k}`` of a global rank in the (pp, dp, tp) grid."""
        tp_i = rank % self.tp
        dp_i = (rank // self.tp) % self.dp
        pp_i = rank // (self.tp * self.dp)
        return {"pp": pp_i, "dp": dp_i, "tp": tp_i}

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    @property
    def model_replicas(self) -> int:
        """Ranks that hold pieces of one model copy and therefore see the same data (tp × pp)."""
        return self.tp * self.pp

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        return " × ".join(parts) + f" = {self.world_size} processes"

    def build_mesh(self, device_type: str) -> Any:
        """The 3-D ``DeviceMesh`` (dims named pp, dp, tp); size-1 dims are kept so names always resolve."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, self.shape, mesh_dim_names=MESH_DIMS)


def resolve_parallel_dims(strategy: str, parallel: Any, world_size: int) -> ParallelDims:
    """Turn ``cfg.strategy`` + ``cfg.parallel`` into degrees for ``world_size`` processes.

    Rules (all explicit degrees win):
    - ``dp=-1`` means "whatever is left": ``world / (tp·pp)``;
    - ``--strategy tp`` with tp left at 1 uses every process for TP (and
      ``--strategy pp`` likewise for PP), so ``torchrun -n 2 ... --strategy tp``
      just works;
    - ``--strategy fsdp`` is data parallel (FSDP2) over all remaining ranks.
    """
    tp, pp, dp = int(parallel.tp), int(parallel.pp), int(parallel.dp)
    if strategy == "tp" and tp == 1 and dp == -1:
        tp = max(1, world_size // pp)
    if strategy == "pp" and pp == 1 and dp == -1:
        pp = max(1, world_size // tp)
    if dp == -1:
        if tp < 1 or pp < 1 or world_size % (tp * pp):
            raise ConfigError(
                f"--parallel-dp -1 takes the processes left after tp and pp, but tp={tp} × pp={pp} does not divide "
                f"the {world_size} processes. Choose tp and pp whose product divides {world_size}.")
        dp = world_size // (tp * pp)
    return ParallelDims(dp=dp, tp=tp, pp=pp, world_size=world_size)


def validate_parallel_config(strategy: str, parallel: Any, world_size: int, precision: str = "fp32",
                             model: str | None = None) -> ParallelDims:
    """Every check that needs no process group: degrees, schedule, micro-batches, model shape of a preset.

    Called by the chapter-04 script before ``run_training`` (so a typo costs no
    start-up) and again by the strategy, which also checks a model loaded from
    a directory once its config is known.
    """
    dims = resolve_parallel_dims(strategy, parallel, world_size)
    if parallel.pp_schedule not in SCHEDULES:
        raise ConfigError(f"Unknown parallel.pp_schedule '{parallel.pp_schedule}' (flag --parallel-pp-schedule). "
                          f"Choose one of: {', '.join(SCHEDULES)}.")
    if parallel.pp_microbatches < 1:
        raise ConfigError(f"parallel.pp_microbatches={parallel.pp_microbatches} must be >= 1 "
                          "(flag --parallel-pp-microbatches).")
    if dims.pp > 1 and dims.tp > 1:
        raise ConfigError(
            f"pp={dims.pp} together with tp={dims.tp} is not implemented in ecomkit: combine pipeline stages with "
            "data parallelism (--pp 2 --dp 2), or TP with data parallelism (--tp 2 --dp 2). torchtitan shows the "
            "3-D version, which applies TP to every stage module.")
    if precision == "fp16":
        raise ConfigError(
            "precision fp16 needs a loss scaler that understands sharded (DTensor) gradients, which the FSDP2/TP/PP "
            "strategies here do not set up. Use --precision bf16 (same memory, no loss scaling) or fp32.")
    if model is not None:
        from ..models import PRESETS

        if model in PRESETS:
            preset = PRESETS[model]
            dims.validate_for_model(preset.n_head, preset.n_layer, where=f"preset '{model}'")
    return dims
