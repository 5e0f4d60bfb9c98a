"""The one training configuration: dataclasses with commented defaults, and named presets.

Why one dataclass: a notebook, a script and a test must describe the same run in the same words. Flags are derived
from the fields (:mod:`ecomkit.config.cli`); :meth:`TrainConfig.validate` rejects invalid values before any process
group exists. Presets are functions returning a config; variants call a base and change a few fields (torchtitan's).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ecomkit.config.validate import validate_train_config
from ecomkit.errors import ConfigError

# BLOOM's attention (fused QKV, output projection) and MLP Linears: LoRA's usual targets for this family.
BLOOM_LORA_TARGETS = "query_key_value,dense,dense_h_to_4h,dense_4h_to_h"


class Sealable:
    """A config whose sealed copy refuses every write: a run resolves its ``auto`` values once, then only reads."""

    _sealed = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._sealed:
            raise dataclasses.FrozenInstanceError(
                f"cannot assign {type(self).__name__}.{name}: a run's resolved configuration is frozen "
                "(ecomkit.train.resolve resolves it once); change the flags before the run starts")
        object.__setattr__(self, name, value)

    def __deepcopy__(self, memo: dict) -> "Sealable":
        """A copy is a new configuration, writable until it is sealed: a probe or a sweep variant starts from a run's."""
        out = type(self).__new__(type(self))
        memo[id(self)] = out
        for name, value in self.__dict__.items():
            if name != "_sealed":
                object.__setattr__(out, name, copy.deepcopy(value, memo))
        return out

    def sealed(self) -> "Sealable":
        """A deep copy that refuses writes, its sub-configs too."""
        out = copy.deepcopy(self)
        for obj in [out, *(getattr(out, f.name) for f in dataclasses.fields(out))]:
            if isinstance(obj, Sealable):
                object.__setattr__(obj, "_sealed", True)
        return out


@dataclass
class ZeroConfig(Sealable):
    """DeepSpeed ZeRO options (chapter 03); used when ``strategy == "zero"``."""

    stage: int = 3                    # 1: optimizer states, 2: + gradients, 3: + parameters
    offload_optimizer: bool = False   # optimizer states and step on the CPU (DeepSpeedCPUAdam)
    offload_param: bool = False       # ZeRO-3 only: parameters live on the CPU between uses
    overlap_comm: bool = True         # overlap gradient reduction with the backward pass
    contiguous_gradients: bool = True # copy gradients into one buffer to avoid fragmentation
    bucket_size: int = 50_000_000     # elements per reduce / allgather bucket
    param_persistence_threshold: int = 0  # ZeRO-3: params smaller than this stay replicated
    activation_checkpointing: bool = False  # recompute each block in backward (deepspeed.checkpointing)
    user_config: str | None = None    # a DeepSpeed JSON to merge on top (validated)
    checkpoint_interval: int = 0      # steps between sharded engine checkpoints; 0 = off. Under torchrun
                                      #   --max-restarts a restarted attempt resumes from the newest of them
    checkpoint_dir: str | None = None # where they go (default: <output_dir>/checkpoints)
    resume_from: str | None = None    # a checkpoint dir (latest tag) or its stepN subfolder


@dataclass
class CompressionConfig(Sealable):
    """Gradient compression as a DDP communication hook (chapter 05)."""

    method: str = "none"              # none | fp16 | bf16 | powersgd | topk | topk_naive
    topk_ratio: float = 0.01          # fraction of each bucket's elements sent (topk*)
    error_feedback: bool = True       # keep the unsent residual and add it next step (topk, powersgd)
    powersgd_rank: int = 4            # low-rank approximation rank
    powersgd_start_iter: int = 10     # plain all-reduce for the first iterations (warm-up)
    powersgd_warm_start: bool = True  # reuse the previous Q as the next initial guess


