#!/usr/bin/env python
"""Chapter 04: FSDP2, tensor parallel, pipeline parallel, 2-D and 3-D meshes for BLOOM, on ecomkit's one loop.

New compared with chapter 02: the strategy (``--strategy fsdp|tp|pp|mixed``, default ``mixed``) and its
degrees. Everything else (data, loss, metrics, evaluation, saving) is the same loop.

Launch lines:

  # FSDP2 over 2 processes (ZeRO-3-like sharding of params, grads and AdamW states)
  torchrun --standalone --nproc_per_node 2 scripts/04_mixed_parallel.py --dp 2
  # tensor parallel over 2 processes (each holds half of every block's Linear weights)
  torchrun --standalone --nproc_per_node 2 scripts/04_mixed_parallel.py --tp 2
  # two pipeline stages, 1F1B schedule with 4 micro-batches per step
  torchrun --standalone --nproc_per_node 2 scripts/04_mixed_parallel.py --pp 2 --parallel-pp-schedule 1f1b
  # a 2 × 2 mesh: TP inside pairs of ranks, FSDP2 across the pairs (4 processes)
  torchrun --standalone --nproc_per_node 4 scripts/04_mixed_parallel.py --dp 2 --tp 2
  # 3-D, dp 2 × tp 2 × pp 2 (8 processes): two stages, each split over a TP pair, each pair's shards FSDP2 × 2
  torchrun --standalone --nproc_per_node 8 scripts/04_mixed_parallel.py --dp 2 --tp 2 --pp 2 \
      --parallel-pp-microbatches 2
  # EcomGPT-7B shape on 8 GPUs: TP 2 inside NVLink pairs × FSDP 4, bf16, activation checkpointing
  torchrun --standalone --nproc_per_node 8 scripts/04_mixed_parallel.py --model ./models/EcomGPT-7B \\
      --tp 2 --dp 4 --precision bf16 --parallel-activation-checkpointing --seq-len 1024

Flags: every ``--parallel-*`` field of ecomkit.config.ParallelConfig (``--help`` lists them), plus the
short aliases ``--dp/--tp/--pp`` for ``--parallel-dp/--parallel-tp/--parallel-pp``, and
``--dcp-dir DIR`` (``--parallel-dcp-dir``): also save the trained (sharded) model with
torch.distributed.checkpoint into DIR. Every degree is checked before the process group exists. Ranks fill
the (pp, dp, tp) grid tp innermost: TP groups are neighbouring ranks (one node), pipeline stages outermost.

Outputs in --output-dir: metrics.jsonl (per step: loss, comm_count, comm_payload_bytes, comm_wire_bytes
per rank 0), summary.json, parallel_layout.json (every rank's parameter shapes and state bytes), final/
(a plain Hugging Face model, gathered from the shards).
"""

from ecomkit.config import PARALLEL_FLAG_ALIASES, TrainConfig, parse_config
from ecomkit.errors import exit_on_user_error
from ecomkit.metrics import print_run_summary
from ecomkit.train import run_training


def chapter_defaults() -> TrainConfig:
    cfg = TrainConfig()
    cfg.strategy, cfg.output_dir, cfg.max_steps = "mixed", "runs/mixed", 20
    cfg.precision = "fp32"   # chapter 04 asserts every (dp, tp, pp) layout equal to one process's losses
    return cfg


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, _ = parse_config(argv, description=__doc__, defaults=chapter_defaults(), aliases=PARALLEL_FLAG_ALIASES)
    summary = run_training(cfg)  # --dcp-dir: the run also writes the DCP shards (ecomkit.parallel.mixed)
    print_run_summary(summary)


if __name__ == "__main__":
    main()
