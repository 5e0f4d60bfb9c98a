"""Every check of a :class:`~ecomkit.config.TrainConfig`, in one place, before any process group exists.

Why one place: a check inside a strategy costs a cluster start-up before the user learns of a typo. It runs from
``parse_config``, ``run_training`` and the loop once the model's shape is known; the shape comes in as numbers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path
from typing import Any

from ecomkit import find
from ecomkit.config.vocabulary import (ATTN_CHOICES, AUTO, CLIP_POLICIES, COMPILE_MODES, COMPRESSIONS, DDP_ALLREDUCES,
                                       HOOK_STRATEGIES, LOSS_KERNEL_CHOICES, LOSS_KERNEL_PACKAGES, MESH_STRATEGIES,
                                       PACKING_CHOICES, PEFT_METHODS, PP_BALANCES, PP_SCHEDULES, PRECISION_CHOICES,
                                       PROMPT_FORMATS, REPORT_TARGETS, SPAN_ENDS, STRATEGIES, STRATEGIES_WITHOUT_DCP,
                                       TASKS, StrategyName, check_choice, flag_of)
from ecomkit.errors import ConfigError

# schema.py imports this module (TrainConfig.validate), so its types are named, not imported (an import circle).
_TrainConfig = Any      # ecomkit.config.schema.TrainConfig
_ParallelConfig = Any   # ecomkit.config.schema.ParallelConfig

# The checks of options a default run leaves off (a fused loss kernel, LoRA and QLoRA, --compile, a label map),
# imported by name when one is set, so a run without them reads none (python -X importtime still counts them).
OPTION_CHECKS = "ecomkit.config.validate_options"

DEEPSPEED_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def validate_train_config(cfg: _TrainConfig, world_size: int, n_head: int | None = None,
                          n_layer: int | None = None) -> None:
    """Raise :class:`ConfigError` with one clear message for the first invalid value of ``cfg``."""
    check_choice("strategy", cfg.strategy, STRATEGIES)
    check_choice("precision", cfg.precision, PRECISION_CHOICES)
    check_choice("task", cfg.task, TASKS)
    check_choice("clip_policy", cfg.clip_policy, CLIP_POLICIES)
    check_choice("attn", cfg.attn, ATTN_CHOICES)
    check_choice("compile_mode", cfg.compile_mode, COMPILE_MODES)
    check_choice("compression.method", cfg.compression.method, COMPRESSIONS)
    check_compression(cfg)
    check_ddp_allreduce(cfg)
    check_choice("peft", cfg.peft, PEFT_METHODS)
    if cfg.peft != "none" or cfg.lora_base_bits != 16:
        option_checks().check_peft(cfg, world_size)
    check_choice("packing", cfg.packing, PACKING_CHOICES)
    check_lengths(cfg)
    check_recipe_words(cfg)
    for name in ("micro_batch_size", "grad_accum", "n_rows", "eval_batches"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{flag_of(name)} {getattr(cfg, name)}: must be > 0.")
    for name in ("loss_chunk_tokens", "weight_decay", "max_grad_norm", "epochs", "untimed_steps",
                 "final_eval_samples", "max_train_minutes"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{flag_of(name)} {getattr(cfg, name)}: must be >= 0.")
    if cfg.max_steps == 0 and cfg.epochs <= 0:
        raise ConfigError("Set --max-steps > 0 or --epochs > 0: the run has no length.")
    if not 0 <= cfg.min_lr_ratio <= 1:
        raise ConfigError(f"--min-lr-ratio {cfg.min_lr_ratio}: must be in [0, 1].")
    check_zero_options(cfg)
    check_parallel(cfg, world_size, n_head, n_layer)
    cfg.resolve_grad_accum(data_parallel_size(cfg, world_size))
    check_deepspeed_batch_sizes(cfg, world_size)
    check_fault_config(cfg)
    check_data_source(cfg)
    check_generation(cfg)
    if cfg.compile:
        option_checks().check_compile(cfg)
    check_loss_kernel(cfg)
    parse_report_to(cfg.report_to, check_installed=True)


def option_checks() -> Any:
    """:mod:`ecomkit.config.validate_options`, imported by name (:data:`OPTION_CHECKS`)."""
    return find(OPTION_CHECKS)


# ---------------------------------------------------------------------- --loss-kernel
# Strategies whose ranks do not end their forward in the whole LM head, so no loss of ecomkit's takes its hidden
# states (the same as ``Strategy.supports_chunked_loss``).
_NO_FORWARD_LOSS = {StrategyName.TP: "tensor parallelism shards the LM head's output over the ranks",
                    StrategyName.PP: "a pipeline's last stage computes its own loss"}


def check_loss_kernel(cfg: _TrainConfig) -> None:
    """The kernel is a known word, agrees with ``--loss-chunk-tokens``, and (liger, cce) can run here."""
    check_choice("loss_kernel", cfg.loss_kernel, LOSS_KERNEL_CHOICES)
    if cfg.loss_kernel == "chunked" and cfg.loss_chunk_tokens == 0:
        raise ConfigError(
            "--loss-kernel chunked with --loss-chunk-tokens 0: the chunked loss needs a number of positions per "
            "chunk, and 0 asks for the full logits. Give --loss-chunk-tokens N (1024 is the default), or use "
            "--loss-kernel full.")
    if cfg.loss_kernel in LOSS_KERNEL_PACKAGES:
        option_checks().check_fused_kernel(cfg, forward_loss_unsupported(cfg))


def forward_loss_unsupported(cfg: _TrainConfig) -> str | None:
    """Why ``cfg``'s strategy cannot run a loss inside the model's forward, or None where it can (the rule
    ``--loss-kernel auto`` and ``Strategy.supports_chunked_loss`` follow)."""
    why_not = _NO_FORWARD_LOSS.get(cfg.strategy)
    if why_not is None and cfg.strategy in (StrategyName.FSDP, StrategyName.MIXED) and (
            cfg.parallel.tp > 1 or cfg.parallel.pp > 1):
        why_not = f"with --parallel-tp {cfg.parallel.tp} --parallel-pp {cfg.parallel.pp} the head is sharded or staged"
    return why_not


# ---------------------------------------------------------------------- chapter 05: compression
def check_compression(cfg: _TrainConfig) -> None:
    """Ratio and rank in range; PowerSGD's warm-up long enough; a strategy that has DDP hooks."""
    comp = cfg.compression
    if not 0 < comp.topk_ratio <= 1:
        raise ConfigError(
            f"compression.topk_ratio={comp.topk_ratio} (flag --compression-topk-ratio) must be in (0, 1]: it is "
            "the fraction of each gradient bucket's entries that Top-K sends, e.g. 0.01 for 1 %.")
    if comp.powersgd_rank < 1:
        raise ConfigError(
            f"compression.powersgd_rank={comp.powersgd_rank} (flag --compression-powersgd-rank) must be >= 1: it "
            "is the rank of PowerSGD's low-rank approximation (1 to 4 is typical).")
    if comp.method == "powersgd" and (comp.powersgd_warm_start or comp.error_feedback) and comp.powersgd_start_iter < 2:
        raise ConfigError(
            f"compression.powersgd_start_iter={comp.powersgd_start_iter} (flag --compression-powersgd-start-iter) "
            "must be >= 2 with warm start or error feedback: DDP rebuilds its gradient buckets after the first "
            "step, so PowerSGD's per-bucket memories only make sense from the second step on. Use 2 or more, or "
            "pass --no-compression-powersgd-warm-start --no-compression-error-feedback.")
    if comp.method != "none" and cfg.strategy not in HOOK_STRATEGIES:
        raise ConfigError(
            f"--compression-method {comp.method} needs DDP communication hooks, and strategy '{cfg.strategy}' has "
            "none: ZeRO and FSDP reduce-scatter gradients in their own code, and tp/pp/mixed/accelerate do not "
            "expose DDP's hook. Use --strategy ddp with compression, or --compression-method none.")


