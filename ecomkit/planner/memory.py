"""The memory planner: per-GPU bytes of a BLOOM training setup by part (model states, activations, buffers).

Why: to know before renting GPUs whether a setup fits and what fills it; the tests compare the parts with
measurements, and each constant not measured here names its source (CUDA context, DeepSpeed's 4.5× buckets).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Any

from ecomkit.config import DEEPSPEED_PLAN_STRATEGIES, PLAN_STRATEGIES, PLAN_STRATEGY_ALIASES, PP_BALANCES, PRECISIONS
from ecomkit.errors import ConfigError
from ecomkit.hardware import GIB, GpuSpec
from ecomkit.parallel.pipeline import head_cost_in_blocks, stage_layer_ranges
from ecomkit.planner.activations import (activation_bytes, activation_dtypes, head_logprob_bytes,
                                         layer_activation_bytes)
from ecomkit.planner.links import gpu_spec
from ecomkit.planner.loading import CUDA_CONTEXT_BYTES, load_peak
from ecomkit.planner.shapes import (ModelShape, ParamInfo, deepspeed_partition, fsdp2_shard, local_params,
                                    model_shape, zero3_partition)

ATTNS = ("eager", "sdpa")
# A plan names the part that holds at least this share of its peak ("mostly logits").
DOMINANT_SHARE = 0.5
CHUNKED_LOSS_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp2")
# DeepSpeed's documentation: with overlap_comm, ZeRO-1/2 use up to 4.5 × reduce_bucket_size elements of buffers.
DEEPSPEED_OVERLAP_BUCKET_FACTOR = 4.5


@dataclass(frozen=True)
class PlanInput:
    """One training setup to plan. ``world_size`` counts GPUs; ``dp = world_size / (tp · pp)``."""

    model: Any = "ecomgpt-7b"
    world_size: int = 1
    strategy: str = "ddp"
    tp: int = 1
    pp: int = 1
    precision: str = "bf16"
    micro_batch: int = 1
    seq_len: int = 1024
    activation_checkpointing: bool = False
    attn: str = "eager"
    offload_optimizer: bool = False     # ZeRO: optimizer states (+ fp32 grads) in host memory
    offload_param: bool = False         # ZeRO-3: parameters too; FSDP2: CPUOffloadPolicy (all model states)
    gpu: Any = "a100-80g"
    grad_accum: int = 1
    pp_microbatches: int = 0            # 0: pp (1F1B keeps at most pp micro-batches in flight)
    pp_balance: str = "layers"          # pipeline stages by block count, or "compute" (parallel.pp_balance)
    zero_bucket_elements: int = 50_000_000   # chapter 03's reduce/allgather bucket (capped at Ψ)
    vocab_size: int | None = None       # toy presets only: their tokenizer's vocabulary
    loss_chunk_tokens: int = 0          # 0: full-logits loss (TP/PP); > 0: the chunked LM-head loss (the loop's 1024)
    device: str = "cuda"                # "cpu" plans a CPU run (no CUDA context, SDPA width d+1)

    def resolved(self) -> "PlanInput":
        """Canonical strategy name and degrees (``tp``/``pp`` strategies take every GPU when left at 1)."""
        strategy = PLAN_STRATEGY_ALIASES.get(str(self.strategy).lower(), str(self.strategy).lower())
        tp, pp = self.tp, self.pp
        if strategy == "tp" and tp == 1 and pp == 1:
            tp = self.world_size
        if strategy == "pp" and pp == 1 and tp == 1:
            pp = self.world_size
        return replace(self, strategy=strategy, tp=tp, pp=pp)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    def head_blocks(self, shape: ModelShape) -> float:
        """The LM head's weight in blocks when the stages balance compute, else 0 (``stage_layer_ranges``)."""
        if self.pp_balance != "compute" or self.pp == 1:
            return 0.0
        return head_cost_in_blocks(shape.vocab, shape.hidden, shape.block_params(0), self.tp, self.seq_len)

    def loss_chunk(self) -> int:
        """Positions per LM-head chunk, 0 when the full logits are built (TP and PP build them, as ecomkit's loop)."""
        applies = self.strategy in CHUNKED_LOSS_STRATEGIES and self.tp == 1 and self.pp == 1
        return self.loss_chunk_tokens if applies else 0


