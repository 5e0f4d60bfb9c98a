#!/usr/bin/env python
"""Chapter 03, Trainer path: the same ZeRO config through Hugging Face Trainer.

  torchrun --standalone --nproc_per_node 2 scripts/03_hf_trainer_zero.py --zero-stage 3 --max-steps 10

What is new compared with scripts/02_hf_trainer.py: `TrainingArguments(deepspeed=<dict>)`
gets the config ecomkit generates from the same flags (no "auto" placeholders
for Trainer to fill in), also saved as <output-dir>/ds_config.json. On CPU,
Trainer needs `use_cpu=True` under torchrun (ecomkit.train.hf_trainer sets it),
or it sees a world size of 1 (shared CPU notes, trap 5).
"""

from __future__ import annotations

import os

from ecomkit.parallel.zero.config import ensure_deepspeed_env

ensure_deepspeed_env()  # before transformers/accelerate import deepspeed

from ecomkit.config import TrainConfig, parse_config, preset_zero3_tiny  # noqa: E402
from ecomkit.errors import exit_on_user_error  # noqa: E402


def script_defaults() -> TrainConfig:
    cfg = preset_zero3_tiny()
    cfg.max_steps, cfg.n_rows, cfg.seq_len, cfg.eval_interval, cfg.output_dir = 10, 800, 64, 0, "runs/zero3-trainer"
    return cfg


def trainer_zero_config(cfg: TrainConfig) -> dict:
    """The generated DeepSpeed dict for this launch (bucket capped by the preset's Ψ when it is a preset)."""
    from ecomkit.models.bloom import PRESETS, preset_parameter_count
    from ecomkit.parallel.zero.config import build_zero_config, save_zero_config

    world = int(os.environ.get("WORLD_SIZE", 1))
    psi = preset_parameter_count(cfg.model) if cfg.model in PRESETS else None  # toy presets: an upper bound
    ds = build_zero_config(cfg, world, cfg.resolve_grad_accum(world), n_params=psi)
    if int(os.environ.get("RANK", 0)) == 0:
        save_zero_config(ds, cfg.output_dir)
    return ds


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    from ecomkit.train.hf_trainer import run_hf_trainer

    cfg, _ = parse_config(argv, description=__doc__, defaults=script_defaults())
    summary = run_hf_trainer(cfg, deepspeed=trainer_zero_config(cfg))
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"HF Trainer + DeepSpeed ZeRO-{cfg.zero.stage}: loss {summary['first_loss']:.4f} → "
              f"{summary['final_loss']:.4f}, {summary['samples_per_s']:.1f} samples/s, outputs in {summary['output_dir']}")


if __name__ == "__main__":
    main()
