"""The one training configuration: a dataclass with commented defaults, named presets and a CLI.

Why one dataclass: a notebook, a script and a test must describe the same run
in the same words. Command-line flags are *derived* from the fields (``max_steps``
→ ``--max-steps``, ``zero.stage`` → ``--zero-stage``), a YAML/JSON file can be
loaded with ``--config``, and :meth:`TrainConfig.validate` rejects unknown or
invalid values with a clear message *before* any process group is created, so
a typo never costs a cluster start-up.

Presets are plain functions that return a config; variants call a base preset
and change a few fields (torchtitan's convention), never ``exec``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable

from ecomkit.errors import ConfigError



class StrategyName(str, Enum):
    """The one vocabulary of training strategies: what ``--strategy`` takes.

    A ``str`` enum, so ``StrategyName.ZERO == "zero"`` and configs, JSON files
    and flags keep plain strings. The planner, the loop, the strategy registry
    (``ecomkit.parallel.STRATEGY_FACTORIES``) and the sweeps all use it; the
    planner's stage-specific names ("zero2", "fsdp2") are spelled by
    :func:`plan_strategy_name` and read back by :func:`parse_plan_strategy`.
    """

    DDP = "ddp"
    ACCELERATE = "accelerate"
    ZERO = "zero"
    FSDP = "fsdp"
    TP = "tp"
    PP = "pp"
    MIXED = "mixed"

    def __str__(self) -> str:
        return self.value


STRATEGIES = tuple(s.value for s in StrategyName)
# The planner plans one memory layout per name: ZeRO is split by stage, FSDP is FSDP2.
PLAN_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp2", "tp", "pp")
DEEPSPEED_PLAN_STRATEGIES = ("zero1", "zero2", "zero3")
PLAN_STRATEGY_ALIASES = {"zero0": "ddp", "zero-0": "ddp", "zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3",
                         "fsdp": "fsdp2", "dp": "ddp", "accelerate": "ddp"}


def plan_strategy_name(strategy: str, zero_stage: int = 0) -> str:
    """The planner's name for a training strategy: ("zero", 2) -> "zero2", "fsdp" -> "fsdp2", ("zero", 0) -> "ddp"."""
    s = StrategyName(strategy)
    if s is StrategyName.ZERO:
        return "ddp" if zero_stage == 0 else f"zero{zero_stage}"
    if s is StrategyName.FSDP:
        return "fsdp2"
    if s is StrategyName.ACCELERATE:
        return "ddp"
    if s is StrategyName.MIXED:
        raise ConfigError("The planner plans one strategy at a time; plan 'mixed' as tp, pp or fsdp2.")
    return s.value


def parse_plan_strategy(name: str) -> tuple[StrategyName, int]:
    """Read a planner name back: "zero3" -> (ZERO, 3), "fsdp2" -> (FSDP, 0), "zero-1" -> (ZERO, 1)."""
    key = PLAN_STRATEGY_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in PLAN_STRATEGIES:
        _choice("planner strategy", key, PLAN_STRATEGIES)
    if key in DEEPSPEED_PLAN_STRATEGIES:
        return StrategyName.ZERO, int(key.removeprefix("zero"))
    return (StrategyName.FSDP, 0) if key == "fsdp2" else (StrategyName(key), 0)


PRECISIONS = ("fp32", "bf16", "fp16")
TASKS = ("lm", "nlu")
CLIP_POLICIES = ("fixed", "sentiment")
ATTN_IMPLS = ("eager", "sdpa", "flex")
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk", "topk_naive")


