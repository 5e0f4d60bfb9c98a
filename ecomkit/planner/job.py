"""One description of a job: a :class:`~ecomkit.config.TrainConfig` plus a cluster, read as the scripts read it.

Why: a plan is only useful if it describes the job the script will run, so the planner takes the scripts' own flags and
validation; :func:`plan_input_from_config` is the one translation to a :class:`~ecomkit.planner.memory.PlanInput`, and
the planner's older flags are aliases (:func:`expand_planner_aliases`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

from ecomkit.config import (DEEPSPEED_PLAN_STRATEGIES, MESH_STRATEGIES, PARALLEL_FLAG_ALIASES, PLAN_STRATEGIES,
                            PLAN_STRATEGY_ALIASES, STRATEGIES, StrategyName, TrainConfig, plan_strategy_name,
                            resolve_parallel_degrees)
from ecomkit.errors import ConfigError
from ecomkit.config.vocabulary import AUTO, LOSS_KERNEL_PACKAGES
from ecomkit.hardware import gpu_kind, gpu_spec
from ecomkit.planner.links import default_link
from ecomkit.models.attention import pick_attention
from ecomkit.models.loss import pick_loss_kernel
from ecomkit.models.bloom import model_length_limit
from ecomkit.planner.lora import LoraPlan, plan_lora_memory
from ecomkit.planner.memory import MemoryPlan, PlanInput, plan_memory
from ecomkit.planner.shapes import ModelShape, model_shape


@dataclass(frozen=True)
class Cluster:
    """The hardware half of a plan: ``gpus`` in all (the world size), over ``nodes`` servers."""

    gpus: int = 1
    gpu: str = "a100-80g"
    link: str | None = None          # None: the GPU's own default link (ecomkit.hardware, GpuSpec.default_link)
    node: str | None = None          # None: the usual system of ``gpu`` (ecomkit.planner.links.GPU_DEFAULT_NODE)
    nodes: int = 1

    def validate(self) -> "Cluster":
        if not isinstance(self.gpus, int) or self.gpus < 1:
            raise ConfigError(f"--gpus {self.gpus}: a plan needs at least 1 GPU (--gpus N, N >= 1).")
        if self.nodes < 1 or self.gpus % self.nodes:
            raise ConfigError(f"--nodes {self.nodes} must be >= 1 and divide --gpus {self.gpus} (the same number "
                              "of GPUs on every node, as torchrun --nproc_per_node starts).")
        return self

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def interconnect(self) -> str:
        """The link the plan uses: ``link`` when given, else the GPU's default (kept when the GPU is replaced)."""
        return self.link if self.link is not None else default_link(self.gpu)

    def time_links(self) -> dict[str, Any]:
        """The time model's link arguments: :attr:`interconnect`, except the GPU's own link for groups inside a node."""
        out: dict[str, Any] = {"link": self.interconnect, "node": self.node}
        if self.nodes > 1:
            out.update(intra_node_link=default_link(self.gpu), gpus_per_node=self.gpus_per_node)
        return out


CLUSTER_DEFAULTS = Cluster()

# Every TrainConfig field the planner reads (dotted): the plan names those left at their default.
PLANNER_FIELDS = ("model", "strategy", "zero.stage", "zero.offload_optimizer", "zero.offload_param",
                  "zero.activation_checkpointing", "zero.bucket_size", "parallel.dp", "parallel.tp", "parallel.pp",
                  "parallel.pp_microbatches", "parallel.pp_balance", "parallel.fsdp_cpu_offload",
                  "parallel.activation_checkpointing",
                  "precision", "micro_batch_size", "seq_len", "grad_accum", "global_batch_size", "attn",
                  "loss_chunk_tokens", "loss_kernel", "peft", "lora_r", "lora_target_modules")

# Old planner flags → the derived training flags (plain renames; strategy-dependent ones are extra flags).
PLANNER_FLAG_ALIASES = {"--micro-batch": "--micro-batch-size", **PARALLEL_FLAG_ALIASES}


