#!/usr/bin/env python
"""Training throughput of every strategy on the `small` preset, side by side: DDP, ZeRO-2, ZeRO-3, FSDP2, TP=2,
at fp32 and at bf16.

Each strategy runs its own chapter script under ``torchrun --nproc_per_node 2``
(gloo on CPU, one thread per process) with the same model, data, sequence
length, learning rate, steps and global batch (16 samples per optimizer step:
8 per rank for the data-parallel strategies, 16 per step for TP=2, whose two
ranks work on the same samples). Reported: samples/s (total samples of the
steady steps, after the first, over their wall time at the slowest rank's
pace), ms/step, peak memory per rank, final loss, and samples/s as a ratio to
DDP at the same precision. Each precision in ``--precisions`` runs every
strategy, the precisions alternating strategy by strategy so a drift of the
machine's speed is shared. A strategy whose chapter script does not exist yet is
printed as "not available yet"; one that fails prints its error and the
others still run.

    python benchmarks/bench_strategies.py [--steps 20] [--attn auto] [--precisions fp32 bf16] [--only ddp zero2]
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

from common import failure_reason, warn_emulated_bf16, write_artifact

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


def run_strategy(name: str, args: argparse.Namespace, precision: str) -> dict[str, Any]:
    script, flags, micro = STRATEGIES[name]
    path = REPO / "scripts" / script
    if not path.exists():
        return {"name": name, "precision": precision, "status": f"not available yet (scripts/{script} does not exist)"}
    out = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(path),
           "--model", args.model, "--seq-len", str(args.seq_len), "--n-rows", "2000", "--lr", "1e-3",
           "--warmup-steps", "2", "--max-steps", str(args.steps), "--eval-interval", "0", "--eval-batches", "1",
           "--micro-batch-size", str(micro), "--attn", args.attn, "--precision", precision, "--no-save-model", "--no-progress",
           "--output-dir", str(out), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(out)}
    env.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not (out / "summary.json").exists():
        return {"name": name, "precision": precision,
                "status": f"failed (exit {proc.returncode}): {failure_reason(proc)[:400]}"}
    s = json.loads((out / "summary.json").read_text())
    return {"name": name, "precision": precision, "attn": s["config"]["attn"], "status": "ok", "strategy": s["strategy"], "global_batch": s["global_batch"],
            "samples_per_s": s["samples_per_s"], "step_ms": 1000 * s["step_time_s"],
            "peak_mib": s["peak_mem_bytes"] / 2**20, "final_loss": s["final_loss"],
            "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--attn", default="auto", choices=["auto", "eager", "sdpa"],
                    help="attention of every run (auto: the loop's rule by precision and length)")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--only", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    args = ap.parse_args()
    warn_emulated_bf16(args.precisions, "--precisions fp32 skips bf16.")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"model={args.model} seq_len={args.seq_len} global batch={GLOBAL_BATCH} steps={args.steps} "
          f"attn={args.attn}; 2 processes x 1 thread; load average at start {load:.1f} "
          f"on {os.cpu_count()} CPUs\n", flush=True)
    rows = []
    for k, name in enumerate(args.only):
        for precision in (args.precisions if k % 2 == 0 else args.precisions[::-1]):
            rows.append(run_strategy(name, args, precision))
            r = rows[-1]
            print(f"  ran {name} {precision}: {r['status']}" + (f" in {r['wall_s']:.0f} s" if r["status"] == "ok"
                                                                  else ""), flush=True)
    ddp = {r["precision"]: r for r in rows if r["name"] == "ddp" and r["status"] == "ok"}
    for r in rows:
        base = ddp.get(r["precision"])
        r["vs_ddp"] = r["samples_per_s"] / base["samples_per_s"] if base and r["status"] == "ok" else None
    rows.sort(key=lambda r: (args.precisions.index(r["precision"]), args.only.index(r["name"])))
    print(f"\n{'strategy':<9}{'precision':>10}{'attn':>6}{'samples/s':>10}{'vs DDP':>8}{'ms/step':>9}"
          f"{'peak MiB/rank':>14}{'final loss':>11}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['name']:<9}{r['precision']:>10}  {r['status']}")
            continue
        ratio = f"{r['vs_ddp']:.2f}x" if r["vs_ddp"] is not None else "-"
        print(f"{r['name']:<9}{r['precision']:>10}{r['attn']:>6}{r['samples_per_s']:>10.2f}{ratio:>8}"
              f"{r['step_ms']:>9.0f}{r['peak_mib']:>14.0f}{r['final_loss']:>11.4f}")
    print(f"\nload average at end {os.getloadavg()[0]:.1f}: ratios are only meaningful on an otherwise idle machine")
    notes = [f"model {args.model}, seq {args.seq_len}, global batch {GLOBAL_BATCH}, {args.steps} steps, "
             f"--attn {args.attn}, 2 processes × 1 thread; vs DDP is at the same precision"]
    for name in args.only:
        both = {r["precision"]: r for r in rows if r["name"] == name and r["status"] == "ok"}
        if "fp32" in both and "bf16" in both:
            notes.append(f"{name}: bf16 / fp32 samples/s {both['bf16']['samples_per_s'] / both['fp32']['samples_per_s']:.2f}x")
    write_artifact("bench_strategies", rows, extra={
        "settings": vars(args), "global_batch": GLOBAL_BATCH,
        "columns": ["name", "precision", "attn", "status", "samples_per_s", "vs_ddp", "step_ms", "peak_mib",
                    "final_loss"],
        "headers": ["strategy", "precision", "attention", "status", "samples/s", "vs DDP", "ms/step",
                    "peak MiB/rank", "final loss"],
        "notes": notes})


if __name__ == "__main__":
    main()
