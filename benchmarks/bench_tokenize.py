"""Tokenization throughput (rows/s) of ``tokenize_records`` with num_proc 1 vs 2, side by side.

The Rust tokenizer's own thread pool is switched off (TOKENIZERS_PARALLELISM=false)
for both runs, so the ratio measures the process-level parallelism of
``datasets.map`` alone. Each configuration is warmed up once, then timed
``--repeats`` times; the best time is reported (least disturbed by other load).
On a machine with 2 cores a speed-up needs both cores free: the load average
is printed so a ratio measured under competing load can be recognised.

    python benchmarks/bench_tokenize.py [--rows 20000] [--task lm] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"

from common import write_artifact  # noqa: E402
from ecomkit.data import generate_catalog, tokenize_records  # noqa: E402
from ecomkit.models.tokenizer import get_tokenizer  # noqa: E402


def best_rows_per_second(records, tok, task: str, max_length: int, num_proc: int, repeats: int) -> float:
    tokenize_records(records[:500], tok, task, max_length, num_proc=num_proc)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        tokenize_records(records, tok, task, max_length, num_proc=num_proc)
        best = min(best, time.perf_counter() - start)
    return len(records) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--task", choices=("lm", "nlu"), default="lm")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", default="synthetic")
    args = parser.parse_args()

    import datasets

    datasets.disable_progress_bars()
    tok = get_tokenizer(args.tokenizer)
    records = generate_catalog(args.rows, seed=0)
    print(f"{args.rows:,} rows, task {args.task}, {os.cpu_count()} CPU cores visible, "
          f"load average before: {os.getloadavg()[0]:.2f} (other processes compete for the cores)")
    rates = {}
    for num_proc in (1, 2):
        rates[num_proc] = best_rows_per_second(records, tok, args.task, args.max_length, num_proc, args.repeats)
        print(f"num_proc={num_proc}: {rates[num_proc]:,.0f} rows/s")
    speedup = rates[2] / rates[1]
    print(f"speed-up num_proc 2 vs 1: {speedup:.2f}x (load average after: {os.getloadavg()[0]:.2f})")
    write_artifact("bench_tokenize", [{"num_proc": n, "rows_per_s": r} for n, r in rates.items()], extra={
        "settings": vars(args), "speedup_2_vs_1": speedup,
        "columns": ["num_proc", "rows_per_s"], "headers": ["processes (num_proc)", "rows/s (best of repeats)"],
        "notes": [f"{args.rows:,} rows, task {args.task}: num_proc 2 vs 1 = **{speedup:.2f}×** (needs both cores "
                  "free: compare the load average above)"]})


if __name__ == "__main__":
    main()
