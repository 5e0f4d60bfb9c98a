#!/usr/bin/env python
"""Chapter 02: data-parallel fine-tuning of a BLOOM model with ecomkit's one training loop.

Launch lines (the same script everywhere; gloo on CPU, nccl on GPU, picked automatically):

  # one process (CPU or 1 GPU)
  python scripts/02_data_parallel.py
  # one node, N processes (N GPUs, or N CPU processes)
  torchrun --standalone --nproc_per_node 2 scripts/02_data_parallel.py
  # two nodes with 8 GPUs each (run on both; HOST is node 0's address)
  torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \
      --rdzv_id ecom1 scripts/02_data_parallel.py --model ./models/SeqGPT-560M --precision bf16
  # the same loop through Accelerate
  accelerate launch --multi_gpu --num_processes 2 scripts/02_data_parallel.py --strategy accelerate
  # SLURM: see scripts/slurm_2nodes.sbatch

Useful flags (all derived from ecomkit.config.TrainConfig; `--help` lists them):
  --model tiny|small|seqgpt-560m|ecomgpt-7b|<dir>|<hub id>   --task lm|nlu
  --max-steps 60 --micro-batch-size 8 --grad-accum 1 --global-batch-size 0 --precision fp32|bf16|fp16
  --output-dir runs/ddp --clip-policy fixed|sentiment --config my.yaml --print-config
Fault tolerance (chapter 07): under `torchrun --max-restarts 1 ...` checkpoints are written automatically
and a restarted job resumes from the newest one; `--fail-at-step K --fail-rank R` kills rank R once at
step K (for tests and demos); `--fault-checkpoint-interval N`, `--fault-async-checkpoint`,
`--fault-health-interval N`, `--timeout-s S` (a stalled rank fails after S seconds instead of hanging).
"""

from ecomkit.config import parse_config
from ecomkit.errors import exit_on_user_error
from ecomkit.metrics import print_run_summary
from ecomkit.train import run_training


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, _ = parse_config(argv, description=__doc__)
    summary = run_training(cfg)
    print_run_summary(summary)


if __name__ == "__main__":
    main()