def check_recipe_words(cfg: _TrainConfig) -> None:
    """``--lr``, ``--warmup-steps``, ``--max-steps``, ``--eval-interval``: a number in range, or ``auto``."""
    if cfg.lr != AUTO and (isinstance(cfg.lr, (bool, str)) or cfg.lr <= 0):
        raise ConfigError(f"--lr {cfg.lr}: must be > 0 (a number), or 'auto'.")
    for name in ("warmup_steps", "max_steps", "eval_interval"):
        number_or_auto(name, getattr(cfg, name), 0)


# The shortest --seq-len a run takes: shorter leaves no room for a prompt's instruction, labels and answer.
MIN_SEQ_LEN = 16


def number_or_auto(name: str, value: Any, minimum: int) -> None:
    """``value`` is ``"auto"`` or an integer >= ``minimum``; the message names the flag."""
    if value == AUTO:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag_of(name)} {value!r}: must be a whole number or 'auto'.")
    if value < minimum:
        raise ConfigError(f"{flag_of(name)} {value}: must be >= {minimum}, or 'auto'.")


def check_lengths(cfg: _TrainConfig) -> None:
    """``--seq-len`` and ``--gen-max-new-tokens``: a number or ``auto``; packing where a strategy can pack."""
    number_or_auto("seq_len", cfg.seq_len, MIN_SEQ_LEN)
    number_or_auto("gen_max_new_tokens", cfg.gen_max_new_tokens, 1)
    if cfg.packing == "on" and cfg.strategy in (StrategyName.TP, StrategyName.MIXED) \
            and cfg.parallel.sequence_parallel and cfg.seq_len != AUTO and cfg.seq_len % cfg.parallel.tp:
        raise ConfigError(
            f"--packing on with --parallel-sequence-parallel cuts every packed sequence of --seq-len {cfg.seq_len} "
            f"into tp={cfg.parallel.tp} equal pieces, so seq_len must be a multiple of {cfg.parallel.tp}. Give "
            f"--seq-len {-(-cfg.seq_len // cfg.parallel.tp) * cfg.parallel.tp}.")


