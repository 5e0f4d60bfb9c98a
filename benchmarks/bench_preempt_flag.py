#!/usr/bin/env python
"""What the preemption flag costs per step: one more float in the step's count all-reduce, against none and
against a separate one-float all-reduce (the design not taken), on 2 gloo processes.

Each block times the three variants back to back (order rotating), N calls each, at the slowest rank; the
result is the median per call over the blocks with its range. Runs itself under torchrun:

  python benchmarks/bench_preempt_flag.py [--blocks 9] [--calls 400]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, bench_env, write_artifact  # noqa: E402

COUNTS = 5  # the floats _reduce_counts already sums every step (label tokens, tokens, samples, padded, ΣL²)


def variant(name: str):
    five, six, one = torch.zeros(COUNTS, dtype=torch.float64), torch.zeros(COUNTS + 1, dtype=torch.float64), \
        torch.zeros(1, dtype=torch.float64)
    if name == "counts only":
        return lambda: dist.all_reduce(five)
    if name == "flag in the counts":
        return lambda: dist.all_reduce(six)
    return lambda: (dist.all_reduce(five), dist.all_reduce(one))  # "flag in its own all-reduce"


NAMES = ["counts only", "flag in the counts", "flag in its own all-reduce"]


def worker(blocks: int, calls: int, out: str) -> None:
    dist.init_process_group("gloo")
    fns = {n: variant(n) for n in NAMES}
    for fn in fns.values():  # warm-up
        for _ in range(50):
            fn()
    per_call: dict[str, list[float]] = {n: [] for n in NAMES}
    for b in range(blocks):
        for name in NAMES[b % 3:] + NAMES[:b % 3]:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            t = torch.tensor([(time.perf_counter() - t0) / calls], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's pace
            per_call[name].append(t.item())
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(per_call))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=9)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_out:
        return worker(args.blocks, args.calls, args.worker_out)
    out = Path(tempfile.mkdtemp(prefix="bench-preempt-")) / "times.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    __file__, "--blocks", str(args.blocks), "--calls", str(args.calls), "--worker-out", str(out)],
                   cwd=REPO, env=bench_env(1), check=True)
    per_call = json.loads(out.read_text())
    rows = [{"variant": n, "median_us": 1e6 * statistics.median(v), "min_us": 1e6 * min(v),
             "max_us": 1e6 * max(v), "blocks_us": [round(1e6 * x, 2) for x in v]} for n, v in per_call.items()]
    base = rows[0]["median_us"]
    for r in rows:
        r["extra_us_per_step"] = r["median_us"] - base
        print(f"{r['variant']:<28} {r['median_us']:8.1f} us per step (range {r['min_us']:.1f}-{r['max_us']:.1f}), "
              f"{r['extra_us_per_step']:+.1f} us vs the counts alone")
    write_artifact("bench_preempt_flag", rows, {"blocks": args.blocks, "calls": args.calls, "world_size": 2,
                                                "backend": "gloo", "count_floats": COUNTS})


if __name__ == "__main__":
    main()
