"""The memory planner: per-GPU bytes of a BLOOM training setup, before renting the GPUs.

Inputs (:class:`PlanInput`): the model (a preset, a ``BloomConfig``, a
directory with ``config.json`` or a module), the number of GPUs, the strategy
(``ddp``, ``zero1/2/3``, ``fsdp2``, ``tp``, ``pp``, plus CPU offloads), the
precision, micro-batch, sequence length, activation checkpointing and the
attention implementation. Output (:class:`MemoryPlan`): bytes per GPU split
into parameters, gradients, optimizer states, activations and temporary
buffers, the CPU bytes that offloading moves to the host, whether it fits a
chosen GPU, and the largest micro-batch that fits.

How each number is obtained, and why it can be trusted (the tests compare
them with measurements):

- **Ψ and the parameter list are exact**: the model is built on the meta
  device (no memory), so every parameter's shape is known. Model states per
  rank follow what the implementations in this repository really hold, not
  just the paper's formulas: torch DDP/FSDP2 keep fp32 master weights and fp32
  gradients whatever the compute precision (autocast / MixedPrecisionPolicy);
  DeepSpeed keeps 16-bit (or fp32) weights plus an fp32 master partition and
  Adam moments (12 bytes per partitioned parameter, even in fp32). Partitions
  are emulated exactly: DeepSpeed ZeRO-1/2 flatten each optimizer parameter
  group, pad it to a multiple of 2·N elements and cut it in N, and a rank keeps
  the *whole* gradient of every parameter that overlaps its partition; ZeRO-3
  partitions every parameter separately (``ceil(numel / N)``); FSDP2 splits
  every parameter along dim 0 like ``torch.chunk``.
- **Activations** come from a formula for BLOOM's eager attention derived from
  what autograd saves (checked tensor by tensor with
  :class:`~ecomkit.measure.activations.SavedTensorCounter`), per layer with
  ``x = micro_batch · T · hidden``: ``x·(2r + 14c)`` bytes (LayerNorm inputs
  in the residual dtype ``r``, and q, k, v, context, LayerNorm outputs, MLP
  input, GELU input and output in the compute dtype ``c``), plus the
  attention probabilities ``[b, heads, T, T]`` kept by softmax in fp32 (and
  a 16-bit copy under mixed precision). ALiBi is added to the scores by
  ``baddbmm`` as its bias input, which backward does not need, so it costs
  no saved memory (only with checkpointing, the shared ALiBi/mask inputs of
  the blocks are kept). With SDPA (``--attn sdpa``) the ``T²`` term is replaced
  by q, k, v and the output with one extra ALiBi channel, plus a
  log-sum-exp per row. Activation checkpointing keeps one ``[b, T, h]`` input
  per block and recomputes one block at a time in backward (a temporary).
- **Temporary buffers**: the logits and their fp32 gradients (BLOOM's
  250,880-token vocabulary makes this the largest transient), the
  attention-score gradients of one layer in backward, the recomputed block
  under checkpointing, the communication buckets and gathered parameters of
  ZeRO/FSDP, autocast's 16-bit weight copies, and the CUDA context.

Assumptions that are *not* measured here are constants below with their
source (CUDA context size, DeepSpeed's 4.5× bucket rule).
"""

from __future__ import annotations

import difflib
import functools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ecomkit.errors import ConfigError, ModelNotFoundError

GIB = 1024**3

# ---------------------------------------------------------------------- hardware
@dataclass(frozen=True)
class GpuSpec:
    """A GPU as the planner sees it: usable memory, dense peaks (``ecomkit.hardware``) and HBM bandwidth."""

    key: str
    name: str
    memory_bytes: int        # what torch.cuda.get_device_properties().total_memory reports (approx.)
    flops_key: str           # row of ecomkit.hardware.GPU_PEAK_TFLOPS
    hbm_bytes_per_s: float   # memory bandwidth (data sheet), for the optimizer step

    def peak_flops(self, precision: str) -> float:
        from ecomkit.hardware import GPU_PEAK_TFLOPS

        peaks = GPU_PEAK_TFLOPS[self.flops_key]
        value = peaks.get(precision) or peaks.get("fp16") or 0.0
        return value * 1e12