def validate_plan_input(inp: PlanInput, shape: ModelShape) -> None:
    """Reject impossible setups with one clear sentence each (before any arithmetic)."""
    if not isinstance(inp.world_size, int) or inp.world_size < 1:
        raise ConfigError(f"world_size={inp.world_size!r} GPUs: a plan needs at least 1 GPU (--gpus N, N >= 1).")
    if inp.loss_chunk_tokens < 0:
        raise ConfigError(f"loss_chunk_tokens={inp.loss_chunk_tokens}: give positions per LM-head chunk "
                          "(--loss-chunk-tokens N, N >= 1), or 0 for the full-logits loss.")
    if inp.strategy not in PLAN_STRATEGIES:
        close = difflib.get_close_matches(inp.strategy, PLAN_STRATEGIES, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Unknown strategy '{inp.strategy}'.{hint} Choose one of: {', '.join(PLAN_STRATEGIES)} "
                          "(ZeRO stage: --zero 1|2|3).")
    if inp.pp_balance not in PP_BALANCES:
        raise ConfigError(f"Unknown pp_balance '{inp.pp_balance}'. Choose one of: {', '.join(PP_BALANCES)}.")
    if inp.precision not in PRECISIONS:
        raise ConfigError(f"Unknown precision '{inp.precision}'. Choose one of: {', '.join(PRECISIONS)}.")
    if inp.attn not in ATTNS:
        raise ConfigError(f"Unknown attn '{inp.attn}' for the planner. Choose one of: {', '.join(ATTNS)}.")
    for name in ("micro_batch", "seq_len", "grad_accum", "tp", "pp"):
        if getattr(inp, name) < 1:
            raise ConfigError(f"{name}={getattr(inp, name)} must be >= 1.")
    if shape.n_head % inp.tp:
        divisors = [d for d in range(1, shape.n_head + 1) if shape.n_head % d == 0]
        raise ConfigError(f"tp={inp.tp} does not divide the {shape.n_head} attention heads of {shape.name} "
                          f"(tensor parallelism gives each GPU whole heads). Use tp in {divisors}.")
    if inp.pp > shape.n_layer:
        raise ConfigError(f"pp={inp.pp} is more pipeline stages than the {shape.n_layer} blocks of {shape.name}.")
    if inp.world_size % (inp.tp * inp.pp):
        raise ConfigError(f"tp={inp.tp} × pp={inp.pp} = {inp.tp * inp.pp} does not divide the {inp.world_size} GPUs, "
                          "so the data-parallel degree would not be whole. Choose degrees whose product divides it.")
    if inp.offload_optimizer and inp.strategy not in DEEPSPEED_PLAN_STRATEGIES:
        raise ConfigError(f"offload_optimizer is a DeepSpeed ZeRO option; strategy '{inp.strategy}' has none. Use "
                          "--zero 1|2|3 with --offload-optimizer, or fsdp2 with --offload-param (CPUOffloadPolicy).")
    if inp.offload_param and inp.strategy not in ("zero3", "fsdp2", "tp", "pp"):
        raise ConfigError("offload_param needs partitioned parameters: ZeRO-3 (--zero 3) or FSDP2 (--strategy fsdp2).")
    if inp.strategy == "zero3" and inp.offload_param and not inp.offload_optimizer:
        raise ConfigError("DeepSpeed refuses ZeRO-3 parameter offload without optimizer offload; "
                          "add --offload-optimizer.")
    if inp.device not in ("cuda", "cpu"):
        raise ConfigError(f"device='{inp.device}' must be 'cuda' or 'cpu'.")
    gpu = gpu_spec(inp.gpu)
    if inp.device == "cuda":
        gpu.peak_flops(inp.precision)   # bf16 on a board without bf16 tensor cores (V100): a clear error


