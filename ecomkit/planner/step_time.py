"""The time half of the planner: step time and multi-GPU speed-up from FLOPs, bandwidths and an α-β network model.

One optimizer step on one GPU takes

    compute + exposed communication + optimizer (+ CPU offload)

- **compute** = tokens per GPU per step × FLOPs per token / (device peak ×
  efficiency). FLOPs per token are ``ecomkit.models.bloom.flops_per_token``
  (6Ψ + 12·L·h·T); activation checkpointing recomputes the forward, so it
  costs 4/3 of that. The efficiency (MFU) is an input: ~0.35-0.55 is what
  well-tuned A100/H100 runs of 1-10B models report; on this CPU it is
  calibrated (:mod:`ecomkit.measure.calibration`).
- **communication**, α-β model of ring collectives over ``N`` ranks and
  ``S`` bytes with per-message latency α and bus bandwidth ``B``:
  all-reduce ``2(N-1)·α + 2(N-1)/N · S/B``; all-gather and reduce-scatter
  ``(N-1)·α + (N-1)/N · S/B``. What each strategy sends per step: DDP
  all-reduces the fp32 gradients (torch keeps fp32 grads under autocast);
  ZeRO-1/2 reduce-scatter the 16-bit gradients and all-gather the updated
  16-bit weights after the step (ZeRO-2 reduces every micro-step); ZeRO-3
  and FSDP2 all-gather the weights in forward and again in backward and
  reduce-scatter the gradients.
- **overlap**: gradient reduction runs during backward. ``overlap`` is the
  fraction of backward time that can hide it; the last bucket can never hide.
  Post-step all-gathers (ZeRO-1/2) are never hidden.
- **optimizer**: Adam is memory-bound: 28 bytes read + written per local fp32
  element (param, grad, two moments) at the GPU's HBM bandwidth. With ZeRO
  optimizer offload the node's CPUs run Adam on *all* the node's partitions
  (``cpu_adam_params_per_s`` for the whole node, an assumption), and each GPU
  moves its 16-bit gradient partition down and its weights back over PCIe.

GPU peaks, HBM bandwidths and the link presets (*achievable* bus bandwidths,
what nccl-tests report as busbw, next to the marketing peak) come from the one
hardware table, :mod:`ecomkit.hardware`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ecomkit.config import DEEPSPEED_PLAN_STRATEGIES
from ecomkit.errors import ConfigError
from ecomkit.hardware import GpuSpec, LinkSpec, gpu_spec, link_spec
from ecomkit.models.bloom import flops_per_token
from ecomkit.planner.memory import PlanInput, validate_plan_input
from ecomkit.planner.shapes import ModelShape, model_shape

ADAM_BYTES_PER_ELEMENT = 28           # fp32 param, grad, exp_avg, exp_avg_sq read; param and moments written
DEFAULT_EFFICIENCY = 0.45
DEFAULT_OVERLAP = 0.9
CPU_ADAM_PARAMS_PER_S = 2.0e9         # DeepSpeedCPUAdam, whole 2-socket node (assumption, not measured here)
GPUS_PER_NODE = 8


# ---------------------------------------------------------------------- α-β collectives
def all_reduce_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring all-reduce: a reduce-scatter then an all-gather, ``2(N-1)`` steps of ``S/N`` bytes."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bus_bytes_per_s


def all_gather_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring all-gather of a tensor of ``nbytes`` in total (each rank contributes ``nbytes / N``)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bus_bytes_per_s


reduce_scatter_s = all_gather_s   # same steps and bytes, the other direction


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


def comm_volume(inp: PlanInput, shape: ModelShape) -> dict[str, tuple[str, float, bool]]:
    """Collectives of one step: name → (kind, bytes, overlappable with backward)."""
    psi = shape.n_params / (inp.tp * inp.pp)
    s, acc = inp.strategy, inp.grad_accum
    w = 4 if inp.precision == "fp32" else 2
    if s == "ddp":
        return {"grad all-reduce (fp32)": ("all_reduce", 4 * psi, True)}
    if s in ("zero1", "zero2"):
        reduces = acc if s == "zero2" else 1
        return {"grad reduce-scatter": ("reduce_scatter", reduces * w * psi, True),
                "weight all-gather after step": ("all_gather", w * psi, False)}
    if s == "zero3":
        return {"weight all-gather (fwd)": ("all_gather", acc * w * psi, True),
                "weight all-gather (bwd)": ("all_gather", acc * w * psi, True),
                "grad reduce-scatter": ("reduce_scatter", acc * w * psi, True)}
    pw = 2 if inp.precision != "fp32" else 4
    return {"weight all-gather (fwd)": ("all_gather", acc * pw * psi, True),
            "weight all-gather (bwd)": ("all_gather", acc * pw * psi, True),
            "grad reduce-scatter (fp32)": ("reduce_scatter", 4 * psi, True)}


_COLLECTIVE = {"all_reduce": all_reduce_s, "all_gather": all_gather_s, "reduce_scatter": reduce_scatter_s}


def predict_step_time(inp: PlanInput, *, link: str | LinkSpec = "nvlink-a100", efficiency: float = DEFAULT_EFFICIENCY,
                      overlap: float = DEFAULT_OVERLAP, bucket_bytes: float = 25 * 2**20,
                      host_link: str | LinkSpec = "pcie4-x16", cpu_adam_params_per_s: float = CPU_ADAM_PARAMS_PER_S,
                      peak_flops: float | None = None, hbm_bytes_per_s: float | None = None,
                      shape: ModelShape | None = None) -> StepTime:
    """Predict one optimizer step on one GPU of ``inp`` (data parallel over ``inp.dp`` GPUs)."""
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    validate_plan_input(inp, shape)
    if not 0 < efficiency <= 1:
        raise ConfigError(f"efficiency={efficiency} must be in (0, 1]: the fraction of the peak FLOP/s reached.")
    if not 0 <= overlap <= 1:
        raise ConfigError(f"overlap={overlap} must be in [0, 1]: the fraction of backward that can hide communication.")
    gpu: GpuSpec = gpu_spec(inp.gpu)
    lk, host = link_spec(link), link_spec(host_link)
    peak = peak_flops if peak_flops is not None else gpu.peak_flops(inp.precision)
    tokens = inp.micro_batch * inp.seq_len * inp.grad_accum
    flops = tokens * flops_per_token(shape.n_params, shape.n_layer, shape.hidden, inp.seq_len)
    flops *= (4 / 3 if inp.activation_checkpointing else 1.0) / (inp.tp * inp.pp)
    compute = flops / (peak * efficiency)
    if inp.pp > 1:
        m = inp.pp_microbatches or inp.pp
        compute *= 1 + (inp.pp - 1) / m          # pipeline bubble
    backward = compute * (2 / 3 if not inp.activation_checkpointing else 3 / 4)
    parts, hidden_part, exposed_part = {}, 0.0, 0.0
    for name, (kind, nbytes, overlappable) in comm_volume(inp, shape).items():
        t = _COLLECTIVE[kind](nbytes, inp.dp, lk)
        parts[name] = t
        if overlappable:
            hidden_part += t
        else:
            exposed_part += t
    last_bucket = all_reduce_s(min(bucket_bytes, sum(v[1] for v in comm_volume(inp, shape).values())), inp.dp, lk)
    exposed = exposed_part + (max(hidden_part - overlap * backward, min(hidden_part, last_bucket))
                              if hidden_part else 0.0)
    optimizer, offload = _optimizer_time(inp, shape, gpu, host, cpu_adam_params_per_s, hbm_bytes_per_s)
    return StepTime(compute, backward, hidden_part + exposed_part, exposed, optimizer, offload, tokens, parts)


def _optimizer_time(inp: PlanInput, shape: ModelShape, gpu: GpuSpec, host: LinkSpec, cpu_rate: float,
                    hbm: float | None) -> tuple[float, float]:
    psi = shape.n_params / (inp.tp * inp.pp)
    local = psi if inp.strategy == "ddp" else psi / inp.dp
    if inp.strategy in DEEPSPEED_PLAN_STRATEGIES and inp.offload_optimizer:
        w = 4 if inp.precision == "fp32" else 2
        gpus_on_node = min(inp.dp, GPUS_PER_NODE)
        cpu_s = local * gpus_on_node / cpu_rate       # the node's CPUs update every local partition
        pcie_s = 2 * w * local / host.bus_bytes_per_s  # gradient partition down, weights back up
        return 0.0, cpu_s + pcie_s
    return ADAM_BYTES_PER_ELEMENT * local / (hbm or gpu.hbm_bytes_per_s), 0.0


def speedups(inp: PlanInput, gpu_counts: list[int], **kwargs: Any) -> list[dict[str, Any]]:
    """Throughput speed-up of N GPUs over 1 at the same per-GPU micro-batch (weak scaling), per N."""
    base = predict_step_time(replace(inp, world_size=1), **kwargs)
    rows = []
    for n in gpu_counts:
        st = predict_step_time(replace(inp, world_size=n), **kwargs)
        speedup = n * base.total_s / st.total_s
        rows.append({"gpus": n, "step_s": st.total_s, "speedup": speedup, "efficiency": speedup / n,
                     "compute_s": st.compute_s, "comm_exposed_s": st.comm_exposed_s,
                     "optimizer_s": st.optimizer_s + st.offload_s})
    return rows


__all__ = ["all_reduce_s", "all_gather_s", "reduce_scatter_s", "StepTime", "comm_volume", "predict_step_time",
           "speedups", "ADAM_BYTES_PER_ELEMENT", "DEFAULT_EFFICIENCY", "DEFAULT_OVERLAP", "CPU_ADAM_PARAMS_PER_S"]
