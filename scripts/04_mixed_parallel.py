#!/usr/bin/env python
"""Chapter 04: FSDP2, tensor parallel, pipeline parallel and 2-D meshes for BLOOM, on ecomkit's one loop.

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
  # EcomGPT-7B shape on 8 GPUs: TP 2 inside NVLink pairs × FSDP 4, bf16, activation checkpointing
  torchrun --standalone --nproc_per_node 8 scripts/04_mixed_parallel.py --model ./models/EcomGPT-7B \\
      --tp 2 --dp 4 --precision bf16 --parallel-activation-checkpointing --seq-len 1024

Flags: every ``--parallel-*`` field of ecomkit.config.ParallelConfig (``--help`` lists them), plus the
short aliases ``--dp/--tp/--pp`` for ``--parallel-dp/--parallel-tp/--parallel-pp``, and
``--dcp-dir DIR``: also save the trained (sharded) model with torch.distributed.checkpoint into DIR.

Outputs in --output-dir: metrics.jsonl (per step: loss, comm_count, comm_payload_bytes, comm_wire_bytes
per rank 0), summary.json, parallel_layout.json (every rank's parameter shapes and state bytes), final/
(a plain Hugging Face model, gathered from the shards).
"""

from __future__ import annotations

import argparse
import os
import sys

from ecomkit.config import TrainConfig, parse_config
from ecomkit.errors import ConfigError, exit_on_user_error
from ecomkit.parallel.dims import validate_parallel_config
from ecomkit.metrics import print_run_summary
from ecomkit.train import run_training

MIXED_STRATEGIES = ("fsdp", "tp", "pp", "mixed")
ALIASES = {"--dp": "--parallel-dp", "--tp": "--parallel-tp", "--pp": "--parallel-pp"}


def expand_aliases(argv: list[str]) -> list[str]:
    """``--tp 2`` / ``--tp=2`` → ``--parallel-tp 2``: the config's derived flag names, shorter."""
    out = []
    for arg in argv:
        flag, sep, value = arg.partition("=")
        out.append(ALIASES.get(flag, flag) + sep + value if flag in ALIASES else arg)
    return out


def chapter_defaults() -> TrainConfig:
    cfg = TrainConfig()
    cfg.strategy, cfg.output_dir, cfg.max_steps = "mixed", "runs/mixed", 20
    return cfg


def add_script_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dcp-dir", default=None,
                        help="also save the sharded model with torch.distributed.checkpoint into this folder")


class SaveShardedModel:
    """Callback: at the end of training every rank writes its shards with DCP (``--dcp-dir``)."""

    def __init__(self, path: str):
        self.path = path

    def on_train_end(self, run, summary) -> None:
        from ecomkit.parallel.mixed import save_sharded_model

        save_sharded_model(run.strategy.model, self.path)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    argv = expand_aliases(sys.argv[1:] if argv is None else argv)
    cfg, ns = parse_config(argv, description=__doc__, defaults=chapter_defaults(), extra=add_script_flags)
    # every degree checked before the process group exists (product, heads, layers of a preset)
    if cfg.strategy in MIXED_STRATEGIES:
        dims = validate_parallel_config(cfg.strategy, cfg.parallel, int(os.environ.get("WORLD_SIZE", 1)),
                                        cfg.precision, cfg.model)
        if ns.dcp_dir and dims.pp > 1:
            raise ConfigError(
                "--dcp-dir saves the sharded model with torch.distributed.checkpoint, but pipeline stages hold "
                "stage-local parameter names that do not load into the unsplit model. With --parallel-pp > 1 use "
                "the consolidated Hugging Face directory the run writes to <output-dir>/final.")
    elif ns.dcp_dir:
        raise ConfigError(f"--dcp-dir is for the chapter-04 strategies ({', '.join(MIXED_STRATEGIES)}), "
                          f"not --strategy {cfg.strategy}.")
    callbacks = [SaveShardedModel(ns.dcp_dir)] if ns.dcp_dir else []
    summary = run_training(cfg, callbacks)
    print_run_summary(summary)


if __name__ == "__main__":
    main()
