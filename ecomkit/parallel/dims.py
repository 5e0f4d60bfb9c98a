"""Parallel degrees (dp × tp × pp) and the device mesh they span, in one small object.

Checked once by ``TrainConfig.validate``. Ranks fill a ``(pp, dp, tp)`` grid with tp innermost, so a TP group
shares a node and pipeline stages (the lightest traffic) are outermost.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ecomkit.config import TrainConfig, resolve_parallel_degrees

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data (FSDP2), tensor and pipeline parallelism; ``dp * tp * pp == world_size``."""

    dp: int
    tp: int
    pp: int
    world_size: int

    @classmethod
    def from_config(cls, cfg: TrainConfig, world_size: int) -> "ParallelDims":
        """The degrees ``cfg.strategy`` and ``cfg.parallel`` ask for on ``world_size`` processes."""
        dp, tp, pp = resolve_parallel_degrees(cfg.strategy, cfg.parallel, world_size)
        return cls(dp=dp, tp=tp, pp=pp, world_size=world_size)

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