def check_generation(cfg: _TrainConfig) -> None:
    """Decoding sizes in range; beam search only where transformers' generate() runs (not pp, not sequence parallel)."""
    if cfg.gen_eval_samples < 0:
        raise ConfigError(f"--gen-eval-samples {cfg.gen_eval_samples}: must be >= 0 (0: no evaluation by generation).")
    for name in ("gen_num_beams", "gen_batch_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{flag_of(name)} {getattr(cfg, name)}: must be >= 1.")
    par = cfg.parallel
    pipelined = cfg.strategy in (StrategyName.PP, StrategyName.MIXED) and par.pp > 1
    if cfg.gen_num_beams > 1 and (cfg.strategy == StrategyName.PP or pipelined or par.sequence_parallel):
        raise ConfigError(
            f"--gen-num-beams {cfg.gen_num_beams}: pipeline parallel and sequence parallel decode greedily without "
            "the KV cache (a pipeline's stages are separate modules; sequence parallel cannot cut a one-token step "
            "into tp pieces), so beam search is not available there. Use --gen-num-beams 1.")


def check_ddp_allreduce(cfg: _TrainConfig) -> None:
    """``--ddp-allreduce shm`` is a DDP communication hook: DDP only, and not beside a compression hook."""
    check_choice("ddp_allreduce", cfg.ddp_allreduce, DDP_ALLREDUCES)
    if cfg.ddp_allreduce == "process_group":
        return
    if cfg.strategy not in HOOK_STRATEGIES:
        raise ConfigError(f"--ddp-allreduce {cfg.ddp_allreduce} replaces DDP's gradient all-reduce, and strategy "
                          f"'{cfg.strategy}' does not use DDP. Use --strategy ddp, or drop --ddp-allreduce.")
    if cfg.compression.method != "none":
        raise ConfigError(f"--ddp-allreduce {cfg.ddp_allreduce} and --compression-method {cfg.compression.method} "
                          "both need DDP's one communication hook. Use one of the two.")


# ---------------------------------------------------------------------- chapter 03: ZeRO
def check_zero_options(cfg: _TrainConfig) -> None:
    """Combinations DeepSpeed would reject late (after start-up) or silently ignore."""
    z = cfg.zero
    if z.stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero.stage={z.stage} must be 0, 1, 2 or 3 (--zero-stage).")
    if cfg.strategy != StrategyName.ZERO:
        return
    if z.offload_param and z.stage != 3:
        raise ConfigError(
            f"--zero-offload-param needs ZeRO stage 3 (got --zero-stage {z.stage}): only stage 3 partitions the "
            "parameters, so only it can keep them on the CPU between uses. Use --zero-stage 3, or drop "
            "--zero-offload-param (--zero-offload-optimizer works with stages 1-3).")
    if z.offload_optimizer and z.stage == 0:
        raise ConfigError("--zero-offload-optimizer needs ZeRO stage 1, 2 or 3 (got --zero-stage 0).")
    if z.bucket_size <= 0:
        raise ConfigError(f"--zero-bucket-size {z.bucket_size}: must be > 0 (elements per bucket).")
    if z.param_persistence_threshold < 0:
        raise ConfigError(f"--zero-param-persistence-threshold {z.param_persistence_threshold}: must be >= 0.")


