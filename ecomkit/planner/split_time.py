"""Step-time terms of a model split over GPUs: tensor and pipeline parallelism, alone or in a dp × tp × pp mesh.

Why apart from :mod:`ecomkit.planner.step_time`: these terms depend on where each group of ranks sits and how the stages
divide the blocks. Modelled: each GPU's compute share (the head is whole on every tp rank of the last stage), the link
of each mesh dimension (tp innermost), TP's activation all-reduces and the pipeline's boundary sends.
"""

from __future__ import annotations

from dataclasses import dataclass

from ecomkit.planner.links import LinkSpec
from ecomkit.models.bloom import flops_per_token
from ecomkit.parallel.pipeline import stage_layer_ranges
from ecomkit.planner.collectives import all_reduce_s
from ecomkit.planner.memory import PlanInput
from ecomkit.planner.shapes import ModelShape


@dataclass(frozen=True)
class MeshLinks:
    """The link each mesh dimension's collectives run over."""

    tp: LinkSpec
    dp: LinkSpec
    pp: LinkSpec


def mesh_links(inp: PlanInput, link: LinkSpec, intra_node_link: LinkSpec | None = None,
               gpus_per_node: int | None = None) -> MeshLinks:
    """``link`` for every group, or, given the node's link and size, that link for the groups inside one node."""
    if intra_node_link is None or not gpus_per_node:
        return MeshLinks(link, link, link)

    def over(span: int) -> LinkSpec:
        return intra_node_link if span <= gpus_per_node and gpus_per_node % span == 0 else link

    return MeshLinks(tp=over(inp.tp), dp=over(inp.tp * inp.dp), pp=over(inp.world_size))


def pipeline_microbatches(inp: PlanInput) -> tuple[int, float]:
    """(micro-batches per step, sequences in each) of one replica: the step's samples cut into ``m``."""
    m = inp.pp_microbatches or inp.pp
    return m, inp.micro_batch * inp.grad_accum / m


def replica_compute_share(inp: PlanInput, shape: ModelShape) -> float:
    """Share of a replica's FLOPs per token that one of its GPUs runs on the critical path (1 for tp = pp = 1)."""
    if inp.tp == 1 and inp.pp == 1:
        return 1.0
    total = flops_per_token(shape.n_params, shape.n_layer, shape.hidden, inp.seq_len)
    head = 6.0 * shape.vocab * shape.hidden
    ranges = stage_layer_ranges(shape.n_layer, inp.pp, inp.head_blocks(shape)) if inp.pp > 1 else [(0, shape.n_layer)]
    stages = [(total - head) * (hi - lo) / shape.n_layer / inp.tp for lo, hi in ranges]
    stages[-1] += head
    return max(stages) / total


def _activation_bytes(inp: PlanInput) -> int:
    return 4 if inp.precision == "fp32" else 2


def tensor_parallel_s(inp: PlanInput, shape: ModelShape, link: LinkSpec) -> float:
    """Seconds of TP's activation all-reduces per step, over the ``tp`` ranks of a replica."""
    if inp.tp <= 1:
        return 0.0
    count, batch = pipeline_microbatches(inp) if inp.pp > 1 else (inp.grad_accum, inp.micro_batch)
    blocks = -(-shape.n_layer // inp.pp)
    per_block = 6 if inp.activation_checkpointing else 4
    message = batch * inp.seq_len * shape.hidden * _activation_bytes(inp)
    return count * blocks * per_block * all_reduce_s(message, inp.tp, link)


def pipeline_s(inp: PlanInput, shape: ModelShape, link: LinkSpec) -> dict[str, float]:
    """Seconds of the pipeline's sends per step (a middle stage's critical path) and of its tied-gradient sum."""
    if inp.pp <= 1:
        return {}
    m, batch = pipeline_microbatches(inp)
    message = batch * inp.seq_len * shape.hidden * _activation_bytes(inp)
    hop = link.latency_s + message / link.bus_bytes_per_s
    tied = 4 * shape.vocab * shape.hidden / inp.dp      # the fp32 gradient shard of the tied embedding
    return {"PP activation send/recv (critical path)": 2 * m * hop,
            "PP tied-embedding gradient all-reduce": all_reduce_s(tied, 2, link)}


__all__ = ["MeshLinks", "mesh_links", "pipeline_microbatches", "replica_compute_share", "tensor_parallel_s",
           "pipeline_s"]
