"""Padding rate of length-bucketed vs random batching, measured on tokenized synthetic rows.

Goal (from the project issue): with micro-batches of 8, bucketed batching pads
at most 5 % of positions and random batching at least 30 %. Random padding
depends on how widely sequence lengths spread, so the second goal checks that
the synthetic catalog is realistic enough for bucketing to matter.

It also answers "do length-bucketed batches make ranks wait on each other?"
from the samplers' plan (no training): every step ends at an all-reduce, so
the rank with the most padded positions sets the pace; the table prints the
share of rank time spent waiting, with ecomkit's one-bucket-per-step plan and
with random batches.

    python benchmarks/bench_padding.py [--rows 20000] [--max-length 256]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import write_artifact

from ecomkit.data import compare_padding, generate_catalog, tokenize_records
from ecomkit.data.padding import compare_rank_wait
from ecomkit.models.tokenizer import get_tokenizer

BUCKETED_GOAL, RANDOM_GOAL = 0.05, 0.30
WAIT_SHAPES = [(8, 1, 2), (4, 2, 2), (4, 1, 4), (8, 1, 8)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default="synthetic")
    args = parser.parse_args()

    import datasets

    datasets.disable_progress_bars()
    tok = get_tokenizer(args.tokenizer)
    start = time.perf_counter()
    records = generate_catalog(args.rows, seed=args.seed)
    lm = tokenize_records(records, tok, "lm", args.max_length)["length"]
    nlu = tokenize_records(records[: args.rows // 4], tok, "nlu", args.max_length)["length"]
    print(f"{args.rows:,} rows generated and tokenized in {time.perf_counter() - start:.1f} s")
    for name, lengths in (("lm", lm), ("nlu", nlu)):
        p = np.percentile(lengths, [5, 50, 95])
        print(f"{name:>3} token lengths: n={len(lengths):,} p5={p[0]:.0f} median={p[1]:.0f} p95={p[2]:.0f} "
              f"max={max(lengths)}")

    print("\ntask  micro x accum x ranks   bucketed   random   random/bucketed")
    shapes = [(4, 1, 1), (8, 1, 1), (16, 1, 1), (8, 4, 2)]
    rows = []
    for task, lengths in (("lm", lm), ("nlu", nlu)):
        for mb, accum, world in shapes:
            r = compare_padding(lengths, micro_batch_size=mb, grad_accum=accum, num_replicas=world, seed=args.seed)
            print(f"{task:>4}  {mb:>5} x {accum} x {world}         {r.bucketed:>7.1%}  {r.random:>7.1%}   {r.ratio:>8.1f}x")
            rows.append({"measure": "padding", "task": task, "shape": f"{mb} x {accum} x {world}",
                         "bucketed %": 100 * r.bucketed, "random %": 100 * r.random})

    print("\nranks waiting for the slowest rank at each step's all-reduce (share of rank time)")
    print("task  micro x accum x ranks   one bucket per step   random")
    for task, lengths in (("lm", lm), ("nlu", nlu)):
        for mb, accum, world in WAIT_SHAPES:
            w = compare_rank_wait(lengths, mb, accum, world, seed=args.seed)
            print(f"{task:>4}  {mb:>5} x {accum} x {world}         {w.bucketed:>13.1%}       {w.random:>6.1%}")
            rows.append({"measure": "rank wait", "task": task, "shape": f"{mb} x {accum} x {world}",
                         "bucketed %": 100 * w.bucketed, "random %": 100 * w.random})

    goal = compare_padding(lm, micro_batch_size=8, seed=args.seed)
    ok_bucketed, ok_random = goal.bucketed <= BUCKETED_GOAL, goal.random >= RANDOM_GOAL
    print(f"\nlm, micro-batch 8: bucketed {goal.bucketed:.2%} (goal <= {BUCKETED_GOAL:.0%}: "
          f"{'PASS' if ok_bucketed else 'MISS'}), random {goal.random:.2%} (goal >= {RANDOM_GOAL:.0%}: "
          f"{'PASS' if ok_random else 'MISS'}), ratio {goal.ratio:.1f}x")
    write_artifact("bench_padding", rows, extra={
        "settings": vars(args),
        "columns": ["measure", "task", "shape", "bucketed %", "random %"],
        "headers": ["measure", "task", "micro x accum x ranks", "bucketed (one bucket per step)", "random"],
        "notes": [f"lm, micro-batch 8: bucketed padding {goal.bucketed:.2%} (goal <= {BUCKETED_GOAL:.0%}: "
                  f"{'PASS' if ok_bucketed else 'MISS'}), random {goal.random:.2%} (goal >= {RANDOM_GOAL:.0%}: "
                  f"{'PASS' if ok_random else 'MISS'})"]})


if __name__ == "__main__":
    main()