@dataclass
class ZeroConfig:
    """DeepSpeed ZeRO options (chapter 03); used when ``strategy == "zero"``."""

    stage: int = 3                    # 1: optimizer states, 2: + gradients, 3: + parameters
    offload_optimizer: bool = False   # optimizer states and step on the CPU (DeepSpeedCPUAdam)
    offload_param: bool = False       # ZeRO-3 only: parameters live on the CPU between uses
    overlap_comm: bool = True         # overlap gradient reduction with the backward pass
    contiguous_gradients: bool = True # copy gradients into one buffer to avoid fragmentation
    bucket_size: int = 50_000_000     # elements per reduce / allgather bucket
    param_persistence_threshold: int = 0  # ZeRO-3: params smaller than this stay replicated
    activation_checkpointing: bool = False
    user_config: str | None = None    # a DeepSpeed JSON to merge on top (validated)
    checkpoint_interval: int = 0      # steps between sharded engine checkpoints; 0 = off
    checkpoint_dir: str | None = None # where they go (default: <output_dir>/checkpoints)
    resume_from: str | None = None    # a checkpoint dir (latest tag) or its stepN subfolder


@dataclass
class CompressionConfig:
    """Gradient compression as a DDP communication hook (chapter 05)."""

    method: str = "none"              # none | fp16 | bf16 | powersgd | topk | topk_naive
    topk_ratio: float = 0.01          # fraction of each bucket's elements sent (topk*)
    error_feedback: bool = True       # keep the unsent residual and add it next step (topk, powersgd)
    powersgd_rank: int = 4            # low-rank approximation rank
    powersgd_start_iter: int = 10     # plain all-reduce for the first iterations (warm-up)
    powersgd_warm_start: bool = True  # reuse the previous Q as the next initial guess


@dataclass
class ParallelConfig:
    """Mixed-parallel degrees and FSDP2 options (chapter 04)."""

    dp: int = -1                      # FSDP2 degree; -1: whatever is left (world / (tp·pp))
    tp: int = 1                       # tensor-parallel degree (must divide n_head)
    pp: int = 1                       # pipeline stages (<= n_layer)
    pp_schedule: str = "1f1b"         # gpipe | 1f1b
    pp_microbatches: int = 4          # pipeline micro-batches per optimizer step (>= pp; divides micro_batch × accum)
    sequence_parallel: bool = False   # shard LayerNorm/dropout activations over the tp group
    reshard_after_forward: bool = True  # FSDP2: free gathered params after forward (ZeRO-3-like)
    fsdp_cpu_offload: bool = False    # FSDP2 CPUOffloadPolicy (params, grads, optimizer in host memory)
    activation_checkpointing: bool = False  # recompute each block in backward (torch checkpoint_wrapper)
    count_collectives: bool = True    # count collectives and bytes per step (comm_* metrics; slows ops a little)


@dataclass
class FaultConfig:
    """Checkpointing, hang diagnosis and health checks (chapter 07; see ecomkit.faults.checkpoint, ecomkit.faults.health)."""

    checkpoint_interval: int = -1     # steps between checkpoints; 0 = off; -1 = auto: on (every ~5% of the
                                      #   run, at most 100 steps) only when a restart can use it
                                      #   (torchrun --max-restarts > 0, or --fail-at-step set)
    keep_last: int = 2                # keep this many complete checkpoints (0 = keep all)
    async_checkpoint: bool = False    # DCP async_save on its own gloo group: training continues while writing
    resume: bool = True               # resume from the newest complete checkpoint in checkpoint_dir
    checkpoint_dir: str = ""          # "" = <output_dir>/checkpoints; must be one folder all ranks see
    health_interval: int = 0          # steps between health samples (NVML on GPU, CPU/RAM otherwise); 0 = off
    straggler_factor: float = 2.0     # warn when a rank's forward time exceeds this × the others' median
    hang_dump_s: float = 0.0          # dump every rank's Python stacks when a step takes longer; 0 = off