def state_bytes_of_rank(inp: PlanInput, params: list[ParamInfo], rank: int,
                        after_reduce: bool = False) -> dict[str, int]:
    """params / grads / optimizer bytes a data-parallel rank holds at its peak, and the CPU part.

    torch strategies: fp32 weights, gradients and two Adam moments; ZeRO: training-dtype weights and gradients plus 12
    bytes per partitioned element. ZeRO-1 holds the whole 16-bit gradient until the boundary reduce; ``after_reduce``:
    what it keeps at the optimizer step.
    """
    n, s = inp.dp, inp.strategy
    psi = sum(p.numel for p in params)
    cpu = {"params": 0, "grads": 0, "optimizer": 0}
    if s in DEEPSPEED_PLAN_STRATEGIES:
        w = 4 if inp.precision == "fp32" else 2
        if s == "zero3":
            part = zero3_partition(params, n)
            out = {"params": w * part, "grads": w * part, "optimizer": 12 * part}
        else:
            part, kept = deepspeed_partition(params, n, rank)
            kept = psi if s == "zero1" and not after_reduce else kept   # ZeRO-1: all until the boundary reduce
            out = {"params": w * psi, "grads": w * kept, "optimizer": 12 * part}
        if inp.offload_optimizer:  # fp32 grads + master + Adam live on the CPU; the GPU keeps only buckets
            cpu["optimizer"], out["optimizer"] = out["optimizer"], 0
            cpu["grads"] = 4 * part
            out["grads"] = w * psi if s == "zero1" and not after_reduce else 0   # wait for the boundary reduce
        if inp.offload_param:
            cpu["params"], out["params"] = out["params"], 0
    else:
        local = psi if s == "ddp" else fsdp2_shard(params, n, rank)
        out = {"params": 4 * local, "grads": 4 * local, "optimizer": 8 * local}
        if inp.offload_param:  # FSDP2 CPUOffloadPolicy: all sharded states in host memory
            cpu, out = dict(out), {"params": 0, "grads": 0, "optimizer": 0}
    out["cpu"] = sum(cpu.values())
    out["cpu_breakdown"] = cpu  # type: ignore[assignment]
    return out


def model_state_bytes_per_rank(inp: PlanInput, shape: ModelShape | None = None,
                               after_reduce: bool = False) -> list[dict[str, int]]:
    """Model-state bytes of every data-parallel rank of pipeline stage 0, tp rank 0 (for tests and plots).

    ``after_reduce``: at the optimizer step (see :func:`state_bytes_of_rank`), what a probe there measures.
    """
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    validate_plan_input(inp, shape)
    params = local_params(shape, inp.tp, inp.pp, 0, inp.head_blocks(shape))
    return [state_bytes_of_rank(inp, params, r, after_reduce) for r in range(inp.dp)]


def temporary_bytes(inp: PlanInput, shape: ModelShape, params: list[ParamInfo], batch: int) -> dict[str, int]:
    """Transient buffers on top of model states and saved activations (the peak of backward, roughly).

    Parts: ``logits`` (:func:`logits_bytes`), ``backward_layer`` (one block's working set), ``comm`` (buckets and
    gathered layers), ``autocast_weights`` (DDP's 16-bit copies), ``head_gradients`` (ZeRO-3's chunked loss) and
    ``cuda_context``. The logits and the backward layer peak apart, so the larger counts.
    """
    dt = activation_dtypes(inp.strategy, inp.precision)
    seq, v = inp.seq_len, shape.vocab
    logits = logits_bytes(inp, shape, batch)
    heads = shape.n_head // inp.tp
    layer = 2 * 4 * batch * heads * seq * seq if inp.attn == "eager" else 0
    if inp.activation_checkpointing:
        per = layer_activation_bytes(shape, batch, seq, dt, inp.attn, inp.tp, inp.device)
        layer += per["layer"] + per["attention_scores"]
    out = {"logits_or_backward_layer": max(logits, layer), "comm": _comm_buffers(inp, shape, params),
           "autocast_weights": 0, "cuda_context": CUDA_CONTEXT_BYTES if inp.device == "cuda" else 0}
    if dt.weight_copies:
        out["autocast_weights"] = dt.compute * shape.linear_weight_numel // inp.tp
    if inp.strategy == "zero3" and inp.loss_chunk():
        out["head_gradients"] = (4 if inp.precision == "fp32" else 2) * v * shape.hidden
    return out


def logits_bytes(inp: PlanInput, shape: ModelShape, batch: int) -> int:
    """The LM head's logits alive in backward with their fp32 gradients, ``positions · V · (c + 8)``."""
    seq = inp.seq_len
    positions = batch * seq if not inp.loss_chunk() else min(batch * (seq - 1), inp.loss_chunk())
    return positions * shape.vocab * (activation_dtypes(inp.strategy, inp.precision).compute + 8)