def _gib(x: float) -> int:
    return int(x * GIB)


# Memory: what torch reports as total_memory on these boards (slightly less than the marketing GB).
GPUS: dict[str, GpuSpec] = {
    "a100-40g": GpuSpec("a100-40g", "A100-SXM4-40GB", _gib(39.4), "A100", 1.555e12),
    "a100-80g": GpuSpec("a100-80g", "A100-SXM4-80GB", _gib(79.2), "A100", 2.039e12),
    "h100-80g": GpuSpec("h100-80g", "H100-SXM5-80GB", _gib(79.1), "H100", 3.35e12),
    "h200": GpuSpec("h200", "H200-SXM-141GB", _gib(139.8), "H200", 4.8e12),
    "rtx4090": GpuSpec("rtx4090", "GeForce RTX 4090 24GB", _gib(23.6), "4090", 1.008e12),
    "v100-32g": GpuSpec("v100-32g", "V100-SXM2-32GB", _gib(31.7), "V100", 0.9e12),
    "v100-16g": GpuSpec("v100-16g", "V100-SXM2-16GB", _gib(15.8), "V100", 0.9e12),
    "a10-24g": GpuSpec("a10-24g", "A10 24GB", _gib(22.0), "A10", 0.6e12),
    "l40s": GpuSpec("l40s", "L40S 48GB", _gib(44.4), "L40S", 0.864e12),
}
GPU_ALIASES = {"a100": "a100-80g", "a100-40gb": "a100-40g", "a100-80gb": "a100-80g", "h100": "h100-80g",
               "h100-80gb": "h100-80g", "4090": "rtx4090", "rtx-4090": "rtx4090", "rtx4090-24g": "rtx4090",
               "v100": "v100-32g", "a10": "a10-24g"}

# CUDA context + cuBLAS/cuDNN workspaces + NCCL buffers: ~0.5-1 GiB per process on A100/H100 with
# recent CUDA (what nvidia-smi shows for an idle process that initialised CUDA). Not measured here.
CUDA_CONTEXT_BYTES = _gib(0.75)
# DeepSpeed's documentation: with overlap_comm, ZeRO-1/2 use up to 4.5 × reduce_bucket_size elements of buffers.
DEEPSPEED_OVERLAP_BUCKET_FACTOR = 4.5


def gpu_spec(name: str | GpuSpec) -> GpuSpec:
    """Look up a GPU by key (``a100-40g``, ``rtx4090``, ...); a ConfigError names the known ones."""
    if isinstance(name, GpuSpec):
        return name
    key = GPU_ALIASES.get(str(name).lower(), str(name).lower())
    if key in GPUS:
        return GPUS[key]
    close = difflib.get_close_matches(key, list(GPUS) + list(GPU_ALIASES), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"Unknown GPU '{name}' (--gpu).{hint} Known GPUs: {', '.join(GPUS)}. To plan for another "
                      "board, pass a GpuSpec(key, name, memory_bytes, flops_key, hbm_bytes_per_s) from Python.")


