#!/usr/bin/env python
"""ZeRO stages 0-3, with and without CPU offload, against DDP: model-state bytes per rank and samples/s.

One torchrun launch trains every variant in turn on the same data and seed
(``scripts/03_zero3.py --stages ...``), then this prints one table with the
ratios to DDP. Memory is counted tensor by tensor on each rank (largest rank
shown); samples/s is the mean over steps 2..N (step 1 holds warm-up).

  python benchmarks/bench_zero.py                       # small model, bf16, 2 processes
  python benchmarks/bench_zero.py --model tiny --steps 5 --nproc 4

On a CPU-only machine "offload" moves nothing (host memory is the only
memory): it adds staging copies and runs the optimizer step in DeepSpeedCPUAdam,
so expect more bytes and a different speed, not savings. Its saving shows on
a GPU, where those bytes leave device memory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import warn_emulated_bf16, write_artifact  # noqa: E402
from ecomkit.launch import read_json, run_torchrun  # noqa: E402
from ecomlab.measure.zero import memory_row  # noqa: E402

VARIANTS = "ddp,0,1,2,3,1+opt,2+opt,3+opt,3+opt+param"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--variants", default=VARIANTS)
    args = p.parse_args()
    warn_emulated_bf16([args.precision], "--precision fp32 runs every stage in fp32.")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        run_torchrun("scripts/03_zero3.py", [
            "--stages", args.variants, "--model", args.model, "--precision", args.precision,
            "--max-steps", str(args.steps), "--n-rows", "1200", "--seq-len", "64", "--micro-batch-size", "4",
            "--eval-interval", "0", "--eval-batches", "1", "--no-save-model", "--no-progress",
            "--output-dir", str(out)], nproc=args.nproc, live=False)
        rows = []
        for label in args.variants.split(","):
            row = memory_row(read_json(out / label / "memory.json"), label)
            row["samples_per_s"] = read_json(out / label / "summary.json")["samples_per_s"]
            rows.append(row)
    print_table(rows, args)
    base = next(r for r in rows if r["label"] == "ddp")
    flat = [{"variant": r["label"], **{f"{c}_bytes": r["measured"][c] for c in ("params", "grads", "optimizer",
                                                                               "buffers", "total")},
             "states_vs_ddp": r["measured"]["total"] / base["measured"]["total"],
             "formula_bytes": r["formula"]["total"], "formula": r["formula_label"], "measured_vs_formula": r["ratio"],
             "samples_per_s": r["samples_per_s"], "samples_per_s_vs_ddp": r["samples_per_s"] / base["samples_per_s"]}
            for r in rows]
    write_artifact("bench_zero", flat, extra={
        "settings": vars(args), "psi": base["psi"],
        "columns": ["variant", "total_bytes", "states_vs_ddp", "formula", "measured_vs_formula",
                    "samples_per_s_vs_ddp"],
        "headers": ["variant", "model-state bytes (largest rank)", "vs DDP", "formula", "measured / formula",
                    "samples/s vs DDP"],
        "notes": [f"model {args.model} (Ψ = {base['psi']:,}), {args.precision}, {args.nproc} processes, "
                  f"{args.steps} steps"]})


def print_table(rows: list[dict], args) -> None:
    base = next(r for r in rows if r["label"] == "ddp")
    mib = 2**20
    print(f"\nZeRO benchmark: model={args.model} Ψ={base['psi']:,} precision={args.precision} "
          f"processes={args.nproc} steps={args.steps}")
    head = (f"{'variant':<14}{'params':>9}{'grads':>9}{'optim':>9}{'buffers':>9}{'states':>9}{'vs DDP':>8}"
            f"{'formula':>13}{'samples/s':>11}{'vs DDP':>8}")
    print(head + "\n" + "-" * len(head))
    for r in rows:
        m = r["measured"]
        print(f"{r['label']:<14}" + "".join(f"{m[c] / mib:>9.2f}" for c in ("params", "grads", "optimizer", "buffers"))
              + f"{m['total'] / mib:>9.2f}{m['total'] / base['measured']['total']:>7.2f}×"
              + f"{r['formula']['total'] / mib:>8.2f} {r['formula_label']:<5}"
              + f"{r['samples_per_s']:>10.1f}{r['samples_per_s'] / base['samples_per_s']:>7.2f}×")
    print("MiB per rank; 'states' = params + grads + optimizer (communication buffers listed apart); "
          "'formula' = the same stage's bytes for this precision (see ecomkit.planner.zero_formulas).")


if __name__ == "__main__":
    main()
