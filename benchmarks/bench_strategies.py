#!/usr/bin/env python
"""Training throughput of every strategy on the `small` preset, side by side: DDP, ZeRO-2, ZeRO-3, FSDP2, TP=2.

Each strategy runs its own chapter script under ``torchrun --nproc_per_node 2``
(gloo on CPU, one thread per process) with the same model, data, sequence
length, learning rate, steps and global batch (16 samples per optimizer step:
8 per rank for the data-parallel strategies, 16 per step for TP=2, whose two
ranks work on the same samples). Reported: samples/s (total samples of the
steady steps, after the first, over their wall time at the slowest rank's
pace), ms/step, peak memory per rank, final loss, and samples/s as a ratio to
DDP. A strategy whose chapter script does not exist yet is
printed as "not available yet"; one that fails prints its error and the
others still run.

    python benchmarks/bench_strategies.py [--steps 20] [--attn sdpa] [--only ddp zero2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import failure_reason, write_artifact

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 16

# name -> (script, flags, micro-batch per rank)
STRATEGIES: dict[str, tuple[str, list[str], int]] = {
    "ddp": ("02_data_parallel.py", ["--strategy", "ddp"], GLOBAL_BATCH // 2),
    "zero2": ("03_zero3.py", ["--strategy", "zero", "--zero-stage", "2"], GLOBAL_BATCH // 2),
    "zero3": ("03_zero3.py", ["--strategy", "zero", "--zero-stage", "3"], GLOBAL_BATCH // 2),
    "fsdp2": ("04_mixed_parallel.py", ["--strategy", "fsdp", "--parallel-dp", "2"], GLOBAL_BATCH // 2),
    "tp2": ("04_mixed_parallel.py", ["--strategy", "tp", "--parallel-tp", "2"], GLOBAL_BATCH),
}


def run_strategy(name: str, args: argparse.Namespace) -> dict[str, Any]:
    script, flags, micro = STRATEGIES[name]
    path = REPO / "scripts" / script
    if not path.exists():
        return {"name": name, "status": f"not available yet (scripts/{script} does not exist)"}
    out = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(path),
           "--model", args.model, "--seq-len", str(args.seq_len), "--n-rows", "2000", "--lr", "1e-3",
           "--warmup-steps", "2", "--max-steps", str(args.steps), "--eval-interval", "0", "--eval-batches", "1",
           "--micro-batch-size", str(micro), "--attn", args.attn, "--no-save-model", "--no-progress",
           "--output-dir", str(out), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(out)}
    env.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not (out / "summary.json").exists():
        return {"name": name, "status": f"failed (exit {proc.returncode}): {failure_reason(proc)[:400]}"}
    s = json.loads((out / "summary.json").read_text())
    return {"name": name, "status": "ok", "strategy": s["strategy"], "global_batch": s["global_batch"],
            "samples_per_s": s["samples_per_s"], "step_ms": 1000 * s["step_time_s"],
            "peak_mib": s["peak_mem_bytes"] / 2**20, "final_loss": s["final_loss"],
            "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"])
    ap.add_argument("--only", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    args = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"model={args.model} seq_len={args.seq_len} global batch={GLOBAL_BATCH} steps={args.steps} "
          f"attn={args.attn}; 2 processes x 1 thread; load average at start {load:.1f} "
          f"on {os.cpu_count()} CPUs\n", flush=True)
    rows = []
    for name in args.only:
        rows.append(run_strategy(name, args))
        r = rows[-1]
        print(f"  ran {name}: {r['status']}" + (f" in {r['wall_s']:.0f} s" if r["status"] == "ok" else ""),
              flush=True)
    ddp = next((r for r in rows if r["name"] == "ddp" and r["status"] == "ok"), None)
    print(f"\n{'strategy':<9}{'samples/s':>10}{'vs DDP':>8}{'ms/step':>9}{'peak MiB/rank':>14}{'final loss':>11}"
          f"{'global batch':>13}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['name']:<9}{r['status']}")
            continue
        ratio = f"{r['samples_per_s'] / ddp['samples_per_s']:.2f}x" if ddp else "-"
        print(f"{r['name']:<9}{r['samples_per_s']:>10.2f}{ratio:>8}{r['step_ms']:>9.0f}{r['peak_mib']:>14.0f}"
              f"{r['final_loss']:>11.4f}{r['global_batch']:>13}")
    print(f"\nload average at end {os.getloadavg()[0]:.1f}: ratios are only meaningful on an otherwise idle machine")
    for r in rows:
        r["vs_ddp"] = r["samples_per_s"] / ddp["samples_per_s"] if ddp and r["status"] == "ok" else None
    write_artifact("bench_strategies", rows, extra={
        "settings": vars(args), "global_batch": GLOBAL_BATCH,
        "columns": ["name", "status", "samples_per_s", "vs_ddp", "step_ms", "peak_mib", "final_loss"],
        "headers": ["strategy", "status", "samples/s", "vs DDP", "ms/step", "peak MiB/rank", "final loss"],
        "notes": [f"model {args.model}, seq {args.seq_len}, global batch {GLOBAL_BATCH}, {args.steps} steps, "
                  f"--attn {args.attn}, 2 processes × 1 thread"]})


if __name__ == "__main__":
    main()
