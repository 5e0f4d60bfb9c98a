"""The time half of the planner: step time and multi-GPU speed-up from FLOPs, bandwidths and an α-β network model.

One optimizer step on one GPU takes

    compute + exposed communication + optimizer (+ CPU offload)

- **compute** = tokens per GPU per step × FLOPs per token / (device peak ×
  efficiency). FLOPs per token are ``ecomkit.models.bloom.flops_per_token``
  (6Ψ + 12·L·h·T); activation checkpointing recomputes the forward, so it
  costs 4/3 of that. The efficiency (MFU) is an input: ~0.35-0.55 is what
  well-tuned A100/H100 runs of 1-10B models report. On a CPU the peak and the
  efficiency are replaced by a measured compute time
  (:mod:`ecomlab.measure.calibration` builds a "GPU" from measurements).
- **communication**, α-β model of ring collectives over ``N`` ranks and
  ``S`` bytes with per-message latency α and bus bandwidth ``B``:
  all-reduce ``2(N-1)·α + 2(N-1)/N · S/B``; all-gather and reduce-scatter
  ``(N-1)·α + (N-1)/N · S/B``. What each strategy sends per step: DDP
  all-reduces the fp32 gradients once per step (``no_sync`` on the other
  micro-steps); ZeRO-1 all-reduces the 16-bit gradients once, ZeRO-2 every
  micro-step (DeepSpeed's default bucket all-reduce, :data:`ZERO12_GRAD_COLLECTIVE`),
  and both all-gather the updated 16-bit weights after the step;
  ZeRO-3 and FSDP2 all-gather the weights in forward and again in backward of
  every micro-step and reduce-scatter the gradients (ZeRO-3 every micro-step,
  FSDP2 once, fp32).
- **a model split over GPUs** (tensor and pipeline parallelism, the dp × tp × pp
  mesh; :mod:`ecomkit.planner.split_time`): each GPU's share of the replica's
  FLOPs (the LM head is replicated over tp and sits on the last stage), TP's
  four all-reduces of a block's ``b·T·h`` output per block and micro-batch, the
  pipeline's sends between stages, its tied-gradient sum and its bubble
  ``(p-1)/(m+p-1)``, each priced on the link its group of ranks crosses. In a
  pipeline FSDP2 gathers per pipeline micro-batch and reduce-scatters once,
  after the schedule (torch's pipelining delays it): that reduce-scatter hides
  behind nothing.
- **overlap**: each collective can hide behind a *window* of compute, times
  ``overlap`` (the fraction of the window usable): forward all-gathers behind
  the forward passes; gradient reductions issued every micro-step behind every
  backward; a reduction issued once per step (DDP under ``no_sync``, ZeRO-1,
  FSDP2's gradients) only behind the **last** micro-step's backward. The last
  bucket, reduced with the collective the strategy really uses (all-reduce
  for DDP and ZeRO-1/2, reduce-scatter for ZeRO-3/FSDP), can never hide; ZeRO-1/2's
  all-gather after the step never hides.
- **optimizer**: Adam is memory-bound: 28 bytes read + written per local fp32
  element (param, grad, two moments) at the GPU's HBM bandwidth.
- **CPU offload** (ZeRO ``offload_optimizer``, ZeRO-3/FSDP2 ``offload_param``),
  per **node** (:class:`ecomkit.hardware.NodeSpec`): every rank's gradient
  partition goes down and its weights come back up over the node's host
  links, and GPUs behind one PCIe switch share its uplink; the node's cores,
  shared by all its ranks, run Adam on every parameter the node's ranks own.
  What DeepSpeed overlaps (deepspeed 0.19, ``runtime/zero/stage_1_and_2.py``):
  the gradient copy to the host is issued with ``non_blocking=True`` from the
  reduction path during backward (``copy_grads_in_partition`` /
  ``async_inplace_copy_grad_to_fp32_buffer_from_gpu``), so under
  ``overlap_comm`` it hides behind backward like a reduction; ``step()`` first
  waits for those copies (``_wait_for_offload_copies``), then runs the CPU Adam
  step, copies the 16-bit weights up and all-gathers them, one after the other:
  the CPU step and the weight copy are never hidden (the ZeRO-Offload paper's
  one-step delayed parameter update, which would overlap them, is not in
  DeepSpeed's ZeRO-1/2 code). With gradient accumulation DeepSpeed also moves
  each micro-step's 16-bit gradient partition to the host and back
  (``async_accumulate_grad_in_cpu_via_gpu``); the model leaves that traffic
  out, so offload predictions with ``grad_accum > 1`` are optimistic.

**Speed-up** (:func:`speedups`) compares the same training: the same global
batch per optimizer step, so one GPU accumulates N× as many micro-batches as
each of N GPUs does. Measured that way N GPUs cannot be more than N× faster:
every term of an N-GPU step is at least 1/N of the same term on one GPU
(tests/test_step_time_properties.py checks it over a grid). Parameter
offload is the one exception, and a physical one: every micro-step fetches
the parameters over PCIe, one GPU all of them through one link, N GPUs 1/N
each through their own links (the rest over NVLink), so that term shrinks
faster than 1/N, the super-linear scaling ZeRO-Infinity reports. A fixed
micro-batch per GPU instead would credit N GPUs for running the optimizer step
once per N× more samples.

GPU peaks, HBM bandwidths, link presets (*achievable* bus bandwidths, what
nccl-tests report as busbw, next to the marketing peak) and node layouts come
from the one hardware table, :mod:`ecomkit.hardware`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ecomkit.config import DEEPSPEED_PLAN_STRATEGIES
from ecomkit.errors import ConfigError
from ecomkit.hardware import (GpuSpec, LinkSpec, NodeSpec, gpu_spec, link_spec, node_cpu_adam_params_per_s,
                              node_spec)
from ecomkit.models.bloom import flops_per_token
from ecomkit.planner.collectives import COLLECTIVE_TIME, all_gather_s, all_reduce_s, reduce_scatter_s
from ecomkit.planner.memory import PlanInput, validate_plan_input
from ecomkit.planner.shapes import ModelShape, local_params, model_shape
from ecomkit.planner.split_time import (mesh_links, pipeline_microbatches, pipeline_s, replica_compute_share,
                                        tensor_parallel_s)

ADAM_BYTES_PER_ELEMENT = 28           # fp32 param, grad, exp_avg, exp_avg_sq read; param and moments written
DEFAULT_EFFICIENCY = 0.45
DEFAULT_OVERLAP = 0.9
GPUS_PER_NODE = 8                     # the reference nodes (ecomkit.hardware.NODES) hold 8 GPUs
CPU_ADAM_PARAMS_PER_S = 2.0e9         # DeepSpeedCPUAdam, a 128-core node (ecomkit.hardware; an assumption)
WINDOWS = ("forward", "backward", "backward_last", "exposed")


# ---------------------------------------------------------------------- step time
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


# DeepSpeed's ZeRO-1/2 reduce gradients with an all-reduce of each bucket, every rank then keeping its own
# partition: ``zero_optimization.use_multi_rank_bucket_allreduce`` defaults to true (deepspeed 0.19,
# runtime/zero/stage_1_and_2.py ``average_tensor`` → ``allreduce_and_scatter``). Counted on a 2-rank ZeRO-2
# step: one all-reduce of Ψ gradient elements and one all-gather of Ψ weights, no reduce-scatter. (With the
# option off it issues one ``dist.reduce`` per destination rank: the bytes of a reduce-scatter.) ZeRO-3 does
# reduce-scatter (``reduce_scatter_tensor``).
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
    # a pipeline gathers per pipeline micro-batch and reduce-scatters after its schedule: nothing left to hide behind
    gathers, reduced_in = (pipeline_microbatches(inp)[0], "exposed") if inp.pp > 1 else (acc, "backward_last")
    return {"weight all-gather (fwd)": ("all_gather", gathers * pw * psi, "forward"),
            "weight all-gather (bwd)": ("all_gather", gathers * pw * psi, "backward"),
            "grad reduce-scatter (fp32)": ("reduce_scatter", 4 * psi, reduced_in)}


def last_bucket(inp: PlanInput, shape: ModelShape, bucket_bytes: float) -> tuple[str, float]:
    """(collective, bytes) of the gradient reduction issued after the last gradient exists: it cannot hide.

    DDP all-reduces its last bucket (``bucket_bytes``, torch's 25 MiB
    default); ZeRO reduce-scatters its last ``reduce_bucket_size`` bucket
    (``inp.zero_bucket_elements`` elements); FSDP2 reduce-scatters the root
    unit last (the embedding and final norm: the first used in forward).
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

    Forward collectives hide behind ``overlap × forward``. Backward ones share
    the backward: those issued once per step fit only in the last micro-step's
    window, the rest in what is left of the whole backward. The backward
    group never exposes less than ``floor_s`` (the last bucket).
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

    ``node`` (default: the usual system of ``inp.gpu``) gives the host links
    and CPU cores for offload; ``host_link`` and ``cpu_adam_params_per_s``
    (the whole node's rate) override its figures. ``collective_links`` prices
    one kind of collective (``all_gather``, ``reduce_scatter``,
    ``all_reduce``) on its own fitted link, where a library's collectives are
    not equally efficient (gloo's all-gather and reduce-scatter on a CPU).
    ``intra_node_link`` and ``gpus_per_node`` (a cluster of several nodes):
    groups of ranks inside one node use that link, the others ``link``
    (:func:`ecomkit.planner.split_time.mesh_links`).
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
        # host copies share the compute windows with the collectives; what they add to the exposure is theirs
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
    """Host-link seconds (on the busiest uplink of the node) and the node's CPU-Adam parameters; None without offload.

    Ranks fill a node's GPUs in order, so the first ``gpus_per_host_link``
    ranks share one uplink; every rank of the node moves its own partition.
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

    One GPU accumulates ``grad_accum × dp`` micro-batches where each of the N
    GPUs accumulates ``grad_accum``; tensor/pipeline degrees stay those of
    ``inp`` on N GPUs and are 1 on one GPU.
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