@dataclass
class ParallelConfig(Sealable):
    """Mixed-parallel degrees and FSDP2 options (chapter 04)."""

    dp: int = -1                      # FSDP2 degree (shards every layout's replicas, a pipeline's stages too);
                                      #   -1: whatever is left (world / (tp·pp))
    tp: int = 1                       # tensor-parallel degree (must divide n_head)
    pp: int = 1                       # pipeline stages (<= n_layer)
    pp_schedule: str = "1f1b"         # gpipe | 1f1b
    pp_microbatches: int = 4          # pipeline micro-batches per optimizer step (>= pp; divides micro_batch × accum)
    pp_balance: str = "layers"        # layers: stages get equal numbers of blocks (the earlier ones the extras);
                                      #   compute: the last stage gets fewer, for the LM head it also runs (whole
                                      #   on every tp rank), so stages take about equal time
    sequence_parallel: bool = False   # shard LayerNorm/dropout activations over the tp group
    reshard_after_forward: bool = True  # FSDP2: free gathered params after forward (ZeRO-3-like)
    fsdp_cpu_offload: bool = False    # FSDP2 CPUOffloadPolicy (params, grads, optimizer in host memory)
    activation_checkpointing: bool = False  # recompute each block in backward (torch checkpoint_wrapper)
    count_collectives: bool = True    # count collectives and bytes per step (comm_* metrics; slows ops a little)
    dcp_dir: str | None = None        # also save the sharded model with torch.distributed.checkpoint here (any
                                      #   dp × tp × pp; one process loads it: parallel.mixed.load_sharded_model)


@dataclass
class FaultConfig(Sealable):
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
    preempt_signals: str = "SIGTERM,SIGUSR1"  # on these, finish the step, checkpoint it, exit 75; a rerun
                                      #   resumes there ("" = off; SIGUSR1 still prints the stacks too)