def load_deepspeed_json(path: str | os.PathLike) -> dict[str, Any]:
    """Read a user's DeepSpeed JSON (``--zero-user-config``); errors name the file, line and column."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"DeepSpeed config '{path}' (--zero-user-config) does not exist. Pass the path of a "
                          "JSON file, or omit the flag to use the config ecomkit generates.")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"DeepSpeed config '{path}', line {exc.lineno}, column {exc.colno}: not valid JSON "
                          f"({exc.msg}). Fix the file; note that JSON allows no comments or trailing commas.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"DeepSpeed config '{path}' must hold a JSON object, not {type(data).__name__}.")
    return data


def check_deepspeed_batch_sizes(cfg: _TrainConfig, world_size: int) -> None:
    """Each batch key a user's DeepSpeed JSON sets must equal this launch's (``train = micro × accum × world``)."""
    if cfg.strategy != StrategyName.ZERO or not cfg.zero.user_config:
        return
    user = load_deepspeed_json(cfg.zero.user_config)
    micro, accum = cfg.micro_batch_size, cfg.resolve_grad_accum(world_size)
    run = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
           "train_batch_size": micro * accum * world_size}
    for key in DEEPSPEED_BATCH_KEYS:
        if key in user and user[key] != run[key]:
            raise ConfigError(
                f"DeepSpeed config '{cfg.zero.user_config}': {key}={user[key]!r} disagrees with this run, which has "
                f"train_micro_batch_size_per_gpu={micro} (--micro-batch-size) × gradient_accumulation_steps={accum} "
                f"(--grad-accum / --global-batch-size) × {world_size} processes = "
                f"train_batch_size={run['train_batch_size']}. Remove the batch keys from the JSON (ecomkit fills "
                "them in) or change the flags to match.")


# ---------------------------------------------------------------------- chapter 04: parallel degrees
def resolve_parallel_degrees(strategy: str, parallel: _ParallelConfig, world_size: int) -> tuple[int, int, int]:
    """``(dp, tp, pp)`` for ``world_size`` processes; explicit degrees win: ``dp=-1`` is ``world / (tp·pp)``,
    ``--strategy tp`` (or ``pp``) with the degree left at 1 uses every process, ``fsdp`` is data parallel."""
    tp, pp, dp = int(parallel.tp), int(parallel.pp), int(parallel.dp)
    if strategy == StrategyName.TP and tp == 1 and dp == -1:
        tp = max(1, world_size // pp)
    if strategy == StrategyName.PP and pp == 1 and dp == -1:
        pp = max(1, world_size // tp)
    if dp == -1:
        if tp < 1 or pp < 1 or world_size % (tp * pp):
            raise ConfigError(
                f"--parallel-dp -1 takes the processes left after tp and pp, but tp={tp} × pp={pp} does not divide "
                f"the {world_size} processes. Choose tp and pp whose product divides {world_size}.")
        dp = world_size // (tp * pp)
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("world_size", world_size)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"parallel.{name}={value!r} must be a whole number >= 1 (flag --parallel-{name}"
                f"{'' if name == 'world_size' else f' or --{name}'}).")
    if dp * tp * pp != world_size:
        raise ConfigError(
            f"The parallel degrees do not multiply to the number of processes: dp={dp} × tp={tp} × "
            f"pp={pp} = {dp * tp * pp}, but torchrun started {world_size}. Change "
            f"--parallel-dp/--parallel-tp/--parallel-pp (or --dp/--tp/--pp) so that their product is "
            f"{world_size}, set --parallel-dp -1 to let dp take whatever is left, or launch "
            f"--nproc_per_node {dp * tp * pp}.")
    return dp, tp, pp


def data_parallel_size(cfg: _TrainConfig, world_size: int) -> int:
    """How many data shards the global batch is split into: dp for the mesh strategies, every rank otherwise."""
    if cfg.strategy in MESH_STRATEGIES:
        return resolve_parallel_degrees(cfg.strategy, cfg.parallel, world_size)[0]
    return world_size


def check_parallel(cfg: _TrainConfig, world_size: int, n_head: int | None = None,
                   n_layer: int | None = None) -> None:
    """Degrees, schedule, micro-batches, precision, ``--dcp-dir`` and (when known) the model's shape."""
    par = cfg.parallel
    if cfg.strategy not in MESH_STRATEGIES:
        if par.dcp_dir:
            raise ConfigError(f"--dcp-dir is for the chapter-04 strategies "
                              f"({', '.join(MESH_STRATEGIES)}), not --strategy {cfg.strategy}.")
        return
    dp, tp, pp = resolve_parallel_degrees(cfg.strategy, par, world_size)
    check_choice("parallel.pp_schedule", par.pp_schedule, PP_SCHEDULES)
    check_choice("parallel.pp_balance", par.pp_balance, PP_BALANCES)
    if par.pp_microbatches < 1:
        raise ConfigError(f"parallel.pp_microbatches={par.pp_microbatches} must be >= 1 "
                          "(flag --parallel-pp-microbatches).")
    if pp > 1 and par.pp_microbatches < pp:
        raise ConfigError(f"pp_microbatches={par.pp_microbatches} must be >= pp={pp} (the 1F1B schedule needs one "
                          "micro-batch per stage in flight). Raise --parallel-pp-microbatches.")
    step_samples = cfg.micro_batch_size * cfg.resolve_grad_accum(dp)
    if pp > 1 and step_samples % par.pp_microbatches:
        raise ConfigError(
            f"Pipeline parallelism cuts each optimizer step's {step_samples} samples (--micro-batch-size × "
            f"--grad-accum) into {par.pp_microbatches} pipeline micro-batches (--parallel-pp-microbatches), "
            "which must divide it. Change one of the three.")
    if cfg.precision == "fp16":
        raise ConfigError(
            "precision fp16 needs a loss scaler that understands sharded (DTensor) gradients, which the FSDP2/TP/PP "
            "strategies here do not set up. Use --precision bf16 (same memory, no loss scaling) or fp32.")
    where = f"model '{cfg.model}'"
    if n_head is not None and n_head % tp:
        divisors = [d for d in range(1, n_head + 1) if n_head % d == 0]
        raise ConfigError(
            f"Tensor parallelism splits the attention heads between ranks, but tp={tp} does not divide "
            f"the {n_head} heads of {where} (config field n_head). Use --parallel-tp (or --tp) with one of "
            f"{divisors}.")
    if n_layer is not None and pp > n_layer:
        raise ConfigError(
            f"Pipeline parallelism gives each stage at least one transformer block, but pp={pp} is larger "
            f"than the {n_layer} blocks of {where} (config field n_layer). Use --parallel-pp (or --pp) "
            f"<= {n_layer}.")


