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
from typing import Any, Sequence

from ecomkit.errors import ConfigError

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
        from ecomkit.models.bloom import PRESETS

        if model in PRESETS:
            preset = PRESETS[model]
            dims.validate_for_model(preset.n_head, preset.n_layer, where=f"preset '{model}'")
    return dims


# ---------------------------------------------------------------------- which layout for which model
# Memory per GPU comes from the repository's planner (ecomkit.planner.memory, chapter 06), which follows this
# chapter's TP plan and pipeline split parameter by parameter; this section adds the bytes each layout
# sends per step and the rule that picks one.


@dataclass(frozen=True)
class Layout:
    """A candidate way to use ``gpus`` GPUs: the degrees, and whether dp replicas shard (FSDP2) or replicate (DDP)."""

    name: str
    dp: int
    tp: int = 1
    pp: int = 1
    sharded: bool = True

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def planner_strategy(self) -> str:
        """The ``ecomkit.planner.memory`` strategy name for this layout (TP/PP shard their dp replicas with FSDP2)."""
        if not self.sharded:
            return "ddp"
        if self.tp > 1:
            return "tp"
        return "pp" if self.pp > 1 else "fsdp2"


def replica_parameters(shape: Any, layout: Layout) -> int:
    """Parameters one rank of the most loaded pipeline stage holds before FSDP sharding (its tp slice)."""
    from ecomkit.planner.memory import local_params

    return max(sum(p.numel for p in local_params(shape, layout.tp, layout.pp, stage)) for stage in range(layout.pp))


def comm_bytes_per_gpu_step(shape: Any, layout: Layout, micro_batch: int, seq_len: int) -> dict[str, float]:
    """Estimated bytes one GPU sends per optimizer step (ring algorithms; bf16 activations/params, fp32 grads).

    The global batch is ``gpus × micro_batch`` sequences for every layout, so a
    replica processes ``micro_batch × tp × pp`` of them.

    - DDP: all-reduce of fp32 gradients, ``2(d-1)/d · 4Ψ``, overlapped with backward;
    - FSDP2: bf16 all-gather in forward and again in backward, fp32
      reduce-scatter: ``(d-1)/d · (2·2 + 4)·Ψ_local``, overlapped by prefetching;
    - TP: 4 all-reduces of the ``b·s·h`` bf16 activations per block (2 in
      forward, 2 in backward), ``2(t-1)/t`` each, on the critical path;
    - PP: each stage boundary sends activations forward and their gradients
      back (``2 · b·s·h`` bf16), plus the tied-embedding gradient all-reduce
      between the first and the last stage; and a bubble of ``(p-1)/(m+p-1)``.
    """
    h, s = shape.hidden, seq_len
    b = micro_batch * layout.tp * layout.pp
    local = replica_parameters(shape, layout)
    d, t, p = layout.dp, layout.tp, layout.pp
    out = {"data_parallel": 0.0, "tensor_parallel": 0.0, "pipeline": 0.0}
    if d > 1:
        ring = (d - 1) / d
        out["data_parallel"] = ring * (2 * 2 + 4) * local if layout.sharded else 2 * ring * 4 * local
    if t > 1:
        blocks = -(-shape.n_layer // p)
        out["tensor_parallel"] = blocks * 4 * 2 * (t - 1) / t * 2 * b * s * h
    if p > 1:
        out["pipeline"] = 2 * 2 * b * s * h + 4 * shape.vocab * h
    out["total"] = sum(out.values())
    return out


# simplest first: communication that overlaps with compute (DP, FSDP) beats communication on the
# critical path of every layer (TP, fast only inside an NVLink node) and pipeline bubbles (PP)
PREFERENCE = ("DP (DDP)", "ZeRO-3 / FSDP2", "TP 2 × FSDP", "TP", "PP")


def candidate_layouts(n_gpus: int, n_head: int, n_layer: int) -> list[Layout]:
    """DDP, FSDP2, TP 2 × FSDP over the rest, TP and PP over all GPUs (those the model's shape allows)."""
    out = [Layout("DP (DDP)", dp=n_gpus, sharded=False), Layout("ZeRO-3 / FSDP2", dp=n_gpus)]
    if n_gpus >= 4 and n_head % 2 == 0:
        out.append(Layout(f"TP 2 × FSDP {n_gpus // 2}", dp=n_gpus // 2, tp=2))
    if n_head % n_gpus == 0:
        out.append(Layout(f"TP {n_gpus}", dp=1, tp=n_gpus))
    if n_gpus <= n_layer:
        out.append(Layout(f"PP {n_gpus} (1F1B)", dp=1, pp=n_gpus))
    return out


def _preference(layout_name: str) -> int:
    return next(i for i, prefix in enumerate(PREFERENCE) if layout_name.startswith(prefix))


def decision_table(models: Sequence[str], gpu_counts: Sequence[int], gpu: str = "a100-80g", micro_batch: int = 4,
                   seq_len: int = 1024, precision: str = "bf16", activation_checkpointing: bool = False
                   ) -> list[dict[str, Any]]:
    """One row per (model, GPUs, layout): memory per GPU and bytes sent per step, and which layout to pick.

    Same work per step for every layout: the global batch is ``gpus ×
    micro_batch`` sequences of ``seq_len`` tokens, so a TP or PP replica
    processes ``micro_batch × tp × pp`` of them. Memory per GPU (model states,
    activations, temporaries such as the logits) is ``ecomkit.planner.memory.plan_memory``
    for the most loaded rank; *fits* is its verdict for ``gpu``. The pick, per
    (model, GPUs), is the first fitting layout in :data:`PREFERENCE` order.
    Nothing here is typed in: Ψ and every parameter's shape come from the
    presets built on the meta device.
    """
    from ecomkit.planner.memory import model_shape, plan_memory

    rows = []
    for name in models:
        shape = model_shape(name)
        for n in gpu_counts:
            group = []
            for layout in candidate_layouts(n, shape.n_head, shape.n_layer):
                plan = plan_memory(model=name, world_size=n, strategy=layout.planner_strategy, tp=layout.tp,
                                   pp=layout.pp, precision=precision, micro_batch=micro_batch * layout.tp * layout.pp,
                                   seq_len=seq_len, gpu=gpu, activation_checkpointing=activation_checkpointing)
                comm = comm_bytes_per_gpu_step(shape, layout, micro_batch, seq_len)
                group.append({"model": name, "gpus": n, "layout": layout.name + (" +AC" if activation_checkpointing else ""),
                              "dp": layout.dp, "tp": layout.tp,
                              "pp": layout.pp, "state_gb": plan.model_states / 1e9,
                              "activation_gb": (plan.activation_total + plan.temporary_total) / 1e9,
                              "total_gb": plan.total / 1e9, "fits": plan.fits,
                              "comm_gb_per_step": comm["total"] / 1e9})
            fitting = sorted((r for r in group if r["fits"]), key=lambda r: _preference(r["layout"]))
            for r in group:
                r["pick"] = bool(fitting) and r is fitting[0]
            rows.extend(group)
    return rows
