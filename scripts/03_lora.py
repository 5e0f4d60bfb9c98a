#!/usr/bin/env python
"""Chapter 03: LoRA (Hugging Face peft) beside full fine-tuning, under DDP, ZeRO-2/3 (± offload) and FSDP2.

  # every variant in one launch, outputs in <output-dir>/<variant>
  torchrun --standalone --nproc_per_node 2 scripts/03_lora.py --variants ddp:full,ddp:lora16,zero3:lora16,fsdp:lora16
  # a base checkpoint bigger than one rank: ZeRO-3 builds it under zero.Init, FSDP2 on the meta device
  torchrun --nproc_per_node 8 scripts/03_lora.py --model ./models/EcomGPT-7B --precision bf16 --variants zero3:lora16

A variant is strategy[+opt]:full|loraR with strategy ddp, accelerate, zero0-3 or fsdp (+opt: ZeRO optimizer
offload). A single LoRA run needs no variant list: `scripts/02_data_parallel.py --peft lora` (or 03_zero3.py,
04_mixed_parallel.py --strategy fsdp). Each run saves <run>/adapter (PEFT format) and <run>/final (merged).
"""

import argparse
import os

from ecomkit.config import TrainConfig, parse_config
from ecomkit.errors import exit_on_user_error
from ecomkit.metrics import print_run_summary
from ecomlab.measure.lora import parse_variants, probe_line, train_lora_variants


def script_defaults() -> TrainConfig:
    """Tiny BLOOM, causal LM on the catalog, a short run; LoRA's usual rank-16 adapters at lr 1e-2."""
    cfg = TrainConfig(n_rows=800, seq_len=64, max_steps=20, eval_interval=0, eval_batches=2, warmup_steps=3,
                      lr=1e-2, output_dir="runs/03_lora", lora_r=16, lora_alpha=32.0)
    cfg.precision = "fp32"   # chapter 03 compares LoRA under ZeRO with LoRA under DDP value for value
    return cfg


def extra_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variants", default="ddp:full,ddp:lora16,zero3:lora16,fsdp:lora16",
                        help="comma-separated strategy[+opt]:full|loraR runs, e.g. zero3+opt:lora16")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, ns = parse_config(argv, description=__doc__, defaults=script_defaults(), extra=extra_flags)
    for summary in train_lora_variants(cfg, parse_variants(ns.variants)):
        print_run_summary(summary)
        if int(os.environ.get("RANK", 0)) == 0:
            print(probe_line(summary), flush=True)


if __name__ == "__main__":
    main()