# ---------------------------------------------------------------------- chapter 07: fault tolerance
def dcp_unsupported_reason(cfg: _TrainConfig) -> str | None:
    """Why this run's state is not one DCP state dict of (model, optimizer), or None if it is."""
    return STRATEGIES_WITHOUT_DCP.get(cfg.strategy)


def parse_report_to(value: str | Any, check_installed: bool = False) -> list[str]:
    """``"tensorboard,wandb"`` (or a list) -> names; ``"none"``/``""`` -> []. With ``check_installed``, a
    target whose package is missing is a ConfigError naming the extra to install (nothing is imported)."""
    names = [n.strip().lower() for n in (value.split(",") if isinstance(value, str) else value) if n.strip()]
    for name in names:
        check_choice("report_to", name, tuple(REPORT_TARGETS))
    if "none" in names and len(names) > 1:
        raise ConfigError(f"--report-to {value!r}: 'none' cannot be combined with {[n for n in names if n != 'none']}.")
    names = [n for n in dict.fromkeys(names) if n != "none"]
    for name in names if check_installed else ():
        if importlib.util.find_spec(REPORT_TARGETS[name]) is None:
            raise ConfigError(f"--report-to {name}: the {REPORT_TARGETS[name]} package is not installed. "
                              f"pip install 'ecomkit[{name}]', or drop it from --report-to (none logs nothing).")
    return names