# ---------------------------------------------------------------------- model shape (exact, meta device)
@dataclass(frozen=True)
class ParamInfo:
    """One parameter: size, first dimension, optimizer group, and how tensor parallelism splits it."""

    name: str
    numel: int
    dim0: int
    group: int          # 0 = weight decay, 1 = no decay (ecomkit.models.optim.param_groups order)
    layer: int          # block index, -1 = embeddings side, n_layer = ln_f
    tp_split: str       # "col" (dim 0 split), "row" (dim 1 split) or "rep" (replicated)


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about a BLOOM: its dimensions and every parameter (tied ones once)."""

    name: str
    hidden: int
    n_layer: int
    n_head: int
    vocab: int
    params: tuple[ParamInfo, ...]

    @property
    def n_params(self) -> int:
        """Ψ: every parameter once (the tied LM head is the embedding)."""
        return sum(p.numel for p in self.params)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_head

    def block_params(self, layer: int = 0) -> int:
        return sum(p.numel for p in self.params if p.layer == layer)

    @property
    def largest_leaf(self) -> int:
        """Largest single weight (what ZeRO-3 gathers at once in DeepSpeed's estimator): the embedding here."""
        return max(p.numel for p in self.params)

    @property
    def linear_weight_numel(self) -> int:
        """Weights that go through a matmul (autocast makes a 16-bit copy of each); includes the tied head."""
        blocks = sum(p.numel for p in self.params if p.layer >= 0 and p.dim0 != p.numel
                     and p.layer < self.n_layer)
        return blocks + self.vocab * self.hidden


def _tp_split(name: str) -> str:
    if "query_key_value" in name or "dense_h_to_4h" in name:
        return "col"
    if name.endswith(("self_attention.dense.weight", "dense_4h_to_h.weight")):
        return "row"
    return "rep"


def _layer_of(name: str, n_layer: int) -> int:
    parts = name.split(".")
    if "h" in parts:
        return int(parts[parts.index("h") + 1])
    return n_layer if "ln_f" in name else -1


def _shape_from_module(module: Any, name: str) -> ModelShape:
    from ecomkit.models.optim import param_groups

    cfg = module.config
    groups = param_groups(module, weight_decay=0.01)
    group_of = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
    infos, seen = [], set()
    for pname, p in module.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        infos.append(ParamInfo(pname, p.numel(), p.shape[0] if p.dim() else 1, group_of.get(id(p), 1),
                               _layer_of(pname, cfg.n_layer), _tp_split(pname)))
    return ModelShape(name, cfg.hidden_size, cfg.n_layer, cfg.n_head, cfg.vocab_size, tuple(infos))


@functools.lru_cache(maxsize=32)
def _shape_from_config_json(config_json: str, name: str) -> ModelShape:
    from transformers import BloomConfig

    from ecomkit.models.bloom import build_model

    cfg = BloomConfig.from_dict(json.loads(config_json))
    return _shape_from_module(build_model(cfg, device="meta"), name)


def model_shape(model: Any, vocab_size: int | None = None) -> ModelShape:
    """Exact shape of a BLOOM given as a preset name, ``BloomConfig``, directory with ``config.json``, or module.

    ``vocab_size`` fills in the toy presets' vocabulary (their tokenizer's
    size). The model is built on the meta device: no weights are allocated.
    """
    from transformers import BloomConfig

    from ecomkit.models.bloom import PRESETS, is_local_model_dir, preset_config

    if isinstance(model, ModelShape):
        return model
    if hasattr(model, "named_parameters") and hasattr(model, "config"):
        return _shape_from_module(model, getattr(model.config, "name_or_path", "") or type(model).__name__)
    if isinstance(model, BloomConfig):
        return _shape_from_config_json(model.to_json_string(use_diff=False), "config")
    if isinstance(model, str) and model in PRESETS:
        cfg = preset_config(model, vocab_size)
        return _shape_from_config_json(cfg.to_json_string(use_diff=False), model)
    if isinstance(model, (str, Path)) and is_local_model_dir(model):
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(model), local_files_only=True)
        if getattr(cfg, "model_type", "") != "bloom":
            raise ConfigError(
                f"{model}/config.json describes a '{cfg.model_type}' model; the planner's activation formula is "
                "written for BLOOM (ALiBi, fused QKV). Plan a BLOOM checkpoint, or a preset.")
        return _shape_from_config_json(cfg.to_json_string(use_diff=False), str(model))
    raise ModelNotFoundError(
        f"The planner cannot read model '{model}': it is not a preset ({', '.join(PRESETS)}), a BloomConfig, "
        "nor a directory containing config.json. Pass one of those; the hub is not contacted.")


# ---------------------------------------------------------------------- inputs
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp2", "tp", "pp")
STRATEGY_ALIASES = {"zero0": "ddp", "zero-0": "ddp", "zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3",
                    "fsdp": "fsdp2", "dp": "ddp"}
