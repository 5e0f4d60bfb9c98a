#!/usr/bin/env python
"""Chapter 02 benchmark: fixed vs the EcomGPT guide's sentiment-adaptive clipping, over several seeds.

  python benchmarks/bench_clipping.py [--seeds 0 1 2] [--steps 400]

Every (policy, seed) run is the NLU task on the synthetic catalog with 2
processes (``scripts/02_data_parallel.py --task nlu ...``), long enough that
category and sentiment accuracy clearly beat the majority-class baseline:
a clipping policy cannot be judged on a model that has not learned. The
verdict per metric comes from ``ecomlab.measure.run_comparisons.compare_clip_policies``:
both arms must have learned, and a difference of the arm means counts only
when it exceeds the seed spread. Runs are side by side in this one invocation.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from common import print_table, run_summary, write_artifact

from ecomkit.launch import read_jsonl
from ecomlab.measure.run_comparisons import clipping_report, compare_clip_policies

# The same settings as notebook 02's clipping section and tests/test_learning.py's NLU run.
NLU_ARGS = ["--task", "nlu", "--n-rows", "4000", "--seq-len", "96", "--micro-batch-size", "16", "--lr", "5e-3",
            "--eval-interval", "0", "--eval-nlu-samples", "128", "--no-save-model"]
POLICIES = ("fixed", "sentiment")
METRICS = ("acc_category", "acc_sentiment", "eval_loss")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    reports: dict[str, list] = {p: [] for p in POLICIES}
    rows = []
    for seed in args.seeds:
        for policy in POLICIES:
            out = Path(tempfile.mkdtemp(prefix=f"ecomkit-clip-{policy}-{seed}-"))
            summary = run_summary("02_data_parallel.py", NLU_ARGS + ["--max-steps", str(args.steps), "--seed",
                                  str(seed), "--clip-policy", policy], nproc=2, out_dir=str(out))
            report = clipping_report(read_jsonl(out / "metrics.jsonl"), summary)
            reports[policy].append(report)
            rows.append({"policy": policy, "seed": seed, **dataclasses.asdict(report)})
            print(f"done: {policy} seed {seed}", flush=True)
    print_table(rows, ["policy", "seed", "acc_category", "majority_category", "acc_sentiment", "majority_sentiment",
                       "eval_loss", "clip_min", "clip_max", "clipped_fraction"])
    comparisons = [compare_clip_policies(reports["fixed"], reports["sentiment"], m) for m in METRICS]
    for c in comparisons:
        print(f"{c.metric:13s} fixed {c.fixed.mean:.4f} ± {c.fixed.std:.4f}   sentiment {c.adaptive.mean:.4f} ± "
              f"{c.adaptive.std:.4f}   Δ {c.difference:+.4f} (seed spread {c.spread:.4f}, n={c.fixed.n}): {c.verdict}")
    write_artifact("bench_clipping", rows, extra={"nlu_args": NLU_ARGS, "steps": args.steps, "seeds": args.seeds,
                                            "comparisons": [dataclasses.asdict(c) for c in comparisons]})


if __name__ == "__main__":
    main()