@dataclass
class TrainConfig(Sealable):
    """Everything one training run needs. Defaults: a 2-process CPU run that finishes in ~1 minute."""

    # --- model ------------------------------------------------------------
    model: str = "tiny"               # preset (tiny, small, seqgpt-560m, ecomgpt-7b), local dir or hub id
    tokenizer: str = "local"          # "local": BPE trained on the catalog; or a dir / hub id
    attn: str = "auto"                # auto: sdpa, except eager at the precision and lengths where bench_attn_rule
                                      #   measured it faster on this CPU, or on this GPU's kind (pick_attention;
                                      #   an unmeasured GPU: sdpa, said so) | sdpa (proven equal to eager) |
                                      #   eager | flex (GPU)
    fused_gelu: bool = True           # BLOOM's MLP GELU as one ATen kernel each way (the same tanh approximation;
                                      #   transformers' runs ~20 elementwise kernels, 25 % of a bf16 CPU step);
                                      #   --no-fused-gelu keeps transformers' own (fast/cpu_kernels.py)
    cpu_kernels: bool = True          # on CPU, BLOOM's GeLU and the LM-head loss through ecomkit's AVX-512 kernels
                                      #   (one pass each way; built once by make install; ATen's kernels where
                                      #   the CPU has no AVX-512 or no compiler) (fast/cpu_kernels.py)
    compile: bool = False             # torch.compile one BLOOM block, reused by every block, and the LM head +
                                      #   loss apart (fast/compile.py): compile time does not grow with depth;
                                      #   evaluation and generation run the same weights uncompiled
    compile_mode: str = "default"     # torch.compile mode of --compile: default | reduce-overhead (CUDA graphs) |
                                      #   max-autotune-no-cudagraphs
    untimed_steps: int = 1            # first steps left out of throughput and step-time figures (warm-up); with
                                      #   --compile, the first step compiles: leave it out
    loss_chunk_tokens: int = 1024     # LM head + loss this many label positions at a time, no [B,T,vocab]
                                      #   logits kept (0 = full logits); not under tp or pp (full logits)
    loss_kernel: str = "auto"         # LM head + cross-entropy: chunked (ecomkit's, --loss-chunk-tokens) | full
                                      #   (the [B,T,vocab] logits) | liger (liger-kernel's fused linear CE) | cce
                                      #   (cut-cross-entropy); liger and cce need CUDA (pip install 'ecomkit[gpu]').
                                      #   auto: chunked on CPU (bench_kernels), on a GPU the kernel gpu_bench
                                      #   measured fastest there (models/loss.py), chunked while unmeasured;
                                      #   full when --loss-chunk-tokens 0
    # --- data -------------------------------------------------------------
    task: str = "lm"                  # lm: causal text; nlu: SeqGPT-style instructions (loss on answers)
    data: str = "synthetic"           # "synthetic" or a .jsonl/.csv file or a save_to_disk directory
    n_rows: int = 4000                # rows generated when data == "synthetic" (a file is used whole)
    max_rows: int = 0                 # use at most this many valid rows of a data file (0 = all; logged)
    column_map: dict[str, str] | None = None  # user column -> ecomkit field, e.g. {"name": "title"}
    label_map: dict[str, dict[str, str]] | None = None  # raw label -> name, e.g. {"sentiment": {"0": "negative"}}
    strict_data: bool = False         # raise on the first malformed row instead of skipping it
    max_bad_fraction: float = 0.05    # stop when more than this share of a file's rows is malformed
    prompt_format: str = "seqgpt"     # nlu prompt layout: seqgpt (SeqGPT-560M's own prompt), ecomgpt (EcomGPT's
                                      #   instruction block) or ecomkit (the earlier task prompts); saved with the model
    eval_data: str = ""               # evaluate on this file (same shapes and maps) instead of a 5 % split; "" = split
    labels: str = ""                  # extraction label set in prompt order, comma-separated, e.g. 品牌,颜色
                                      #   ("" = every span label of the data; spans of other labels are left out)
    span_end: str = "exclusive"       # end offsets of span lists: exclusive (Python slicing) or inclusive
    bucketed: bool = True             # length-bucketed batches (less padding) when rows are not packed
    seq_len: int | str = "auto"       # tokens per sequence. auto: the smallest multiple of 64 that holds every row
                                      #   of both splits, up to the model's limit (nothing cut below it); N, or
                                      #   the limit: longer rows are cut at the end of their input (counted in
                                      #   the data line), LM documents split into windows (data/lengths.py)
    packing: str = "auto"             # pack rows into full sequences of seq_len tokens, each row attending only
                                      #   to itself (document mask; exact for BLOOM's ALiBi): on | off | auto (on
                                      #   when the mean training row fills at most half of seq_len; on a CPU only
                                      #   at the precisions and seq_len bench_packing measured it faster (bf16 up
                                      #   to 256): off at fp32, so the chapters' fp32 comparisons train on the
                                      #   rows they always did)
    micro_batch_size: int = 8         # samples per device per forward/backward (sequences of seq_len when packed)
    grad_accum: int = 1               # micro-steps per optimizer step
    global_batch_size: int = 0        # if > 0: derive grad_accum = this / (micro_batch * world)
    # --- optimisation -----------------------------------------------------
    lr: float | str = "auto"          # peak learning rate (AdamW). auto: by what is trained (config/recipe.py):
                                      #   3e-3 for a random-init preset, 2e-5 for real weights fully
                                      #   fine-tuned, 2e-4 for real weights with LoRA
    min_lr_ratio: float = 0.1         # cosine decays to lr * this
    warmup_steps: int | str = "auto"  # linear warm-up steps. auto: 10 for a preset, 5 % of the steps for real weights
    weight_decay: float = 0.01        # AdamW decoupled weight decay (none on biases, LayerNorms, embeddings)
    beta1: float = 0.9                # AdamW first-moment decay
    beta2: float = 0.95               # AdamW second-moment decay
    max_grad_norm: float = 1.0        # 0 disables clipping
    clip_policy: str = "fixed"        # fixed | sentiment (the EcomGPT guide's adaptive clipping)
    precision: str = "auto"           # fp32 | bf16 | fp16 | auto (fp16: dynamic loss scaling; auto: bf16 where the
                                      #   device multiplies faster in it, measured on CPU, else fp32). The chapters
                                      #   that assert 1 vs N processes equal (02-05) pin fp32 in their scripts
    max_steps: int | str = "auto"     # optimizer steps; 0 = use --epochs. auto: 60 (the mechanics), except --task nlu
                                      #   on a data file: epochs of its rows, bounded by a time estimate (recipe.py)
    epochs: float = 0.0               # passes over the training data; used when --max-steps is 0 or auto
    max_train_minutes: float = 15.0   # a run whose length auto chose (--task nlu on a data file) is shortened,
                                      #   schedule too, when its measured steps say it would train longer; 0 = no cap
    eval_interval: int | str = "auto" # steps between evaluations, from step 0; 0 = only at the end. auto: 20, or
                                      #   once an epoch where --task nlu on a data file trains epochs (recipe.py)
    eval_batches: int = 8             # micro-batches per periodic evaluation (per rank); the final one reads all
    eval_nlu_samples: int = 64        # records scored per target by a periodic NLU accuracy evaluation
    gen_eval_samples: int = 32        # held-out classify/extract examples decoded per periodic evaluation
                                      #   (0 = no evaluation by generation at all)
    final_eval_samples: int = 0       # the final evaluation's cap on examples per figure (loss, records per
                                      #   target, decoded examples); 0 = every held-out row
    gen_max_new_tokens: int | str = "auto"  # answer tokens generated at most per example; auto: the longest
                                      #   training answer + 8; generations that reach it are counted
    gen_num_beams: int = 1            # 1 = greedy; > 1 = beam search (not with pp or sequence parallel)
    gen_batch_size: int = 8           # prompts per decoding batch, per rank (left-padded)
    gen_use_cache: bool = True        # decode with the model's KV cache (False: recompute the prefix each step)
    seed: int = 0                     # random seed: model init, synthetic data, batch order
    # --- parameter-efficient fine-tuning (Hugging Face peft; ecomkit.models.lora) ---
    peft: str = "none"                # none: train every weight | lora: frozen base + low-rank adapters (peft)
    lora_r: int = 8                   # LoRA rank r: each adapted Linear gains r × (in + out) trainable weights
    lora_alpha: float = 16.0          # LoRA scaling numerator: the update is (alpha / r) · B·A
    lora_dropout: float = 0.0         # dropout on the adapter's input (0 keeps runs bit-reproducible)
    lora_target_modules: str = BLOOM_LORA_TARGETS  # comma-separated names of the Linears that get adapters
    lora_modules_to_save: str = ""    # comma-separated modules trained in full and saved with the adapter
                                      #   (e.g. word_embeddings after adding special tokens); "" = none
    lora_base_bits: int = 16          # 16: frozen base in the training dtype | 8 or 4: QLoRA, the adapted Linears
                                      #   stored by bitsandbytes (int8 / nf4); ddp only (pip install ecomkit[qlora])
    # --- run --------------------------------------------------------------
    output_dir: str = "runs/ddp"      # metrics.jsonl, summary.json, final model
    strategy: str = "ddp"             # ddp | accelerate | zero | fsdp | tp | pp | mixed
    bucket_cap_mb: float = 25.0       # DDP gradient bucket size
    gradient_as_bucket_view: bool = True  # DDP: grads are views into buckets (saves one copy)
    ddp_allreduce: str = "process_group"  # DDP's gradient all-reduce: process_group (gloo/nccl) | shm
                                            #   (CPU ranks on one host: through /dev/shm instead of loopback
                                            #   TCP; DeepSpeed's op, built by make install; refuses compression
                                            #   and torchrun --max-restarts; fast/shm_allreduce.py)
    timeout_s: float = 600.0          # process-group timeout: a stalled rank fails instead of hanging
    num_proc: int = 1                 # tokenisation worker processes
    save_model: bool = True           # save_pretrained (safetensors) + tokenizer at the end
    progress: bool = True             # tqdm bar on rank 0
    verbose: bool = False             # the start-up report with every setting's full reason (summary.json has them)
    log_interval: int = 1             # steps between the loop's reads of the device (losses, counts, gradient
                                      #   norms; written then, a row per step) and of the preemption flag: on a GPU
                                      #   the steps between read nothing and never wait for it (10 is a good value)
    report_to: str = "tensorboard"    # also log every metrics row (rank 0) to: tensorboard, wandb, mlflow (a
                                      #   comma list) or none; tensorboard --logdir <output_dir> (docs/guide.md)
    fail_at_step: int = -1            # fault injection: --fail-rank exits abruptly at this step, once
                                      #   (not again after a torchrun restart); for tests and chapter 07
    fail_rank: int = 0                # the rank that --fail-at-step ends
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
                f"--global-batch-size {self.global_batch_size} is not divisible by --micro-batch-size × "
                f"world size = {self.micro_batch_size} × {world_size} = {per_step}. Choose a global batch "
                f"that is a multiple of {per_step}, or change --micro-batch-size.")
        return self.global_batch_size // per_step

    def validate(self, world_size: int | None = None, n_head: int | None = None,
                 n_layer: int | None = None) -> "TrainConfig":
        """Check everything about this config before any process group exists; returns self for chaining.

        ``world_size`` defaults to ``$WORLD_SIZE`` (1 without torchrun). ``n_head``/``n_layer``: the model's shape
        when known; this package cannot import the models, so the loop validates again once the model is loaded.
        """
        world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", 1))
        validate_train_config(self, world, n_head=n_head, n_layer=n_layer)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False))


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
    cfg.precision = "fp32"   # chapter 03 asserts each ZeRO stage equal to DDP (1e-4): no autocast rounding between
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