def _comm_buffers(inp: PlanInput, shape: ModelShape, params: list[ParamInfo]) -> int:
    s, n, psi, w = inp.strategy, inp.dp, sum(p.numel for p in params), 4 if inp.precision == "fp32" else 2
    bucket = min(inp.zero_bucket_elements, psi)
    if s in ("zero1", "zero2"):
        return int(DEEPSPEED_OVERLAP_BUCKET_FACTOR * bucket * w)   # ZeRO-1's whole gradients are "grads"
    if s == "zero3":
        return bucket * w + 2 * 2 * w * max(shape.block_params(0) // inp.tp, shape.largest_leaf)
    if s in ("fsdp2", "tp", "pp") and n > 1:
        pw = 2 if inp.precision != "fp32" else 4
        if inp.pp > 1:   # torch's pipeline schedule keeps the stage gathered and its fp32 gradients unsharded
            return (pw + 4) * psi   # until the reduce-scatter after the step's last micro-batch (FSDP's no_sync)
        root = sum(p.numel for p in params if p.layer < 0 or p.layer == shape.n_layer)
        block = shape.block_params(0) // inp.tp
        return pw * (root + 2 * block) + 4 * block
    return 0


@dataclass
class MemoryPlan:
    """Per-GPU bytes of one setup (the worst rank), with the CPU bytes offloading moves to the host."""

    inputs: PlanInput
    shape: ModelShape
    params: int
    grads: int
    optimizer: int
    activations: dict[str, int]
    temporary: dict[str, int]
    cpu_bytes: int
    gpu: GpuSpec
    notes: list[str] = field(default_factory=list)
    load_bytes: int = 0               # device bytes per rank while the model is loaded (planner/loading.py)
    load_path: str = ""
    logits: int = 0                   # of the above: the LM head's logits (kept log-probabilities, temporaries)

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def activation_total(self) -> int:
        return self.activations["total"]

    @property
    def temporary_total(self) -> int:
        return sum(self.temporary.values())

    @property
    def total(self) -> int:
        return self.model_states + self.activation_total + self.temporary_total

    @property
    def peak(self) -> int:
        """The larger of the training step's bytes and the bytes while loading the checkpoint."""
        return max(self.total, self.load_bytes)

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu.memory_bytes

    @property
    def headroom(self) -> int:
        return self.gpu.memory_bytes - self.peak

    def breakdown(self) -> dict[str, int]:
        """Flat {label: bytes} for tables and bar charts."""
        rows = {"parameters": self.params, "gradients": self.grads, "optimizer states": self.optimizer,
                "activations (blocks)": self.activations["blocks"],
                "activations (attention scores)": self.activations["attention_scores"],
                "activations (embedding + LM head)": self.activations["embedding"] + self.activations["head"]}
        labels = {"logits_or_backward_layer": "temporary (logits / backward layer)", "comm": "temporary (comm buffers)",
                  "autocast_weights": "temporary (autocast weight copies)", "cuda_context": "CUDA context",
                  "head_gradients": "temporary (ZeRO-3 head gradients)"}
        rows.update({labels[k]: v for k, v in self.temporary.items()})
        return rows

    def parts(self) -> dict[str, int]:
        """The training step's bytes by what holds them; the parts add up to :attr:`total`."""
        return {"parameters": self.params, "gradients": self.grads, "optimizer states": self.optimizer,
                "activations": self.activation_total + self.temporary_total - self.logits - self.buffers,
                "logits": self.logits, "buffers": self.buffers}

    @property
    def buffers(self) -> int:
        """Communication buckets, gathered weights, autocast copies, the CUDA context, ZeRO-3's head gradients."""
        return sum(v for k, v in self.temporary.items() if k != "logits_or_backward_layer")

    def dominant_part(self, share: float = DOMINANT_SHARE) -> tuple[str, float] | None:
        """(part, its share of the peak) when one part holds at least ``share`` of it, the loading copy included."""
        if self.load_bytes > self.total:
            return "the loading copy", 1.0
        name, size = max(self.parts().items(), key=lambda kv: kv[1])
        return (name, size / self.total) if self.total and size >= share * self.total else None

    def verdict(self) -> str:
        inp = self.inputs
        word = "fits" if self.fits else "does NOT fit"
        if not self.fits and self.total <= self.gpu.memory_bytes:
            word += f" (while loading: {self.load_path})"
        layout = f" (dp {inp.dp} × tp {inp.tp} × pp {inp.pp})" if inp.tp * inp.pp > 1 else ""
        return (f"{self.shape.name} · {inp.strategy}{layout} · {inp.world_size} GPU(s) · {inp.precision} · micro-batch "
                f"{inp.micro_batch} × {inp.seq_len} tokens: {format_gib(self.total)} per GPU → {word} on "
                f"{self.gpu.name} ({format_gib(self.gpu.memory_bytes)}, headroom {format_gib(self.headroom)})")

    def table(self) -> str:
        """A plain-text table (what ``python -m ecomkit.plan`` prints)."""
        rows = self.breakdown()
        width = max(len(k) for k in rows) + 2
        lines = [f"{'per GPU':<{width}}{'GiB':>10}"]
        lines += [f"{k:<{width}}{v / GIB:>10.2f}" for k, v in rows.items()]
        lines.append(f"{'total':<{width}}{self.total / GIB:>10.2f}")
        lines.append(f"{'while loading the checkpoint':<{width}}{self.load_bytes / GIB:>10.2f}")
        if self.cpu_bytes:
            lines.append(f"{'host (CPU) memory, offloaded':<{width}}{self.cpu_bytes / GIB:>10.2f}")
        return "\n".join(lines)


def format_gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def plan_memory(inp: PlanInput | None = None, shape: ModelShape | None = None, **kwargs: Any) -> MemoryPlan:
    """Plan one setup; keyword arguments override fields of ``inp`` (or build it)."""
    inp = replace(inp, **kwargs) if inp is not None else PlanInput(**kwargs)
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    validate_plan_input(inp, shape)
    gpu = gpu_spec(inp.gpu)
    stages = range(inp.pp)
    best: MemoryPlan | None = None
    for stage in stages:   # the worst pipeline stage decides
        plan = _plan_stage(inp, shape, gpu, stage)
        if best is None or plan.total > best.total:
            best = plan
    assert best is not None
    return best


def _plan_stage(inp: PlanInput, shape: ModelShape, gpu: GpuSpec, stage: int) -> MemoryPlan:
    head_blocks = inp.head_blocks(shape)
    params = local_params(shape, inp.tp, inp.pp, stage, head_blocks)
    ranks = [state_bytes_of_rank(inp, params, r) for r in range(min(inp.dp, 64))]  # beyond 64 ranks: sampled
    worst = max(ranks, key=lambda d: d["params"] + d["grads"] + d["optimizer"])
    lo, hi = stage_layer_ranges(shape.n_layer, inp.pp, head_blocks)[stage] if inp.pp > 1 else (0, shape.n_layer)
    batch, in_flight = inp.micro_batch, 1
    if inp.pp > 1:
        m = inp.pp_microbatches or inp.pp
        batch = max(1, inp.micro_batch * inp.grad_accum // m)
        in_flight = min(inp.pp - stage, m)       # 1F1B: stage s keeps pp - s micro-batches in flight
    acts = activation_bytes(shape, batch, inp.seq_len, strategy=inp.strategy, precision=inp.precision,
                            attn=inp.attn, checkpointing=inp.activation_checkpointing, tp=inp.tp,
                            layers=hi - lo, with_embedding=stage == 0, with_head=stage == inp.pp - 1,
                            device=inp.device, loss_chunk=inp.loss_chunk())
    acts = {k: v * in_flight for k, v in acts.items()}
    temp = temporary_bytes(inp, shape, params, batch)
    logits = 0
    if stage != inp.pp - 1:
        temp["logits_or_backward_layer"] = 2 * 4 * batch * (shape.n_head // inp.tp) * inp.seq_len ** 2 \
            if inp.attn == "eager" else 0
    else:   # the log-probabilities the loss keeps, and the logits when they, not a block's backward, peak
        temporary = logits_bytes(inp, shape, batch)
        logits = in_flight * head_logprob_bytes(shape, batch, inp.seq_len, inp.loss_chunk()) + (
            temporary if temporary >= temp["logits_or_backward_layer"] else 0)
    notes = []
    if inp.strategy in ("zero1", "zero2") and inp.dp > 1:
        notes.append("ZeRO-1/2 keep the whole gradient of a parameter that straddles a partition boundary; "
                     "the worst rank is shown.")
    loading, path = load_peak(inp, shape, params)
    notes.append(f"loading the checkpoint: {path}")
    return MemoryPlan(inp, shape, worst["params"], worst["grads"], worst["optimizer"], acts, temp,
                      worst["cpu"], gpu, notes, loading, path, logits)


def max_micro_batch(inp: PlanInput, shape: ModelShape | None = None, limit: int = 4096) -> int:
    """Largest micro-batch that fits ``inp.gpu`` (0 if even 1 does not): bytes grow with the batch, so bisect."""
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    if not plan_memory(inp, shape, micro_batch=1).fits:
        return 0
    lo, hi = 1, 2
    while hi <= limit and plan_memory(inp, shape, micro_batch=hi).fits:
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if plan_memory(inp, shape, micro_batch=mid).fits else (lo, mid)
    return lo


__all__ = ["PlanInput", "CHUNKED_LOSS_STRATEGIES", "DOMINANT_SHARE", "logits_bytes", "validate_plan_input", "state_bytes_of_rank", "model_state_bytes_per_rank", "temporary_bytes",
           "MemoryPlan", "plan_memory", "max_micro_batch", "format_gib", "CUDA_CONTEXT_BYTES", "ATTNS", "load_peak"]
