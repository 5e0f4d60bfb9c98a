#!/usr/bin/env python
"""Chapter 05 benchmark: bytes per step and final eval loss of each compression method, relative to dense.

  python benchmarks/bench_compression.py [--model tiny] [--steps 150]

One torchrun launch (2 processes, gloo) trains the same job once per method
(``scripts/05_grad_compression.py --methods ...``), then this prints, per
method, the bytes each rank handed to collectives per step (counted by the
hooks, not computed) and the final eval loss, both relative to ``none``.

Goals (from the chapter's issue):
- Top-K 1 % with error feedback sends >= 20x fewer bytes than dense, with a
  final eval loss within 2 % of dense;
- PowerSGD rank 4 sends >= 10x fewer bytes than dense.

PowerSGD runs a plain all-reduce for its first ``--powersgd-start-iter``
steps (torch requires >= 2, see ecomkit.parallel.compression), so its ratio
is judged on the compressed steps; the mean over all steps is printed too.
Why the tiny model is enough for PowerSGD's 10x: its biggest matrix is the
embedding (vocab × 64), which rank 4 compresses (vocab + 64) × 4 / (vocab × 64)
≈ 16x, and the 64 × 192 / 64 × 256 block matrices 8-13x; the 1-D tensors
(biases, LayerNorms) are sent uncompressed. Use --model small to check it on
wider matrices.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, bench_env, print_table, verdict

METHODS = ("none", "fp16", "bf16", "powersgd:1", "powersgd:4", "topk:0.01", "topk:0.01:noef", "topk:0.1",
           "topk_naive:0.25")


def run_all(args: argparse.Namespace, out: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "scripts" / "05_grad_compression.py"), "--methods", ",".join(METHODS),
           "--model", args.model, "--max-steps", str(args.steps), "--n-rows", "2000", "--seq-len", "128",
           "--eval-interval", "0", "--eval-batches", "8", "--no-save-model", "--no-progress",
           "--compression-powersgd-start-iter", str(args.powersgd_start_iter), "--output-dir", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=bench_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def method_row(out: Path, spec: str, start_iter: int) -> dict:
    folder = out / spec.replace(":", "-")
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("type") == "train"]
    steady = train[start_iter:] if spec.startswith("powersgd") else train
    return {"method": summary["method_title"], "spec": spec,
            "bytes/step": sum(r["comm_bytes"] for r in train) / len(train),
            "bytes/step compressed": sum(r["comm_bytes"] for r in steady) / len(steady),
            "dense bytes/step": train[0]["comm_bytes_dense"], "eval_loss": summary["eval_loss"],
            "ms/step": 1000 * summary["step_time_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--powersgd-start-iter", type=int, default=10)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="ecomkit-bench-compression-"))
    run_all(args, out)
    rows = [method_row(out, spec, args.powersgd_start_iter) for spec in METHODS]
    dense = rows[0]
    for r in rows:
        r["fewer bytes (x)"] = dense["bytes/step"] / r["bytes/step"]
        r["fewer bytes, compressed steps (x)"] = dense["bytes/step"] / r["bytes/step compressed"]
        r["eval loss vs dense"] = r["eval_loss"] / dense["eval_loss"]
    print(f"\nmodel={args.model} steps={args.steps} 2 processes (gloo); bytes are per rank per optimizer step\n")
    print_table(rows, ["method", "bytes/step", "fewer bytes (x)", "fewer bytes, compressed steps (x)",
                       "eval_loss", "eval loss vs dense", "ms/step"])
    by = {r["spec"]: r for r in rows}
    print()
    verdict("Top-K 1 % + EF: fewer bytes than dense", by["topk:0.01"]["fewer bytes (x)"], ">= 20x",
            by["topk:0.01"]["fewer bytes (x)"] >= 20)
    gap = 100 * (by["topk:0.01"]["eval loss vs dense"] - 1)
    verdict("Top-K 1 % + EF: eval loss above dense (%)", gap, "<= 2 %", gap <= 2)
    ratio = by["powersgd:4"]["fewer bytes, compressed steps (x)"]
    verdict("PowerSGD r=4: fewer bytes than dense on compressed steps", ratio, ">= 10x", ratio >= 10)
    print(f"(PowerSGD r=4 over all {args.steps} steps, warm-up included: "
          f"{by['powersgd:4']['fewer bytes (x)']:.1f}x)\noutputs in {out}")


if __name__ == "__main__":
    main()
