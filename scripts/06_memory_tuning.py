#!/usr/bin/env python
"""Chapter 06: memory tuning, and checking the planner (ecomkit.planner) against measurement.

What is new compared with scripts/02_data_parallel.py: nothing changes in the
training loop; this script measures. Three sub-commands:

  # model-state bytes per rank under DDP, ZeRO-1/2/3 and FSDP2 (tiny BLOOM), next to the planner's
  torchrun --standalone --nproc_per_node 2 scripts/06_memory_tuning.py states --output-dir runs/06
  # the time model's prediction of DDP, ZeRO-2 and FSDP2 steps from a compute measurement and gloo's α-β,
  # next to chapter-02 training runs of each strategy
  torchrun --standalone --nproc_per_node 2 scripts/06_memory_tuning.py calibrate --output-dir runs/06/calibrate
  # activation experiments in one process: checkpointing, save_on_cpu, precision, sweeps, memory pool, bucketing
  python scripts/06_memory_tuning.py activations --output-dir runs/06 [--quick]

The planner itself: python -m ecomkit.plan --help.
`calibrate` accepts every training flag of chapter 02 (--model, --seq-len, --micro-batch-size, --max-steps, ...);
its defaults (small BLOOM, seq 32, micro-batch 4) keep every batch free of padding, so that the prediction
and the measurement describe the same shapes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ecomkit.config import parse_config
from ecomkit.errors import exit_on_user_error
from ecomkit.launch import write_json
from ecomlab.measure.calibration import CALIBRATION_STRATEGIES, calibration_defaults, run_calibration
from ecomlab.measure.memory_tuning import activation_report
from ecomlab.measure.strategy_states import compare_states_with_plan, measure_strategy_states
from ecomlab.plots.memory import format_calibration, format_state_comparison


def cmd_states(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="06_memory_tuning.py states")
    p.add_argument("--output-dir", default="runs/06")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--strategies", default="ddp,zero1,zero2,zero3,fsdp2")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="target vocabulary of the local BPE that sizes the model (default: the loop's tokenizer)")
    args = p.parse_args(argv)
    rows = measure_strategy_states(args.strategies.split(","), precision=args.precision,
                                   output_dir=str(Path(args.output_dir) / "states_runs"), vocab_size=args.vocab_size)
    if int(os.environ.get("RANK", 0)) == 0:
        rows = compare_states_with_plan(rows)
        print(f"wrote {write_json(rows, Path(args.output_dir) / f'states_{args.precision}.json')}")
        print(format_state_comparison(rows))


def cmd_calibrate(argv: list[str]) -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--repeats", type=int, default=5, help="timed runs per compute measurement")
        parser.add_argument("--strategies", default=",".join(CALIBRATION_STRATEGIES),
                            help="strategies to train and predict (planner names: ddp, zero2, fsdp2, ...)")

    cfg, ns = parse_config(argv, description="calibrate the time model", defaults=calibration_defaults(), extra=extra)
    report = run_calibration(cfg, ns.strategies.split(","), repeats=ns.repeats)
    if int(os.environ.get("RANK", 0)) == 0:
        print(format_calibration(report))


def cmd_activations(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="06_memory_tuning.py activations")
    p.add_argument("--output-dir", default="runs/06")
    p.add_argument("--quick", action="store_true", help="shorter sequences (for tests and notebooks)")
    args = p.parse_args(argv)
    print(f"wrote {write_json(activation_report(args.quick), Path(args.output_dir) / 'activations.json')}")


COMMANDS = {"states": cmd_states, "calibrate": cmd_calibrate, "activations": cmd_activations}


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