DEEPSPEED_STRATEGIES = ("zero1", "zero2", "zero3")
PRECISIONS = ("fp32", "bf16", "fp16")
ATTNS = ("eager", "sdpa")


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
    zero_bucket_elements: int = 50_000_000   # chapter 03's reduce/allgather bucket (capped at Ψ)
    vocab_size: int | None = None       # toy presets only: their tokenizer's vocabulary
    loss_chunk_tokens: int = 0          # 0: full-logits loss (transformers'; ecomkit's ZeRO/TP/PP); > 0: ecomkit's
                                        #   chunked LM-head loss (its loop's default 1024 for ddp/fsdp2)
    device: str = "cuda"                # "cpu" plans a CPU run (no CUDA context, SDPA width d+1)

    def resolved(self) -> "PlanInput":
        """Canonical strategy name and degrees (``tp``/``pp`` strategies take every GPU when left at 1)."""
        strategy = STRATEGY_ALIASES.get(str(self.strategy).lower(), str(self.strategy).lower())
        tp, pp = self.tp, self.pp
        if strategy == "tp" and tp == 1 and pp == 1:
            tp = self.world_size
        if strategy == "pp" and pp == 1 and tp == 1:
            pp = self.world_size
        return replace(self, strategy=strategy, tp=tp, pp=pp)

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    def loss_chunk(self) -> int:
        """Positions per LM-head chunk, 0 when the full logits are built (strategies as ecomkit's loop)."""
        applies = self.strategy in ("ddp", "fsdp2") and self.tp == 1 and self.pp == 1
        return self.loss_chunk_tokens if applies else 0


def validate_plan_input(inp: PlanInput, shape: ModelShape) -> None:
    """Reject impossible setups with one clear sentence each (before any arithmetic)."""
    if not isinstance(inp.world_size, int) or inp.world_size < 1:
        raise ConfigError(f"world_size={inp.world_size!r} GPUs: a plan needs at least 1 GPU (--gpus N, N >= 1).")
    if inp.loss_chunk_tokens < 0:
        raise ConfigError(f"loss_chunk_tokens={inp.loss_chunk_tokens}: give positions per LM-head chunk "
                          "(--loss-chunk-tokens N, N >= 1), or 0 for the full-logits loss.")
    if inp.strategy not in STRATEGIES:
        close = difflib.get_close_matches(inp.strategy, STRATEGIES, n=1)
        raise ConfigError(f"Unknown strategy '{inp.strategy}'.{' Did you mean ' + repr(close[0]) + '?' if close else ''}"
                          f" Choose one of: {', '.join(STRATEGIES)} (ZeRO stage: --zero 1|2|3).")
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
    if inp.offload_optimizer and inp.strategy not in DEEPSPEED_STRATEGIES:
        raise ConfigError(f"offload_optimizer is a DeepSpeed ZeRO option; strategy '{inp.strategy}' has none. Use "
                          "--zero 1|2|3 with --offload-optimizer, or fsdp2 with --offload-param (CPUOffloadPolicy).")
    if inp.offload_param and inp.strategy not in ("zero3", "fsdp2", "tp", "pp"):
        raise ConfigError("offload_param needs partitioned parameters: ZeRO-3 (--zero 3) or FSDP2 (--strategy fsdp2).")
    if inp.strategy == "zero3" and inp.offload_param and not inp.offload_optimizer:
        raise ConfigError("DeepSpeed refuses ZeRO-3 parameter offload without optimizer offload; add --offload-optimizer.")
    if inp.device not in ("cuda", "cpu"):
        raise ConfigError(f"device='{inp.device}' must be 'cuda' or 'cpu'.")
    gpu_spec(inp.gpu)


