"""Parallel degrees (dp × tp × pp) and the device mesh they span, in one small object.

Why one object (torchtitan's ``ParallelDims``): the degrees decide the device
mesh, which ranks share data, how the model is cut and which collectives run.
They are resolved and checked once, up front, by ``TrainConfig.validate``
(``ecomkit.config.validate``), which turns "rank 3 crashed in a reshape" into
one sentence that names the flag to change; this module only lays them out.

Rank layout: ranks fill a ``(pp, dp, tp)`` grid with **tp innermost**, so the
ranks of one tensor-parallel group are neighbours (on a GPU server: the same
node, where NVLink makes TP's per-layer all-reduces affordable), and pipeline
stages are outermost (their point-to-point traffic is the lightest).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ecomkit.config import TrainConfig, resolve_parallel_degrees

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data (FSDP2), tensor and pipeline parallelism; ``dp * tp * pp == world_size``.

    Build it with :meth:`from_config`: the degrees are resolved and checked by
    ``ecomkit.config`` (``TrainConfig.validate``), before any process group exists.
    """

    dp: int
    tp: int
    pp: int
    world_size: int

    @classmethod
    def from_config(cls, cfg: TrainConfig, world_size: int) -> "ParallelDims":
        """The degrees ``cfg.strategy`` and ``cfg.parallel`` ask for on ``world_size`` processes."""
        dp, tp, pp = resolve_parallel_degrees(cfg.strategy, cfg.parallel, world_size)
        return cls(dp=dp, tp=tp, pp=pp, world_size=world_size)

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

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The 3-D ``DeviceMesh`` (dims named pp, dp, tp); size-1 dims are kept so names always resolve."""
        return init_device_mesh(device_type, self.shape, mesh_dim_names=MESH_DIMS)