@dataclass
class TrainConfig:
    """Everything one training run needs. Defaults: a 2-process CPU run that finishes in ~1 minute."""

    # --- model ------------------------------------------------------------
    model: str = "tiny"               # preset (tiny, small, seqgpt-560m, ecomgpt-7b), local dir or hub id
    tokenizer: str = "local"          # "local": BPE trained on the catalog; or a dir / hub id
    attn: str = "sdpa"                # sdpa (default, proven equal to eager) | eager | flex (GPU) attention
    loss_chunk_tokens: int = 1024     # LM head + loss this many label positions at a time, no [B,T,vocab]
                                      #   logits kept (0 = full logits); single/ddp/accelerate/fsdp only
    # --- data -------------------------------------------------------------
    task: str = "lm"                  # lm: causal text; nlu: SeqGPT-style instructions (loss on answers)
    data: str = "synthetic"           # "synthetic" or a .jsonl/.csv file or a save_to_disk directory
    n_rows: int = 4000                # rows generated when data == "synthetic"
    column_map: dict[str, str] | None = None  # user column -> ecomkit field, e.g. {"name": "title"}
    strict_data: bool = False         # raise on the first malformed row instead of skipping it
    bucketed: bool = True             # length-bucketed batches (less padding)
    seq_len: int = 128                # max tokens per sample (truncation)
    micro_batch_size: int = 8         # samples per device per forward/backward
    grad_accum: int = 1               # micro-steps per optimizer step
    global_batch_size: int = 0        # if > 0: derive grad_accum = this / (micro_batch * world)
    # --- optimisation -----------------------------------------------------
    lr: float = 3e-3                  # peak learning rate (AdamW)
    min_lr_ratio: float = 0.1         # cosine decays to lr * this
    warmup_steps: int = 10            # linear warm-up
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    max_grad_norm: float = 1.0        # 0 disables clipping
    clip_policy: str = "fixed"        # fixed | sentiment (the EcomGPT guide's adaptive clipping)
    precision: str = "fp32"           # fp32 | bf16 | fp16 (fp16 uses dynamic loss scaling)
    max_steps: int = 60               # optimizer steps; 0 = use epochs
    epochs: float = 0.0               # used when max_steps == 0
    eval_interval: int = 20           # steps between evaluations; 0 = only at the end
    eval_batches: int = 8             # micro-batches per evaluation (per rank)
    eval_nlu_samples: int = 64        # records scored per NLU accuracy evaluation
    seed: int = 0
    # --- run --------------------------------------------------------------
    output_dir: str = "runs/ddp"      # metrics.jsonl, summary.json, final model
    strategy: str = "ddp"             # ddp | accelerate | zero | fsdp | tp | pp | mixed
    bucket_cap_mb: float = 25.0       # DDP gradient bucket size
    gradient_as_bucket_view: bool = True  # DDP: grads are views into buckets (saves one copy)
    timeout_s: float = 600.0          # process-group timeout: a stalled rank fails instead of hanging
    num_proc: int = 1                 # tokenisation worker processes
    save_model: bool = True           # save_pretrained (safetensors) + tokenizer at the end
    progress: bool = True             # tqdm bar on rank 0
    log_interval: int = 1             # steps between metrics rows
    fail_at_step: int = -1            # fault injection: --fail-rank exits abruptly at this step, once
    fail_rank: int = 0                #   (not again after a torchrun restart); for tests and chapter 07
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)

    # ------------------------------------------------------------------
    def resolve_grad_accum(self, world_size: int) -> int:
        """Gradient accumulation steps, derived from ``global_batch_size`` when it is set."""
        if self.global_batch_size <= 0:
            return self.grad_accum
        per_step = self.micro_batch_size * world_size
        if self.global_batch_size % per_step:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is not divisible by micro_batch_size × "
                f"world_size = {self.micro_batch_size} × {world_size} = {per_step}. Choose a global batch "
                f"that is a multiple of {per_step}, or change --micro-batch-size.")
        return self.global_batch_size // per_step

    def validate(self, world_size: int | None = None) -> "TrainConfig":
        """Reject invalid values with one clear message each; returns self for chaining."""
        world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", 1))
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("precision", self.precision, PRECISIONS)
        _choice("task", self.task, TASKS)
        _choice("clip_policy", self.clip_policy, CLIP_POLICIES)
        _choice("attn", self.attn, ATTN_IMPLS)
        _choice("compression.method", self.compression.method, COMPRESSIONS)
        from ecomkit.parallel.compression.hooks import validate_compression  # chapter 05: ratio, rank, strategy

        validate_compression(self)
        for name in ("lr", "seq_len", "micro_batch_size", "grad_accum", "n_rows"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0.")
        for name in ("loss_chunk_tokens", "weight_decay", "max_grad_norm", "warmup_steps", "max_steps", "epochs",
                     "eval_interval"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0.")
        if self.max_steps == 0 and self.epochs <= 0:
            raise ConfigError("Set --max-steps > 0 or --epochs > 0: the run has no length.")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1].")
        if self.zero.stage not in (0, 1, 2, 3):
            raise ConfigError(f"zero.stage={self.zero.stage} must be 0, 1, 2 or 3.")
        self.resolve_grad_accum(world)
        self._validate_data_source()
        return self

    def _validate_data_source(self) -> None:
        if self.data != "synthetic" and not Path(self.data).exists():
            raise ConfigError(
                f"Data file '{self.data}' does not exist (resolved to {Path(self.data).resolve()}). "
                "Pass --data synthetic for the built-in catalog, or the path of a .jsonl/.csv file or "
                "of a directory written by datasets' save_to_disk().")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False))


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Unknown {name} '{value}'. Choose one of: {', '.join(allowed)}.{hint}")


