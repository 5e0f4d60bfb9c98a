#!/usr/bin/env python
"""Chapter 07: one rank stalls, and the job ends with a clear timeout error instead of hanging.

The usual training loop (chapter 02) with two injected faults:

- ``--slow-rank R --slow-ms MS``: every forward of rank R takes MS longer (a
  throttled GPU); the health monitor names it as a straggler;
- ``--stall-rank R --stall-at-step K --stall-s S``: after step K, rank R sleeps
  S seconds (a hung data loader, a dead GPU). The other ranks wait in their next
  collective until the process-group timeout (``--timeout-s``, 15 s here), then
  fail with a message naming the collective, its caller and the timeout.

    torchrun --standalone --nproc_per_node 2 scripts/07_stall_demo.py --timeout-s 10
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc_per_node 2 scripts/07_stall_demo.py  # names rank 1
    torchrun --standalone --nproc_per_node 2 scripts/07_stall_demo.py --stall-rank -1 --slow-ms 40   # straggler only

While it hangs: ``py-spy dump --pid <pid>`` (pids are printed at start) or
``kill -USR1 <pid>`` print a rank's stacks; ``--fault-hang-dump-s 5`` makes every
rank print its own after 5 s.
"""

from __future__ import annotations

import argparse
import os

from ecomkit.config import TrainConfig, parse_config
from ecomkit.dist import install_stack_dump_signal
from ecomkit.errors import exit_on_user_error
from ecomkit.faults.diagnose import SlowRank, StallInjector
from ecomkit.faults.health import HealthMonitor
from ecomkit.faults.known_errors import raise_explained
from ecomkit.metrics import print_run_summary
from ecomkit.train import run_training


def demo_defaults() -> TrainConfig:
    """A short tiny run with a short timeout, so the demo ends in seconds."""
    cfg = TrainConfig(max_steps=12, n_rows=600, eval_interval=0, eval_batches=2, save_model=False, progress=False,
                      timeout_s=15.0, output_dir="runs/stall_demo")
    cfg.fault.health_interval = 2
    cfg.fault.checkpoint_interval = 0
    return cfg


def demo_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("stall demo")
    g.add_argument("--stall-rank", type=int, default=1, help="rank that stalls (-1: none)")
    g.add_argument("--stall-at-step", type=int, default=4, help="it stalls after this step")
    g.add_argument("--stall-s", type=float, default=600.0, help="for this long (longer than --timeout-s)")
    g.add_argument("--slow-rank", type=int, default=1, help="rank whose forward is slowed (-1: none)")
    g.add_argument("--slow-ms", type=float, default=0.0, help="extra milliseconds per forward on --slow-rank")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    cfg, ns = parse_config(argv, description=__doc__, defaults=demo_defaults(), extra=demo_flags)
    install_stack_dump_signal()
    # the monitor first: at the stall step it samples with both ranks, then rank R stalls
    callbacks = [HealthMonitor(cfg), SlowRank(ns.slow_rank, ns.slow_ms),
                 StallInjector(ns.stall_rank, ns.stall_at_step, ns.stall_s)]
    try:
        summary = run_training(cfg, callbacks)
    except RuntimeError as exc:  # gloo/NCCL raise RuntimeError subclasses (DistBackendError)
        raise_explained(exc, cfg.timeout_s, int(os.environ.get("RANK", 0)))
    print_run_summary(summary)


if __name__ == "__main__":
    main()
