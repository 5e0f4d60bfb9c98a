"""Padding rate of length-bucketed vs random batching, measured on tokenized synthetic rows.

Goal (from the project issue): with micro-batches of 8, bucketed batching pads
at most 5 % of positions and random batching at least 30 %. Random padding
depends on how widely sequence lengths spread, so the second goal checks that
the synthetic catalog is realistic enough for bucketing to matter.

    python benchmarks/bench_padding.py [--rows 20000] [--max-length 256]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ecomkit.data import compare_padding, generate_catalog, tokenize_records
from ecomkit.models.tokenizer import get_tokenizer

BUCKETED_GOAL, RANDOM_GOAL = 0.05, 0.30


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
    for task, lengths in (("lm", lm), ("nlu", nlu)):
        for mb, accum, world in shapes:
            r = compare_padding(lengths, micro_batch_size=mb, grad_accum=accum, num_replicas=world, seed=args.seed)
            print(f"{task:>4}  {mb:>5} x {accum} x {world}         {r.bucketed:>7.1%}  {r.random:>7.1%}   {r.ratio:>8.1f}x")

    goal = compare_padding(lm, micro_batch_size=8, seed=args.seed)
    ok_bucketed, ok_random = goal.bucketed <= BUCKETED_GOAL, goal.random >= RANDOM_GOAL
    print(f"\nlm, micro-batch 8: bucketed {goal.bucketed:.2%} (goal <= {BUCKETED_GOAL:.0%}: "
          f"{'PASS' if ok_bucketed else 'MISS'}), random {goal.random:.2%} (goal >= {RANDOM_GOAL:.0%}: "
          f"{'PASS' if ok_random else 'MISS'}), ratio {goal.ratio:.1f}x")


if __name__ == "__main__":
    main()
