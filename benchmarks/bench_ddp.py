#!/usr/bin/env python
"""Chapter 02 benchmark: DDP scaling and ecomkit's loop against HF Trainer, measured side by side.

  python benchmarks/bench_ddp.py [--model small] [--steps 30]

1. samples/s of 2 processes against 1 process at the same global batch, one
   thread per process (goal: >= 1.8x; two cores, so 2.0x is the ceiling).
2. samples/s of ecomkit's loop against HF Trainer on the same model, data,
   batch and steps, both with 2 processes (goal: >= 1.0x).
Steady-state means exclude the first step (allocation warm-up).
"""

from __future__ import annotations

import argparse

from common import print_table, run_summary, verdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--global-batch", type=int, default=16)
    args = ap.parse_args()
    common = ["--model", args.model, "--max-steps", str(args.steps), "--eval-interval", "0", "--eval-batches", "1",
              "--n-rows", "2000", "--seq-len", "128", "--no-save-model", "--lr", "1e-3"]
    gb = args.global_batch
    one = run_summary("02_data_parallel.py", common + ["--micro-batch-size", str(gb)], nproc=1)
    two = run_summary("02_data_parallel.py", common + ["--micro-batch-size", str(gb // 2)], nproc=2)
    hf = run_summary("02_hf_trainer.py", common + ["--micro-batch-size", str(gb // 2)], nproc=2)
    rows = [
        {"run": "ecomkit 1 process", "samples/s": one["samples_per_s"], "ms/step": 1000 * one["step_time_s"],
         "final loss": one["final_loss"]},
        {"run": "ecomkit DDP 2 processes", "samples/s": two["samples_per_s"], "ms/step": 1000 * two["step_time_s"],
         "final loss": two["final_loss"]},
        {"run": "HF Trainer 2 processes", "samples/s": hf["samples_per_s"], "ms/step": 1000 * hf["step_time_s"],
         "final loss": hf["final_loss"]},
    ]
    print(f"\nmodel={args.model} params={two['params']:,} global batch={gb} steps={args.steps} "
          "(1 thread per process)\n")
    print_table(rows, ["run", "samples/s", "ms/step", "final loss"])
    print()
    verdict("DDP 2 proc / 1 proc samples/s", two["samples_per_s"] / one["samples_per_s"], ">= 1.8x",
            two["samples_per_s"] / one["samples_per_s"] >= 1.8)
    verdict("ecomkit / HF Trainer samples/s", two["samples_per_s"] / hf["samples_per_s"], ">= 1.0x",
            two["samples_per_s"] / hf["samples_per_s"] >= 1.0)


if __name__ == "__main__":
    main()