# ---------------------------------------------------------------------- presets
def preset_ddp_tiny() -> TrainConfig:
    """Chapter 02 default: tiny BLOOM, causal LM, 60 steps; ~1 min with 2 CPU processes."""
    return TrainConfig()


def preset_nlu_tiny() -> TrainConfig:
    """SeqGPT-style NLU instructions; eval reports label accuracy."""
    cfg = preset_ddp_tiny()
    cfg.task = "nlu"
    cfg.output_dir = "runs/nlu"
    return cfg


def preset_small() -> TrainConfig:
    """The `small` preset used by benchmarks (hidden 256, 4 blocks)."""
    cfg = preset_ddp_tiny()
    cfg.model = "small"
    cfg.lr = 1e-3
    cfg.output_dir = "runs/small"
    return cfg


def preset_zero3_tiny() -> TrainConfig:
    """Chapter 03: DeepSpeed ZeRO-3 on the tiny model."""
    cfg = preset_ddp_tiny()
    cfg.strategy = "zero"
    cfg.zero.stage = 3
    cfg.max_steps = 20
    cfg.output_dir = "runs/zero3"
    return cfg


def preset_seqgpt_560m() -> TrainConfig:
    """Real SeqGPT-560M shape, for GPU servers: bf16, seq 512, ZeRO-2."""
    cfg = preset_ddp_tiny()
    cfg.model, cfg.seq_len, cfg.precision, cfg.micro_batch_size = "seqgpt-560m", 512, "bf16", 8
    cfg.lr, cfg.max_steps, cfg.output_dir = 2e-5, 1000, "runs/seqgpt-560m"
    return cfg


def preset_ecomgpt_7b() -> TrainConfig:
    """Real EcomGPT-7B shape, for GPU servers: bf16, ZeRO-3 with optimizer offload."""
    cfg = preset_seqgpt_560m()
    cfg.model, cfg.strategy, cfg.micro_batch_size = "ecomgpt-7b", "zero", 2
    cfg.zero.stage, cfg.zero.offload_optimizer = 3, True
    cfg.output_dir = "runs/ecomgpt-7b"
    return cfg


CONFIG_PRESETS: dict[str, Callable[[], TrainConfig]] = {
    "ddp-tiny": preset_ddp_tiny,
    "nlu-tiny": preset_nlu_tiny,
    "small": preset_small,
    "zero3-tiny": preset_zero3_tiny,
    "seqgpt-560m": preset_seqgpt_560m,
    "ecomgpt-7b": preset_ecomgpt_7b,
}