# ---------------------------------------------------------------------- model states per rank
def local_params(shape: ModelShape, tp: int = 1, pp: int = 1, stage: int = 0) -> list[ParamInfo]:
    """Parameters one rank holds before data-parallel sharding: its tp slice of its pipeline stage.

    Pipeline stages follow chapter 04 (``stage_layer_ranges``): stage 0 has the
    embeddings, the last stage ``ln_f`` and its own copy of the tied LM head.
    Tensor parallelism follows ``ecomkit.parallel.tensor``: fused QKV and
    ``dense_h_to_4h`` split by rows, ``dense`` / ``dense_4h_to_h`` weights by
    columns, LayerNorms, row-parallel biases and embeddings replicated.
    """
    from ecomkit.parallel.pipeline import stage_layer_ranges

    lo, hi = stage_layer_ranges(shape.n_layer, pp)[stage] if pp > 1 else (0, shape.n_layer)
    first, last = stage == 0, stage == pp - 1
    out = []
    for p in shape.params:
        owned = (lo <= p.layer < hi) or (p.layer < 0 and first) or (p.layer == shape.n_layer and last)
        if not owned:
            continue
        if p.tp_split == "col" and tp > 1:
            p = replace(p, numel=p.numel // tp, dim0=p.dim0 // tp)
        elif p.tp_split == "row" and tp > 1:
            p = replace(p, numel=p.numel // tp)
        out.append(p)
    if pp > 1 and last and not first:   # the untied copy of the embedding that serves as LM head
        emb = next(p for p in shape.params if p.layer < 0 and p.numel == shape.vocab * shape.hidden)
        out.append(replace(emb, name="lm_head.weight"))
    return out


def deepspeed_partition(params: list[ParamInfo], n: int, rank: int) -> tuple[int, int]:
    """(elements of the rank's flat partition, elements of the gradients it keeps) under ZeRO-1/2.

    Per optimizer group: flatten, pad to a multiple of ``2·n`` (DeepSpeed's
    ``nccl_start_alignment_factor`` × world size), cut into ``n`` equal
    partitions. The rank keeps the whole gradient of every parameter that
    overlaps its partition, so a parameter straddling a boundary is held
    entirely by both neighbours (measured; see the module docstring).
    """
    partition = grads = 0
    for group in (0, 1):
        sizes = [p.numel for p in params if p.group == group]
        if not sizes:
            continue
        aligned = math.ceil(sum(sizes) / (2 * n)) * (2 * n)
        size = aligned // n
        partition += size
        lo, hi, offset = rank * size, (rank + 1) * size, 0
        for s in sizes:
            if offset < hi and offset + s > lo:
                grads += s
            offset += s
    return partition, grads


def fsdp2_shard(params: list[ParamInfo], n: int, rank: int) -> int:
    """Elements of the rank's FSDP2 shards: each parameter split on dim 0 in ``torch.chunk`` pieces."""
    total = 0
    for p in params:
        rows = math.ceil(p.dim0 / n)
        mine = max(0, min(rows, p.dim0 - rank * rows))
        total += mine * (p.numel // max(p.dim0, 1))
    return total


def zero3_partition(params: list[ParamInfo], n: int) -> int:
    """Elements of a ZeRO-3 rank's partition: every parameter is cut separately into ``ceil(numel / n)``."""
    return sum(math.ceil(p.numel / n) for p in params)


def state_bytes_of_rank(inp: PlanInput, params: list[ParamInfo], rank: int) -> dict[str, int]:
    """params / grads / optimizer bytes a data-parallel rank holds at the optimizer step, and the CPU part.

    torch strategies (DDP, FSDP2, TP, PP): fp32 weights and gradients and two
    fp32 Adam moments, whatever the compute precision. DeepSpeed ZeRO: weights
    and gradients in the training dtype (4 bytes in fp32, 2 in bf16/fp16)
    plus an fp32 master partition and the Adam moments (12 bytes per
    partitioned element).
    """
    n, s = inp.dp, inp.strategy
    psi = sum(p.numel for p in params)
    cpu = {"params": 0, "grads": 0, "optimizer": 0}
    if s in DEEPSPEED_STRATEGIES:
        w = 4 if inp.precision == "fp32" else 2
        if s == "zero3":
            part = zero3_partition(params, n)
            out = {"params": w * part, "grads": w * part, "optimizer": 12 * part}
        else:
            part, kept = deepspeed_partition(params, n, rank)
            out = {"params": w * psi, "grads": w * kept, "optimizer": 12 * part}
        if inp.offload_optimizer:  # fp32 grads + master + Adam live on the CPU; the GPU keeps only buckets
            cpu["optimizer"], out["optimizer"] = out["optimizer"], 0
            cpu["grads"], out["grads"] = 4 * part, 0
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


def model_state_bytes_per_rank(inp: PlanInput, shape: ModelShape | None = None) -> list[dict[str, int]]:
    """Model-state bytes of every data-parallel rank of pipeline stage 0, tp rank 0 (for tests and plots)."""
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    validate_plan_input(inp, shape)
    params = local_params(shape, inp.tp, inp.pp, 0)
    return [state_bytes_of_rank(inp, params, r) for r in range(inp.dp)]


# ---------------------------------------------------------------------- activations
@dataclass(frozen=True)
class ActivationDtypes:
    """Bytes per element: residual stream (LayerNorm inputs), compute (matmul inputs), LayerNorm statistics."""

    residual: int
    compute: int
    stats: int
    weight_copies: bool     # autocast keeps a 16-bit copy of every matmul weight until backward
    embedding_ln_input: int


def activation_dtypes(strategy: str, precision: str) -> ActivationDtypes:
    """What each strategy runs in: fp32; torch autocast (fp32 weights); or 16-bit modules (DeepSpeed, FSDP2 bf16)."""
    if precision == "fp32":
        return ActivationDtypes(4, 4, 4, False, 4)
    if strategy in DEEPSPEED_STRATEGIES:          # the module itself is bf16/fp16
        return ActivationDtypes(2, 2, 2, False, 2)
    if strategy in ("fsdp2", "tp", "pp"):         # FSDP2 gathers 16-bit params; autocast keeps LayerNorms fp32
        return ActivationDtypes(4, 2, 4, False, 2)
    return ActivationDtypes(4, 2, 4, True, 4)     # DDP + autocast: fp32 weights cast per forward


def sdpa_width(head_dim: int, device: str) -> int:
    """Head width SDPA runs at: one extra channel carries ALiBi; CUDA kernels want a multiple of 8."""
    multiple = 8 if device == "cuda" else 1
    return -(-(head_dim + 1) // multiple) * multiple


def layer_activation_bytes(shape: ModelShape, batch: int, seq: int, dt: ActivationDtypes, attn: str = "eager",
                           tp: int = 1, device: str = "cuda") -> dict[str, int]:
    """Bytes one transformer block saves for backward, split into "layer" and "attention_scores"."""
    x = batch * seq * shape.hidden
    heads = shape.n_head // tp
    r, c = dt.residual, dt.compute
    # LN1 in, LN2 in (r); qkv input, MLP input (c, full width); context, GELU in/out (c, tp-split)
    dense = x * (2 * r + 2 * c) + (x // tp) * c * (1 + 8)
    stats = 2 * 2 * batch * seq * dt.stats
    if attn == "sdpa":
        width = sdpa_width(shape.head_dim, device)
        qkvo = 4 * batch * heads * seq * width * c
        return {"layer": dense + stats + qkvo + 4 * batch * heads * seq, "attention_scores": 0}
    qkv = 3 * (x // tp) * c
    scores = batch * heads * seq * seq * (4 + (c if c != 4 else 0))   # fp32 softmax output (+ 16-bit copy)
    return {"layer": dense + stats + qkv, "attention_scores": scores}


def activation_bytes(shape: ModelShape, batch: int, seq: int, *, strategy: str = "ddp", precision: str = "fp32",
                     attn: str = "eager", checkpointing: bool = False, tp: int = 1, layers: int | None = None,
                     with_embedding: bool = True, with_head: bool = True, device: str = "cuda",
                     loss_chunk: int = 0) -> dict[str, int]:
    """Bytes autograd keeps between forward and backward for one micro-batch, by part.

    Parts: ``blocks`` (per-layer tensors), ``attention_scores`` (the
    ``[b, heads, T, T]`` probabilities of eager attention), ``embedding``
    (token ids, embedding LayerNorm input), ``head`` (``ln_f``, LM-head input,
    the fp32 log-probabilities ``[b, T-1, V]`` the loss keeps, the targets).
    With checkpointing a block keeps only its input. Checked against
    :class:`~ecomkit.measure.activations.SavedTensorCounter` by the tests.
    ``loss_chunk > 0`` (ecomkit's chunked loss, ``ecomkit.models.loss``):
    with more than one chunk the log-probabilities are recomputed in
    backward, not kept; the labelled positions' hidden states are kept
    instead (modelled, not measured).
    """
    dt = activation_dtypes(strategy, precision)
    layers = shape.n_layer if layers is None else layers
    x = batch * seq * shape.hidden
    per = layer_activation_bytes(shape, batch, seq, dt, attn, tp, device)
    out = {"blocks": 0, "attention_scores": 0, "embedding": 0, "head": 0}
    if checkpointing:
        out["blocks"] = layers * x * dt.residual
    else:
        out["blocks"] = layers * per["layer"]
        out["attention_scores"] = layers * per["attention_scores"]
    ln_stats = 2 * batch * seq * dt.stats
    if with_embedding:
        out["embedding"] = 8 * batch * seq + x * dt.embedding_ln_input + ln_stats
    if with_head:
        logprobs = 4 * batch * (seq - 1) * shape.vocab
        if 0 < loss_chunk < batch * (seq - 1):
            logprobs = batch * (seq - 1) * shape.hidden * dt.compute
        out["head"] = x * dt.residual + ln_stats + x * dt.compute + logprobs + 8 * batch * (seq - 1)
    out["total"] = sum(out.values())
    return out


def checkpointing_factor(shape: ModelShape, batch: int, seq: int, **kw: Any) -> float:
    """Predicted ratio of saved activations without / with activation checkpointing."""
    full = activation_bytes(shape, batch, seq, checkpointing=False, **kw)["total"]
    ckpt = activation_bytes(shape, batch, seq, checkpointing=True, **kw)["total"]
    return full / ckpt


# ---------------------------------------------------------------------- temporaries
def temporary_bytes(inp: PlanInput, shape: ModelShape, params: list[ParamInfo], batch: int) -> dict[str, int]:
    """Transient buffers on top of model states and saved activations (the peak of backward, roughly).

    - ``logits``: the LM-head output (compute dtype) alive during backward, and
      the fp32 gradients of the log-probs and of the logits: ``b·T·V·(c + 8)``.
    - ``backward_layer``: one block's working set in backward: the fp32
      gradient of the attention scores and of the probabilities (eager), and
      under checkpointing the block recomputed in full.
    - ``comm``: DDP none (gradients are views into its buckets); ZeRO-1/2
      4.5 × bucket (DeepSpeed's rule for overlap_comm) plus, for ZeRO-1, the
      full gradients that exist until the end-of-backward reduce; ZeRO-3 its
      reduce bucket and two gathered layers; FSDP2 the unsharded parameters of
      the root unit (embeddings, never resharded after forward) and of two
      blocks, plus one block's unsharded fp32 gradients.
    - ``autocast_weights``: DDP + autocast keeps a 16-bit copy of every matmul weight.
    - ``cuda_context``: see :data:`CUDA_CONTEXT_BYTES` (0 for a CPU plan).
    The logits and the backward layer do not coexist at their peaks, so the larger counts.
    """
    dt = activation_dtypes(inp.strategy, inp.precision)
    seq, v = inp.seq_len, shape.vocab
    positions = batch * seq if not inp.loss_chunk() else min(batch * (seq - 1), inp.loss_chunk())
    logits = positions * v * (dt.compute + 8)
    heads = shape.n_head // inp.tp
    layer = 2 * 4 * batch * heads * seq * seq if inp.attn == "eager" else 0
    if inp.activation_checkpointing:
        per = layer_activation_bytes(shape, batch, seq, dt, inp.attn, inp.tp, inp.device)
        layer += per["layer"] + per["attention_scores"]
    out = {"logits_or_backward_layer": max(logits, layer), "comm": _comm_buffers(inp, shape, params),
           "autocast_weights": 0, "cuda_context": CUDA_CONTEXT_BYTES if inp.device == "cuda" else 0}
    if dt.weight_copies:
        out["autocast_weights"] = dt.compute * shape.linear_weight_numel // inp.tp
    return out


def _comm_buffers(inp: PlanInput, shape: ModelShape, params: list[ParamInfo]) -> int:
    s, n = inp.strategy, inp.dp
    psi = sum(p.numel for p in params)
    w = 4 if inp.precision == "fp32" else 2
    bucket = min(inp.zero_bucket_elements, psi)
    if s in ("zero1", "zero2"):
        extra = int(DEEPSPEED_OVERLAP_BUCKET_FACTOR * bucket * w)
        if s == "zero1" and n > 1:
            extra += w * (psi - psi // n)      # stage 1 reduces only at the end of backward
        return extra
    if s == "zero3":
        return bucket * w + 2 * 2 * w * max(shape.block_params(0) // inp.tp, shape.largest_leaf)
    if s in ("fsdp2", "tp", "pp") and n > 1:
        pw = 2 if inp.precision != "fp32" else 4
        root = sum(p.numel for p in params if p.layer < 0 or p.layer == shape.n_layer)
        block = shape.block_params(0) // inp.tp
        return pw * (root + 2 * block) + 4 * block
    return 0


# ---------------------------------------------------------------------- the plan
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
    def fits(self) -> bool:
        return self.total <= self.gpu.memory_bytes

    @property
    def headroom(self) -> int:
        return self.gpu.memory_bytes - self.total

    def breakdown(self) -> dict[str, int]:
        """Flat {label: bytes} for tables and bar charts."""
        rows = {"parameters": self.params, "gradients": self.grads, "optimizer states": self.optimizer,
                "activations (blocks)": self.activations["blocks"],
                "activations (attention scores)": self.activations["attention_scores"],
                "activations (embedding + LM head)": self.activations["embedding"] + self.activations["head"]}
        labels = {"logits_or_backward_layer": "temporary (logits / backward layer)", "comm": "temporary (comm buffers)",
                  "autocast_weights": "temporary (autocast weight copies)", "cuda_context": "CUDA context"}
        rows.update({labels[k]: v for k, v in self.temporary.items()})
        return rows

    def verdict(self) -> str:
        inp = self.inputs
        word = "fits" if self.fits else "does NOT fit"
        return (f"{self.shape.name} · {inp.strategy} · {inp.world_size} GPU(s) · {inp.precision} · micro-batch "
                f"{inp.micro_batch} × {inp.seq_len} tokens: {format_gib(self.total)} per GPU → {word} on "
                f"{self.gpu.name} ({format_gib(self.gpu.memory_bytes)}, headroom {format_gib(self.headroom)})")

    def table(self) -> str:
        """A plain-text table (what ``python -m ecomkit.plan`` prints)."""
        rows = self.breakdown()
        width = max(len(k) for k in rows) + 2
        lines = [f"{'per GPU':<{width}}{'GiB':>10}"]
        lines += [f"{k:<{width}}{v / GIB:>10.2f}" for k, v in rows.items()]
        lines.append(f"{'total':<{width}}{self.total / GIB:>10.2f}")
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
    from ecomkit.parallel.pipeline import stage_layer_ranges

    params = local_params(shape, inp.tp, inp.pp, stage)
    ranks = [state_bytes_of_rank(inp, params, r) for r in range(min(inp.dp, 64))]  # beyond 64 ranks: sampled
    worst = max(ranks, key=lambda d: d["params"] + d["grads"] + d["optimizer"])
    lo, hi = stage_layer_ranges(shape.n_layer, inp.pp)[stage] if inp.pp > 1 else (0, shape.n_layer)
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
    if stage != inp.pp - 1:
        temp["logits_or_backward_layer"] = 2 * 4 * batch * (shape.n_head // inp.tp) * inp.seq_len ** 2 \
            if inp.attn == "eager" else 0
    notes = []
    if inp.strategy in ("zero1", "zero2") and inp.dp > 1:
        notes.append("ZeRO-1/2 keep the whole gradient of a parameter that straddles a partition boundary; "
                     "the worst rank is shown.")
    return MemoryPlan(inp, shape, worst["params"], worst["grads"], worst["optimizer"], acts, temp,
                      worst["cpu"], gpu, notes)


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


__all__ = ["GIB", "GpuSpec", "GPUS", "gpu_spec", "ModelShape", "ParamInfo", "model_shape", "PlanInput",
           "STRATEGIES", "validate_plan_input", "local_params", "deepspeed_partition", "fsdp2_shard",
           "zero3_partition", "state_bytes_of_rank", "model_state_bytes_per_rank", "activation_bytes",
           "activation_dtypes", "layer_activation_bytes", "checkpointing_factor", "temporary_bytes", "MemoryPlan",
           "plan_memory", "max_micro_batch", "format_gib", "CUDA_CONTEXT_BYTES"]