def parse_signal_names(text: str) -> list[signal.Signals]:
    """``"SIGTERM,SIGUSR1"`` (or ``"TERM,USR1"``) -> signals; ``""`` -> none (fault.preempt_signals)."""
    out = []
    for name in (p.strip().upper() for p in text.split(",") if p.strip()):
        full = name if name.startswith("SIG") else "SIG" + name
        sig = getattr(signal, full, None)
        if not isinstance(sig, signal.Signals) or full in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"{name!r} is not a signal that can be caught here (e.g. SIGTERM, SIGUSR1, SIGINT)")
        out.append(sig)
    return out


def check_fault_config(cfg: _TrainConfig) -> None:
    """Checkpoint interval, health sampling and straggler settings; DCP checkpoints only where they apply."""
    f = cfg.fault
    if f.checkpoint_interval < -1:
        raise ConfigError(f"--fault-checkpoint-interval {f.checkpoint_interval}: use a number of steps > 0, "
                          "0 to switch checkpoints off, or -1 for automatic.")
    if f.health_interval < 0 or f.hang_dump_s < 0:
        raise ConfigError("--fault-health-interval and --fault-hang-dump-s must be >= 0 (0 switches them off).")
    if f.straggler_factor <= 1:
        raise ConfigError(f"--fault-straggler-factor {f.straggler_factor}: must be > 1 (e.g. 2: warn when a rank "
                          "is twice as slow as the others).")
    try:
        parse_signal_names(f.preempt_signals)
    except ValueError as exc:
        raise ConfigError(f"--fault-preempt-signals {f.preempt_signals!r}: {exc}; \"\" switches preemption "
                          f"off.") from None
    reason = dcp_unsupported_reason(cfg)
    if f.checkpoint_interval > 0 and reason:
        raise ConfigError(
            f"--fault-checkpoint-interval is not supported with --strategy {cfg.strategy}: {reason}, which these "
            "DCP checkpoints do not cover. Use --strategy ddp/accelerate/fsdp/tp, or --fault-checkpoint-interval 0.")


# ---------------------------------------------------------------------- data
def check_data_source(cfg: _TrainConfig) -> None:
    if cfg.data != "synthetic" and not Path(cfg.data).exists():
        raise ConfigError(
            f"Data file '{cfg.data}' does not exist (resolved to {Path(cfg.data).resolve()}). "
            "Pass --data synthetic for the built-in catalog, or the path of a .jsonl/.csv file or "
            "of a directory written by datasets' save_to_disk().")
    if cfg.max_rows < 0 or cfg.max_rows == 1:
        raise ConfigError(f"max_rows={cfg.max_rows} (flag --max-rows) must be 0 (use every valid row of the file) "
                          "or at least 2.")
    if not 0.0 <= cfg.max_bad_fraction <= 1.0:
        raise ConfigError(f"max_bad_fraction={cfg.max_bad_fraction} (flag --max-bad-fraction) must be in [0, 1]: "
                          "the share of malformed rows above which a run stops, e.g. 0.05.")
    if cfg.label_map is not None:
        option_checks().check_label_map_shape(cfg.label_map)
    check_task_data(cfg)


def check_task_data(cfg: _TrainConfig) -> None:
    """The NLU prompt format, the eval file, the extraction labels and the span-end convention."""
    check_choice("prompt_format", cfg.prompt_format, PROMPT_FORMATS)
    check_choice("span_end", cfg.span_end, SPAN_ENDS)
    if cfg.eval_data and not Path(cfg.eval_data).exists():
        raise ConfigError(f"Eval file '{cfg.eval_data}' (flag --eval-data) does not exist (resolved to "
                          f"{Path(cfg.eval_data).resolve()}). Pass a .jsonl/.csv file or save_to_disk directory in "
                          "the shape of --data, or leave it empty to hold out 5 % of the data.")
    names = [n.strip() for n in cfg.labels.split(",")] if cfg.labels else []
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"labels={cfg.labels!r} (flag --labels) must be distinct, non-empty label names separated "
                          "by commas, e.g. --labels 品牌,颜色,尺码.")
