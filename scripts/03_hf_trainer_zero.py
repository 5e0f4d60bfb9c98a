#!/usr/bin/env python
"""Chapter 03, Trainer path: the same ZeRO config through Hugging Face Trainer.

  torchrun --standalone --nproc_per_node 2 scripts/03_hf_trainer_zero.py --zero-stage 3 --max-steps 10

What is new compared with scripts/02_hf_trainer.py: `TrainingArguments(deepspeed=<dict>)`
gets the config ecomkit generates from the same flags (no "auto" placeholders
for Trainer to fill in), also saved as <output-dir>/ds_config.json. On CPU,
Trainer needs `use_cpu=True` under torchrun (ecomkit.train.hf_trainer sets it),
or it sees a world size of 1.

With `--trainer-ds-config ds.json` Trainer gets a JSON file instead, such as
the "auto" form that `scripts/03_zero3.py --print-ds-config --ds-for-trainer`
prints: Trainer fills in batch sizes, clipping and precision from its own
arguments, so the same file works for any `--micro-batch-size`.
"""

from __future__ import annotations

import argparse
import os

from ecomkit.config import TrainConfig, parse_config, preset_zero3_tiny
from ecomkit.errors import exit_on_user_error
from ecomkit.parallel.zero.config import trainer_zero_config
from ecomkit.train.hf_trainer import run_hf_trainer


def script_defaults() -> TrainConfig:
    cfg = preset_zero3_tiny()
    cfg.max_steps, cfg.n_rows, cfg.seq_len, cfg.eval_interval, cfg.output_dir = 10, 800, 64, 0, "runs/zero3-trainer"
    return cfg


def trainer_ds_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trainer-ds-config", default=None,
                        help="a DeepSpeed JSON handed to TrainingArguments(deepspeed=...) as is, e.g. the \"auto\" "
                             "form written by `scripts/03_zero3.py --print-ds-config --ds-for-trainer` (default: "
                             "the config generated from this script's flags)")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, ns = parse_config(argv, description=__doc__, defaults=script_defaults(), extra=trainer_ds_flag)
    ds = ns.trainer_ds_config if ns.trainer_ds_config else trainer_zero_config(cfg)
    summary = run_hf_trainer(cfg, deepspeed=ds)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"HF Trainer + DeepSpeed ZeRO-{cfg.zero.stage}: loss {summary['first_loss']:.4f} → "
              f"{summary['final_loss']:.4f}, {summary['samples_per_s']:.1f} samples/s, outputs in {summary['output_dir']}")


if __name__ == "__main__":
    main()
