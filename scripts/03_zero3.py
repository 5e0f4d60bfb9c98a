#!/usr/bin/env python
"""Chapter 03: DeepSpeed ZeRO-1/2/3 (and CPU offload) under ecomkit's one training loop.

What is new compared with scripts/02_data_parallel.py: the strategy is
`zero` (a DeepSpeed engine generated from the same config), and the run
writes ds_config.json (the DeepSpeed config it used) and memory.json (the
bytes of params / grads / optimizer states each rank held).

Launch lines (gloo + DS_ACCELERATOR=cpu without GPUs, nccl with them; ecomkit picks them):

  torchrun --standalone --nproc_per_node 4 scripts/03_zero3.py           # ZeRO-3, tiny model
  torchrun --standalone --nproc_per_node 2 scripts/03_zero3.py --zero-stage 2 --zero-offload-optimizer
  # the deepspeed launcher (what the SeqGPT guide uses); on CPU it needs --num_gpus, else it starts ONE process
  deepspeed --num_gpus 2 scripts/03_zero3.py --zero-stage 3
  # GPU servers: the real SeqGPT-560M shape in bf16
  torchrun --nproc_per_node 8 scripts/03_zero3.py --model seqgpt-560m --precision bf16 --max-steps 200

Useful flags (`--help` lists all; every TrainConfig field is a flag):
  --zero-stage 0|1|2|3  --zero-offload-optimizer  --zero-offload-param  --precision fp32|bf16|fp16
  --zero-activation-checkpointing  --zero-bucket-size N  --zero-user-config my_ds.json (validated, merged)
  --zero-checkpoint-interval 10 [--zero-checkpoint-dir DIR]   sharded engine checkpoints
  --zero-resume-from DIR[/stepN]                              continue a run exactly
  --consolidate-to DIR    merge a sharded checkpoint into a save_pretrained folder (one process) and exit
  --print-ds-config [--ds-world-size 8]   print the generated DeepSpeed JSON and exit (nothing launched)
  --print-ds-config --ds-for-trainer      the "auto" form for HF Trainer (scripts/03_hf_trainer_zero.py --trainer-ds-config)
  --stages ddp,1,2,3,3+opt,3@bf16         several variants in one launch, each in <output-dir>/<variant>
"""

from __future__ import annotations

import argparse
import os

from ecomkit.config import TrainConfig, parse_config, preset_zero3_tiny
from ecomkit.errors import exit_on_user_error
from ecomkit.metrics import print_run_summary
from ecomkit.parallel.zero.checkpoint import consolidate_run
from ecomkit.parallel.zero.config import format_zero_config, trainer_auto_config, zero_config_for_launch
from ecomlab.measure.zero import model_states_line, train_zero_variants


def script_defaults() -> TrainConfig:
    """The `zero3-tiny` preset, short enough for 4 processes on a 2-core laptop."""
    cfg = preset_zero3_tiny()
    cfg.max_steps, cfg.n_rows, cfg.seq_len, cfg.eval_interval, cfg.eval_batches = 10, 800, 64, 0, 2
    cfg.warmup_steps = 3
    return cfg


def extra_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-ds-config", action="store_true", help="print the DeepSpeed JSON and exit")
    parser.add_argument("--ds-for-trainer", action="store_true",
                        help="with --print-ds-config: the \"auto\" form for TrainingArguments(deepspeed=...): batch "
                             "sizes, clipping, precision and buckets filled in by Trainer, train_batch_size left out")
    parser.add_argument("--ds-world-size", type=int, default=None,
                        help="with --print-ds-config: the number of processes to size the batch for (default: "
                             "$WORLD_SIZE or 1)")
    parser.add_argument("--consolidate-to", default=None,
                        help="merge the sharded checkpoint given by --zero-resume-from into this save_pretrained dir")
    parser.add_argument("--stages", default=None,
                        help="run several variants in turn, e.g. ddp,1,2,3,3+opt (outputs in <output-dir>/<variant>)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help=argparse.SUPPRESS)  # the deepspeed launcher passes it; LOCAL_RANK is read instead


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, ns = parse_config(argv, description=__doc__, defaults=script_defaults(), extra=extra_flags)
    if ns.print_ds_config:
        ds = trainer_auto_config(cfg) if ns.ds_for_trainer else zero_config_for_launch(cfg, ns.ds_world_size)
        print(format_zero_config(ds))
        return
    if ns.consolidate_to:
        ckpt_dir, tag = consolidate_run(cfg, ns.consolidate_to)
        print(f"consolidated {ckpt_dir}/{tag} into {ns.consolidate_to}")
        return
    for summary in train_zero_variants(cfg, ns.stages):
        print_run_summary(summary)
        if int(os.environ.get("RANK", 0)) == 0:
            print(model_states_line(summary), flush=True)


if __name__ == "__main__":
    main()