def get_field(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _training_strategy(name: str) -> list[str]:
    """``--strategy`` value (training or planner spelling) → the training flags it means."""
    key = str(name).lower()
    key = PLAN_STRATEGY_ALIASES.get(key, key) if key not in ("accelerate",) else key
    if key in DEEPSPEED_PLAN_STRATEGIES:
        return ["--strategy", "zero", "--zero-stage", key.removeprefix("zero")]
    if key == "fsdp2":
        return ["--strategy", "fsdp"]
    return ["--strategy", key if key in STRATEGIES else name]   # "dp", "zero0" → "ddp"; unknown: validation says


def expand_planner_aliases(argv: list[str]) -> list[str]:
    """Rewrite the planner's older flags as training flags (``--zero 2`` → ``--strategy zero --zero-stage 2``)."""
    out: list[str] = []
    zero: str | None = None
    strategy: str | None = None
    args = list(argv)
    i = 0
    while i < len(args):
        flag, sep, value = args[i].partition("=")
        takes = flag in ("--zero", "--strategy")
        if takes and not sep:
            if i + 1 >= len(args):
                raise ConfigError(f"{flag} needs a value.")
            value, i = args[i + 1], i + 1
        if flag == "--zero":
            zero = value
        elif flag == "--strategy":
            strategy = value
        else:
            out.append(PLANNER_FLAG_ALIASES[flag] + sep + value if flag in PLANNER_FLAG_ALIASES else args[i])
        i += 1
    if zero is not None:
        if zero not in ("0", "1", "2", "3"):
            raise ConfigError(f"--zero {zero}: the ZeRO stage is 0, 1, 2 or 3.")
        wanted = ["--strategy", "zero", "--zero-stage", zero]
        if strategy is not None:
            said = _training_strategy(strategy)
            agrees = said in (["--strategy", "zero"], wanted) or (zero == "0" and said == ["--strategy", "ddp"])
            if not agrees:
                raise ConfigError(f"--strategy {strategy} and --zero {zero} disagree; give one of them.")
        out += wanted
    elif strategy is not None:
        out += _training_strategy(strategy)
    return out


def apply_strategy_switches(cfg: TrainConfig, checkpointing: bool, offload_optimizer: bool,
                            offload_param: bool) -> TrainConfig:
    """The planner's strategy-neutral switches, set on the field of the job's strategy (or a clear error)."""
    zero, mesh = cfg.strategy == StrategyName.ZERO, cfg.strategy in MESH_STRATEGIES
    if checkpointing:
        if zero:
            cfg.zero.activation_checkpointing = True
        elif mesh:
            cfg.parallel.activation_checkpointing = True
        else:
            raise ConfigError(f"--checkpointing: ecomkit's --strategy {cfg.strategy} has no activation checkpointing; "
                              "it is --zero-activation-checkpointing (zero) or --parallel-activation-checkpointing "
                              "(fsdp, tp, pp, mixed).")
    if offload_optimizer:
        if not zero:
            raise ConfigError("--offload-optimizer is a DeepSpeed ZeRO option (--zero-offload-optimizer); use "
                              "--strategy zero, or fsdp with --offload-param (CPUOffloadPolicy).")
        cfg.zero.offload_optimizer = True
    if offload_param:
        if zero:
            cfg.zero.offload_param = True
        elif mesh:
            cfg.parallel.fsdp_cpu_offload = True
        else:
            raise ConfigError("offload_param needs partitioned parameters: ZeRO-3 (--zero 3) or FSDP2 "
                              "(--strategy fsdp).")
    return cfg


def plan_degrees(cfg: TrainConfig, world_size: int) -> tuple[str, int, int, int]:
    """(planner strategy, dp, tp, pp) of a training config on ``world_size`` processes."""
    if cfg.strategy in MESH_STRATEGIES:
        dp, tp, pp = resolve_parallel_degrees(cfg.strategy, cfg.parallel, world_size)
        return ("tp" if tp > 1 else "pp" if pp > 1 else "fsdp2"), dp, tp, pp
    if cfg.parallel.tp != 1 or cfg.parallel.pp != 1:
        raise ConfigError(f"--parallel-tp/--parallel-pp (--tp/--pp) are degrees of --strategy fsdp|tp|pp|mixed; "
                          f"--strategy {cfg.strategy} does not use them. Add --strategy tp, pp or mixed.")
    stage = cfg.zero.stage if cfg.strategy == StrategyName.ZERO else 0
    return plan_strategy_name(cfg.strategy, stage), world_size, 1, 1


def planned_seq_len(cfg: TrainConfig) -> tuple[int, str | None]:
    """The sequence length a plan uses, and a note when it stands in for ``--seq-len auto``.

    ``auto`` is decided from data the planner does not read, so the plan takes the model's limit: an upper bound.
    """
    if cfg.seq_len != AUTO:
        return int(cfg.seq_len), None
    limit = model_length_limit(cfg.model)
    return limit, (f"--seq-len auto: planned at {limit} tokens, the longest a run of {cfg.model} may choose (a run "
                   f"takes the smallest multiple of 64 that holds its rows), so memory and time are upper bounds; "
                   f"give --seq-len N for your data's length")


def planned_precision(precision: str, cluster: Cluster) -> str:
    """``--precision auto`` as a run on ``cluster``'s GPUs resolves it: bf16 where the GPU has it, else fp32."""
    if precision != AUTO:
        return precision
    return "bf16" if gpu_spec(cluster.gpu).supports("bf16") else "fp32"


def plan_input_from_config(cfg: TrainConfig, cluster: Cluster, vocab_size: int | None = None,
                           validate: bool = True) -> PlanInput:
    """The planner's input for the job ``cfg`` runs on ``cluster`` (validated like the scripts validate)."""
    cluster.validate()
    cfg = replace(cfg, precision=planned_precision(cfg.precision, cluster))
    shape = model_shape(cfg.model, vocab_size)
    if validate:
        # QLoRA's bits are planned by planner.lora's rules; whether this machine can train them, or run the fused
        # losses, is not the plan's question.
        fused = cfg.loss_kernel in LOSS_KERNEL_PACKAGES
        replace(cfg, lora_base_bits=16, loss_kernel=AUTO if fused else cfg.loss_kernel).validate(
            world_size=cluster.gpus, n_head=shape.n_head, n_layer=shape.n_layer)
    strategy, dp, tp, pp = plan_degrees(cfg, cluster.gpus)
    seq_len = planned_seq_len(cfg)[0]
    zero = cfg.strategy == StrategyName.ZERO
    checkpointing = cfg.zero.activation_checkpointing if zero else (
        cfg.parallel.activation_checkpointing if cfg.strategy in MESH_STRATEGIES else False)
    offload_param = cfg.zero.offload_param if zero else (
        cfg.parallel.fsdp_cpu_offload if cfg.strategy in MESH_STRATEGIES else False)
    assert strategy in PLAN_STRATEGIES
    return PlanInput(model=cfg.model, world_size=cluster.gpus, strategy=strategy, tp=tp, pp=pp,
                     precision=cfg.precision, micro_batch=cfg.micro_batch_size, seq_len=seq_len,
                     activation_checkpointing=checkpointing,
                     attn=pick_attention(cfg.attn, cfg.precision, "cuda", seq_len,   # the planner plans GPUs
                                         gpu_kind=gpu_kind(cluster.gpu))[0],
                     offload_optimizer=zero and cfg.zero.offload_optimizer, offload_param=offload_param,
                     gpu=cluster.gpu, grad_accum=cfg.resolve_grad_accum(dp),
                     pp_microbatches=cfg.parallel.pp_microbatches if pp > 1 else 0,
                     pp_balance=cfg.parallel.pp_balance,
                     zero_bucket_elements=cfg.zero.bucket_size, vocab_size=vocab_size,
                     loss_chunk_tokens=planned_loss_chunk(cfg, cluster))


def planned_loss_chunk(cfg: TrainConfig, cluster: Cluster) -> int:
    """The planner's ``loss_chunk_tokens`` for ``--loss-kernel``: 0 for the full logits, else the chunk.

    liger and cce keep fewer logits than the chunked loss, so planning them with its bound is an upper bound.
    """
    kernel = pick_loss_kernel(cfg.loss_kernel, "cuda", gpu_kind(cluster.gpu), cfg.loss_chunk_tokens)[0]
    if kernel == "full":
        return 0
    return cfg.loss_chunk_tokens or 1024


def lora_plan(cfg: TrainConfig, base_bits: int = 16) -> LoraPlan | None:
    """The adapters ``cfg`` trains (``--peft lora``), or None for full fine-tuning."""
    if cfg.peft == "none":
        return None
    return LoraPlan(r=cfg.lora_r, targets=cfg.lora_target_modules, base_bits=base_bits)


def plan_job(cfg: TrainConfig, cluster: Cluster, vocab_size: int | None = None, shape: ModelShape | None = None,
             base_bits: int = 16) -> MemoryPlan:
    """The memory plan of the job: full fine-tuning's, or with LoRA's model states (``ecomkit.planner.lora``)."""
    inp = plan_input_from_config(cfg, cluster, vocab_size)
    lora = lora_plan(cfg, base_bits)
    return plan_memory(inp, shape) if lora is None else plan_lora_memory(inp, lora, shape)


def given_fields(ns_dests: set[str], file_values: dict[str, Any]) -> set[str]:
    """Dotted names of the fields a user set: flags (argparse dests ``zero__stage``) and ``--config`` keys."""
    given = {d.replace("__", ".") for d in ns_dests}
    for key, value in file_values.items():
        if isinstance(value, dict):
            given |= {f"{key}.{k}" for k in value}
        else:
            given.add(key)
    return given


def defaults_used(cfg: TrainConfig, given: set[str]) -> dict[str, Any]:
    """{field: value} of every planner field the user left at its default (printed with the plan)."""
    return {name: get_field(cfg, name) for name in PLANNER_FIELDS if name not in given}


def cluster_defaults_used(cluster: Cluster, given: set[str]) -> dict[str, Any]:
    out = {f.name: getattr(cluster, f.name) for f in dataclasses.fields(Cluster) if f.name not in given}
    if "link" in out and out["link"] is None:
        out["link"] = f"{cluster.interconnect} (the default of --gpu {cluster.gpu})"
    return out


__all__ = ["planned_seq_len", "Cluster", "CLUSTER_DEFAULTS", "PLANNER_FIELDS", "lora_plan", "plan_job", "PLANNER_FLAG_ALIASES", "expand_planner_aliases",
           "apply_strategy_switches", "plan_degrees", "plan_input_from_config", "given_fields", "defaults_used",
           "cluster_defaults_used", "get_field", "planned_loss_chunk"]
