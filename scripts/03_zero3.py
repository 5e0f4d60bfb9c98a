#!/usr/bin/env python
"""Chapter 03: DeepSpeed ZeRO-1/2/3 (and CPU offload) under ecomkit's one training loop.

What is new compared with scripts/02_data_parallel.py: the strategy is
`zero` (a DeepSpeed engine generated from the same config), and the run
writes ds_config.json (the DeepSpeed config it used) and memory.json (the
bytes of params / grads / optimizer states each rank held).

Launch lines (gloo + DS_ACCELERATOR=cpu without GPUs, nccl with them; picked automatically):

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
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ecomkit.parallel.zero.config import ensure_deepspeed_env

ensure_deepspeed_env()  # DS_ACCELERATOR=cpu must be set before anything imports deepspeed

from ecomkit.config import TrainConfig, parse_config, preset_zero3_tiny  # noqa: E402
from ecomkit.errors import exit_on_user_error  # noqa: E402


def script_defaults() -> TrainConfig:
    """The `zero3-tiny` preset, short enough for 4 processes on a 2-core laptop."""
    cfg = preset_zero3_tiny()
    cfg.max_steps, cfg.n_rows, cfg.seq_len, cfg.eval_interval, cfg.eval_batches = 10, 800, 64, 0, 2
    cfg.warmup_steps = 3
    return cfg


def extra_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-ds-config", action="store_true", help="print the DeepSpeed JSON and exit")
    parser.add_argument("--ds-world-size", type=int, default=None,
                        help="with --print-ds-config: the number of processes to size the batch for (default: "
                             "$WORLD_SIZE or 1)")
    parser.add_argument("--consolidate-to", default=None,
                        help="merge the sharded checkpoint given by --zero-resume-from into this save_pretrained dir")
    parser.add_argument("--stages", default=None,
                        help="run several variants in turn, e.g. ddp,1,2,3,3+opt (outputs in <output-dir>/<variant>)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help=argparse.SUPPRESS)  # the deepspeed launcher passes it; LOCAL_RANK is read instead


def check_zero_config(cfg: TrainConfig) -> None:
    from ecomkit.parallel.zero.config import build_zero_config

    world = int(os.environ.get("WORLD_SIZE", 1))
    build_zero_config(cfg, world, cfg.resolve_grad_accum(world))


def print_ds_config(cfg: TrainConfig, world: int | None) -> None:
    from ecomkit.parallel.zero.config import build_zero_config, format_zero_config

    world = world or int(os.environ.get("WORLD_SIZE", 1))
    print(format_zero_config(build_zero_config(cfg, world, cfg.resolve_grad_accum(world))))


def consolidate(cfg: TrainConfig, out_dir: str) -> None:
    from ecomkit.models.bloom import preset_config
    from ecomkit.parallel.zero.checkpoint import consolidate_checkpoint, resolve_resume

    if not cfg.zero.resume_from:
        from ecomkit.errors import ConfigError

        raise ConfigError("--consolidate-to needs --zero-resume-from DIR (the sharded checkpoint to merge).")
    ckpt_dir, tag = resolve_resume(cfg.zero.resume_from)
    model_cfg = _model_config(cfg, preset_config)
    consolidate_checkpoint(ckpt_dir, model_cfg, out_dir, tag)
    print(f"consolidated {ckpt_dir}/{tag} into {out_dir}")


def _model_config(cfg: TrainConfig, preset_config):
    from transformers import AutoConfig

    from ecomkit.models.bloom import PRESETS
    from ecomkit.models.tokenizer import get_tokenizer
    from ecomkit.train.loop import tokenizer_cache_dir

    if cfg.model in PRESETS:
        return preset_config(cfg.model, vocab_size=len(get_tokenizer(cfg.tokenizer, tokenizer_cache_dir())))
    return AutoConfig.from_pretrained(cfg.model)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, ns = parse_config(argv, description=__doc__, defaults=script_defaults(), extra=extra_flags)
    if ns.print_ds_config:
        return print_ds_config(cfg, ns.ds_world_size)
    if cfg.strategy == "zero" or ns.stages:
        check_zero_config(cfg)  # a bad --zero-user-config fails here, before any process group exists
    if ns.consolidate_to:
        return consolidate(cfg, ns.consolidate_to)
    if not ns.stages:
        from ecomkit.train import run_training

        return train_one(cfg, lambda callbacks: run_training(cfg, callbacks))
    from ecomkit.train.sweep import parse_variants, run_variants, train_in_session

    run_variants(cfg, parse_variants(ns.stages),
                 lambda v_cfg, env: train_one(v_cfg, lambda cbs: train_in_session(v_cfg, env, cbs)))


def train_one(cfg: TrainConfig, train) -> dict:
    """One run with the memory probe (memory.json) and, if asked, sharded checkpoints / resume."""
    from ecomkit.parallel.zero.checkpoint import ZeroCheckpointCallback
    from ecomkit.metrics import format_bytes, print_run_summary
    from ecomkit.measure.zero import MemoryProbeCallback

    out = Path(cfg.output_dir)
    memory = MemoryProbeCallback(str(out / "memory.json"))
    callbacks: list = [memory]
    if cfg.strategy == "zero" and (cfg.zero.checkpoint_interval or cfg.zero.resume_from):
        ckpt_dir = cfg.zero.checkpoint_dir or str(out / "checkpoints")
        callbacks.append(ZeroCheckpointCallback(ckpt_dir, cfg.zero.checkpoint_interval, cfg.zero.resume_from))
    summary = train(callbacks)
    print_run_summary(summary)
    if int(os.environ.get("RANK", 0)) == 0 and memory.per_rank:
        per_rank = ", ".join(format_bytes(r.get("total", 0)) for r in memory.per_rank)
        print(f"model states    {per_rank} per rank (params + grads + optimizer; details in {out / 'memory.json'})")
    return summary


if __name__ == "__main__":
    main()