# ---------------------------------------------------------------------- CLI
def _flag(prefix: str, name: str) -> str:
    return "--" + (f"{prefix}-" if prefix else "") + name.replace("_", "-")


def _dest(prefix: str, name: str) -> str:
    return f"{prefix}__{name}" if prefix else name


def _base_type(tp: Any) -> Any:
    """Strip ``X | None`` to ``X``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args and typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)) else tp


def _parse_dict(text: str) -> dict[str, str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected JSON such as '{{\"name\": \"title\"}}', got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _add_fields(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _base_type(hints[f.name])
        if dataclasses.is_dataclass(tp):
            _add_fields(parser, tp, f.name)
            continue
        kw: dict[str, Any] = {"dest": _dest(prefix, f.name), "default": argparse.SUPPRESS}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) is dict or tp is dict:
            kw["type"] = _parse_dict
        else:
            kw["type"] = tp
        parser.add_argument(_flag(prefix, f.name), **kw)


def build_arg_parser(description: str = "", extra: Callable[[argparse.ArgumentParser], None] | None = None
                     ) -> argparse.ArgumentParser:
    """An argparse parser whose flags are derived from :class:`TrainConfig` (dashes, nested prefixes)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(CONFIG_PRESETS), default=None, help="start from a named preset")
    parser.add_argument("--config", default=None, help="YAML or JSON file with config values")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    _add_fields(parser, TrainConfig)
    if extra is not None:
        extra(parser)
    return parser


def apply_overrides(cfg: TrainConfig, values: dict[str, Any], source: str) -> TrainConfig:
    """Set (possibly nested) fields from a dict, rejecting unknown keys with a suggestion."""
    for key, value in values.items():
        target, name = cfg, key
        if isinstance(value, dict) and key in _nested_names():
            sub = getattr(cfg, key)
            for k2, v2 in value.items():
                _set_known(sub, k2, v2, f"{source}: {key}.")
            continue
        _set_known(target, name, value, f"{source}: ")
    return cfg


def _nested_names() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig) if dataclasses.is_dataclass(f.default_factory() if f.default_factory is not dataclasses.MISSING else None)}


def _set_known(obj: Any, name: str, value: Any, where: str) -> None:
    names = [f.name for f in dataclasses.fields(obj)]
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{where}unknown config key '{name}'.{hint} Valid keys: {', '.join(names)}.")
    setattr(obj, name, value)


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict (clear errors for missing or malformed files)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Config file '{path}' does not exist. Pass the path of a .yaml/.yml/.json file.")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml.YAMLError or json.JSONDecodeError
        raise ConfigError(f"Config file '{path}' could not be parsed: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Config file '{path}' must hold a mapping of keys to values, not {type(data).__name__}.")
    return data


def parse_config(argv: list[str] | None = None, description: str = "", defaults: TrainConfig | None = None,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None
                 ) -> tuple[TrainConfig, argparse.Namespace]:
    """Build a validated :class:`TrainConfig` from preset → ``--config`` file → flags.

    Returns the config and the namespace (for script-specific extra flags).
    Validation happens here, before any process group exists.
    """
    parser = build_arg_parser(description, extra)
    ns = parser.parse_args(argv)
    cfg = CONFIG_PRESETS[ns.preset]() if ns.preset else (defaults if defaults is not None else TrainConfig())
    if ns.config:
        apply_overrides(cfg, load_config_file(ns.config), ns.config)
    for dest, value in vars(ns).items():
        if dest in ("preset", "config", "print_config") or not hasattr(cfg, dest.split("__")[0]):
            continue
        if "__" in dest:
            outer, inner = dest.split("__", 1)
            setattr(getattr(cfg, outer), inner, value)
        else:
            setattr(cfg, dest, value)
    cfg.validate()
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, ensure_ascii=False))
        raise SystemExit(0)
    return cfg, ns
