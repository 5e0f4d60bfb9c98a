"""The time half of the planner: step time and multi-GPU speed-up from FLOPs, bandwidths and an α-β network model.

One step on one GPU = compute + exposed communication + optimizer (+ CPU offload); each collective hides behind a window
of compute times ``overlap``, the last gradient bucket never. Why a model: it ranks setups before any GPU is rented; the
terms, what DeepSpeed overlaps and why N GPUs are at most N× faster are in docs/planner.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ecomkit.config import DEEPSPEED_PLAN_STRATEGIES
from ecomkit.errors import ConfigError
from ecomkit.hardware import GpuSpec, gpu_spec
from ecomkit.planner.links import LinkSpec, NodeSpec, link_spec, node_cpu_adam_params_per_s, node_spec
from ecomkit.models.bloom import flops_per_token
from ecomkit.planner.collectives import COLLECTIVE_TIME, all_gather_s, all_reduce_s, reduce_scatter_s
from ecomkit.planner.memory import PlanInput, validate_plan_input
from ecomkit.planner.shapes import ModelShape, local_params, model_shape
from ecomkit.planner.split_time import (mesh_links, pipeline_microbatches, pipeline_s, replica_compute_share,
                                        tensor_parallel_s)

ADAM_BYTES_PER_ELEMENT = 28           # fp32 param, grad, exp_avg, exp_avg_sq read; param and moments written
DEFAULT_EFFICIENCY = 0.45
DEFAULT_OVERLAP = 0.9
GPUS_PER_NODE = 8                     # the reference nodes (ecomkit.planner.links.NODES) hold 8 GPUs
CPU_ADAM_PARAMS_PER_S = 2.0e9         # DeepSpeedCPUAdam, a 128-core node (ecomkit.planner.links; an assumption)
WINDOWS = ("forward", "backward", "backward_last", "exposed")


@dataclass
class StepTime:
    """Seconds of one optimizer step on one GPU, by part, and what it implies."""

    compute_s: float
    backward_s: float
    comm_s: float
    comm_exposed_s: float
    optimizer_s: float
    offload_s: float
    tokens_per_gpu: int
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_exposed_s + self.optimizer_s + self.offload_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_gpu / self.total_s


# ZeRO-1/2 all-reduce each gradient bucket (DeepSpeed's use_multi_rank_bucket_allreduce default); ZeRO-3
# reduce-scatters.
ZERO12_GRAD_COLLECTIVE = "all_reduce"


def comm_volume(inp: PlanInput, shape: ModelShape) -> dict[str, tuple[str, float, str]]:
    """Collectives of one step: name → (kind, bytes, window it can hide behind: one of :data:`WINDOWS`)."""
    psi = shape.n_params / (inp.tp * inp.pp)
    s, acc = inp.strategy, inp.grad_accum
    w = 4 if inp.precision == "fp32" else 2
    if s == "ddp":
        return {"grad all-reduce (fp32)": ("all_reduce", 4 * psi, "backward_last")}
    if s == "zero1":   # DeepSpeed's default bucket all-reduce: see ZERO12_GRAD_COLLECTIVE
        return {"grad all-reduce": (ZERO12_GRAD_COLLECTIVE, w * psi, "backward_last"),
                "weight all-gather after step": ("all_gather", w * psi, "exposed")}
    if s == "zero2":
        return {"grad all-reduce": (ZERO12_GRAD_COLLECTIVE, acc * w * psi, "backward"),
                "weight all-gather after step": ("all_gather", w * psi, "exposed")}
    if s == "zero3":
        return {"weight all-gather (fwd)": ("all_gather", acc * w * psi, "forward"),
                "weight all-gather (bwd)": ("all_gather", acc * w * psi, "backward"),
                "grad reduce-scatter": ("reduce_scatter", acc * w * psi, "backward")}
    pw = 2 if inp.precision != "fp32" else 4
    # a pipeline reduce-scatters after its schedule: nothing left to hide behind
    gathers, reduced_in = (pipeline_microbatches(inp)[0], "exposed") if inp.pp > 1 else (acc, "backward_last")
    return {"weight all-gather (fwd)": ("all_gather", gathers * pw * psi, "forward"),
            "weight all-gather (bwd)": ("all_gather", gathers * pw * psi, "backward"),
            "grad reduce-scatter (fp32)": ("reduce_scatter", 4 * psi, reduced_in)}


def last_bucket(inp: PlanInput, shape: ModelShape, bucket_bytes: float) -> tuple[str, float]:
    """(collective, bytes) of the gradient reduction issued after the last gradient exists: it cannot hide.

    DDP's last ``bucket_bytes`` bucket, ZeRO's last ``reduce_bucket_size`` bucket, FSDP2's root unit.
    """
    psi = shape.n_params / (inp.tp * inp.pp)
    w = 4 if inp.precision == "fp32" else 2
    if inp.strategy == "ddp":
        return "all_reduce", min(bucket_bytes, 4 * psi)
    if inp.strategy in ("zero1", "zero2"):
        return ZERO12_GRAD_COLLECTIVE, w * min(inp.zero_bucket_elements, psi)
    if inp.strategy in DEEPSPEED_PLAN_STRATEGIES:
        return "reduce_scatter", w * min(inp.zero_bucket_elements, psi)
    root = sum(p.numel for p in local_params(shape, inp.tp, inp.pp, 0) if p.layer < 0 or p.layer == shape.n_layer)
    return "reduce_scatter", 4 * root


def hidden_exposed(times: dict[str, float], forward_s: float, backward_s: float, backward_last_s: float,
                   overlap: float, floor_s: float = 0.0) -> float:
    """Exposed seconds of collectives grouped by window (:data:`WINDOWS`), given the compute windows.

    Once-per-step reductions fit only the last micro-step's backward; the backward group exposes at least ``floor_s``.
    """
    t_f, t_b, t_l = (times.get(k, 0.0) for k in ("forward", "backward", "backward_last"))
    exposed_f = max(t_f - overlap * forward_s, 0.0)
    hid_last = min(t_l, overlap * backward_last_s)
    hid_all = min(t_b, max(overlap * backward_s - hid_last, 0.0))
    exposed_b = t_b + t_l - hid_last - hid_all
    if t_b + t_l > 0:
        exposed_b = max(exposed_b, min(t_b + t_l, floor_s))
    return exposed_f + exposed_b + times.get("exposed", 0.0)


def predict_step_time(inp: PlanInput, *, link: str | LinkSpec = "nvlink-a100", efficiency: float = DEFAULT_EFFICIENCY,
                      overlap: float = DEFAULT_OVERLAP, bucket_bytes: float = 25 * 2**20,
                      node: str | NodeSpec | None = None, host_link: str | LinkSpec | None = None,
                      cpu_adam_params_per_s: float | None = None, peak_flops: float | None = None,
                      hbm_bytes_per_s: float | None = None, shape: ModelShape | None = None,
                      collective_links: dict[str, LinkSpec] | None = None,
                      intra_node_link: str | LinkSpec | None = None, gpus_per_node: int | None = None) -> StepTime:
    """Predict one optimizer step on one GPU of ``inp`` (data parallel over ``inp.dp`` GPUs).

    ``node``, ``host_link`` and ``cpu_adam_params_per_s`` price offload; ``collective_links`` prices one kind of
    collective on its own fitted link (gloo on a CPU); ``intra_node_link`` and ``gpus_per_node`` time groups inside a
    node on that link (:func:`ecomkit.planner.split_time.mesh_links`).
    """
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    validate_plan_input(inp, shape)
    if not 0 < efficiency <= 1:
        raise ConfigError(f"efficiency={efficiency} must be in (0, 1]: the fraction of the peak FLOP/s reached.")
    if not 0 <= overlap <= 1:
        raise ConfigError(f"overlap={overlap} must be in [0, 1]: the fraction of backward that can hide communication.")
    gpu: GpuSpec = gpu_spec(inp.gpu)
    lk = link_spec(link)
    nd = node_spec(node, gpu)
    host = link_spec(host_link if host_link is not None else nd.host_link)
    cpu_rate = cpu_adam_params_per_s if cpu_adam_params_per_s is not None else node_cpu_adam_params_per_s(nd)
    peak = peak_flops if peak_flops is not None else gpu.peak_flops(inp.precision)   # bf16 on V100: ConfigError
    tokens = inp.micro_batch * inp.seq_len * inp.grad_accum
    flops = tokens * flops_per_token(shape.n_params, shape.n_layer, shape.hidden, inp.seq_len)
    flops *= (4 / 3 if inp.activation_checkpointing else 1.0) * replica_compute_share(inp, shape)
    compute = flops / (peak * efficiency)
    if inp.pp > 1:
        compute *= 1 + (inp.pp - 1) / pipeline_microbatches(inp)[0]   # pipeline bubble
    backward = compute * (2 / 3 if not inp.activation_checkpointing else 3 / 4)
    forward = compute - backward
    backward_last = backward / inp.grad_accum

    mesh = mesh_links(inp, lk, link_spec(intra_node_link) if intra_node_link is not None else None, gpus_per_node)
    links = {kind: (collective_links or {}).get(kind, mesh.dp) for kind in COLLECTIVE_TIME}
    parts: dict[str, float] = {}
    by_window = {k: 0.0 for k in WINDOWS}
    for name, (kind, nbytes, window) in comm_volume(inp, shape).items():
        t = COLLECTIVE_TIME[kind](nbytes, inp.dp, links[kind])
        parts[name] = t
        by_window[window] += t
    kind, nbytes = last_bucket(inp, shape, bucket_bytes)
    floor = COLLECTIVE_TIME[kind](nbytes, inp.dp, links[kind]) if inp.pp == 1 else 0.0   # pp: counted exposed
    comm_total = sum(by_window.values())
    comm_exposed = hidden_exposed(by_window, forward, backward, backward_last, overlap, floor)
    split = {"TP activation all-reduces (critical path)": tensor_parallel_s(inp, shape, mesh.tp),
             **pipeline_s(inp, shape, mesh.pp)}
    for name, t in split.items():   # on the critical path: never hidden
        if t:
            parts[name] = t
            comm_total, comm_exposed = comm_total + t, comm_exposed + t

    optimizer, offload = 0.0, 0.0
    off = _offload_traffic(inp, shape, nd, host)
    if off is None:
        optimizer = ADAM_BYTES_PER_ELEMENT * _local_params(inp, shape) / (hbm_bytes_per_s or gpu.hbm_bytes_per_s)
    else:
        # host copies share the compute windows with the collectives
        with_copies = dict(by_window)
        with_copies[off["grad_window"]] += off["grad_down_s"]
        with_copies["forward"] += off["fetch_fwd_s"]
        with_copies["backward"] += off["fetch_bwd_s"]
        copies_exposed = hidden_exposed(with_copies, forward, backward, backward_last, overlap, floor) - comm_exposed
        cpu_s = off["node_params"] / cpu_rate
        offload = copies_exposed + cpu_s + off["weights_up_s"]
        parts.update({"offload: gradient copy to host": off["grad_down_s"],
                      "offload: CPU Adam (node)": cpu_s, "offload: weights back to GPU": off["weights_up_s"],
                      "offload: parameter fetch from host": off["fetch_fwd_s"] + off["fetch_bwd_s"]})
    return StepTime(compute, backward, comm_total, comm_exposed, optimizer, offload, tokens, parts)


def _local_params(inp: PlanInput, shape: ModelShape) -> float:
    psi = shape.n_params / (inp.tp * inp.pp)
    return psi if inp.strategy == "ddp" else psi / inp.dp


def _offload_traffic(inp: PlanInput, shape: ModelShape, node: NodeSpec, host: LinkSpec) -> dict[str, Any] | None:
    """Host-link seconds (busiest uplink of the node) and the node's CPU-Adam parameters; None without offload.

    Ranks fill a node's GPUs in order, so the first ``gpus_per_host_link`` share one uplink.
    """
    deepspeed = inp.strategy in DEEPSPEED_PLAN_STRATEGIES and inp.offload_optimizer
    torch_offload = inp.strategy in ("fsdp2", "tp", "pp") and inp.offload_param
    if not (deepspeed or torch_offload):
        return None
    local = _local_params(inp, shape)
    w = 4 if inp.precision == "fp32" else 2
    ranks_on_node = min(inp.world_size, node.gpus)
    per_link = min(ranks_on_node, node.gpus_per_host_link)
    bw = host.bus_bytes_per_s
    acc = inp.grad_accum
    if deepspeed:
        grad_down = 4 * local                                 # the fp32 gradient partition, at the boundary
        weights_up = 0.0 if inp.offload_param else w * local  # ZeRO-3 + offload_param: weights stay on the host
        fetch = w * local if inp.strategy == "zero3" and inp.offload_param else 0.0
        window = "backward" if inp.strategy == "zero3" else "backward_last"   # ZeRO-1/2: the boundary's backward
    else:                                                      # FSDP2 CPUOffloadPolicy: fp32 shards on the host
        grad_down, weights_up, fetch, window = 4 * local, 0.0, 4 * local, "backward_last"
    return {"grad_down_s": per_link * grad_down / bw, "weights_up_s": per_link * weights_up / bw,
            "fetch_fwd_s": per_link * acc * fetch / bw, "fetch_bwd_s": per_link * acc * fetch / bw,
            "grad_window": window, "node_params": ranks_on_node * local}


def speedups(inp: PlanInput, gpu_counts: list[int], **kwargs: Any) -> list[dict[str, Any]]:
    """Speed-up of N GPUs over 1 on the same training (same global batch per optimizer step), per N.

    One GPU accumulates ``grad_accum × dp`` micro-batches; tensor/pipeline degrees are ``inp``'s on N GPUs, 1 on one.
    """
    inp = inp.resolved()
    rows = []
    for n in gpu_counts:
        run = replace(inp, world_size=n)
        st = predict_step_time(run, **kwargs)
        base_inp = replace(inp, world_size=1, tp=1, pp=1, pp_microbatches=0, grad_accum=inp.grad_accum * run.dp,
                           strategy=inp.strategy if inp.strategy not in ("tp", "pp") else "fsdp2")
        base = predict_step_time(base_inp, **kwargs)
        speedup = base.total_s / st.total_s
        rows.append({"gpus": n, "step_s": st.total_s, "single_gpu_step_s": base.total_s, "speedup": speedup,
                     "efficiency": speedup / n, "compute_s": st.compute_s, "comm_exposed_s": st.comm_exposed_s,
                     "optimizer_s": st.optimizer_s + st.offload_s})
    return rows


__all__ = ["all_reduce_s", "all_gather_s", "reduce_scatter_s", "StepTime", "comm_volume", "last_bucket",
           "tensor_parallel_s",
           "hidden_exposed", "predict_step_time", "speedups", "ADAM_BYTES_PER_ELEMENT",
           "DEFAULT_EFFICIENCY", "DEFAULT_OVERLAP", "CPU_ADAM_PARAMS_PER_S", "GPUS_PER_NODE", "WINDOWS",
           "ZERO12_GRAD_COLLECTIVE", "COLLECTIVE_TIME"]
