#!/usr/bin/env python
"""The time model against real steps: predicted / measured step time of DDP, ZeRO-2 and FSDP2 on 2 and 4 processes.

For each process count, one torchrun job (``scripts/06_memory_tuning.py
calibrate``) first measures the model's inputs — one process's forward +
backward + AdamW step, the same for FSDP2 and a DeepSpeed ZeRO-2 engine on a
group of one rank (their own CPU work, with collectives that move nothing),
and α-β fits of gloo's all-reduce (chapter 01's sweep, 1 KiB-64 MiB),
all-gather and reduce-scatter — then trains each strategy with
chapter 02's loop; the planner (``ecomkit.planner.step_time``) predicts each
step from the measured inputs alone. Each process count runs ``--repeats``
fresh jobs, each measuring its own inputs; a row's verdict is the median of
its jobs' ratios, with their range beside it. Goal: every median within 20 %.

  python benchmarks/bench_calibration.py                     # small model, 2 and 4 processes
  python benchmarks/bench_calibration.py --nprocs 2 --steps 6

Four processes on a 2-core machine share the cores two to a core; the inputs
are measured under the same sharing, so the prediction covers it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import verdict, write_artifact  # noqa: E402
from ecomkit.launch import read_json, run_torchrun  # noqa: E402
from ecomlab.measure.calibration import CALIBRATION_STRATEGIES  # noqa: E402

GOAL = 0.20


def median_rows(jobs: list[list[dict]]) -> list[dict]:
    """One row per (strategy, processes) over repeated jobs: the median of each time and of the ratio, its range.

    Each job's ratio compares its own prediction with its own measured step,
    so the ratios pair within a job; the median over jobs is the verdict.
    """
    keyed: dict[tuple[str, int], list[dict]] = {}
    for rows in jobs:
        for r in rows:
            keyed.setdefault((r["strategy"], r["processes"]), []).append(r)
    out = []
    for (strategy, procs), rs in keyed.items():
        ratios = [r["ratio"] for r in rs]
        out.append({"strategy": strategy, "processes": procs, "jobs": len(rs),
                    **{k: statistics.median(r[k] for r in rs) for k in ("predicted_s", "measured_s", "ratio")},
                    "ratio_min": min(ratios), "ratio_max": max(ratios), "per_job": rs})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small", help="model preset (as --model of the chapter scripts)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per strategy (the first is warm-up)")
    p.add_argument("--nprocs", default="2,4", help="process counts, comma-separated: one job each per repeat")
    p.add_argument("--strategies", default=",".join(CALIBRATION_STRATEGIES), help="strategies, comma-separated")
    p.add_argument("--repeats", type=int, default=3,
                   help="fresh jobs per process count, each measuring its own inputs; the median ratio is the verdict")
    args = p.parse_args()
    jobs, inputs = [], {}
    for rep in range(args.repeats):
        for nproc in (int(n) for n in args.nprocs.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                run_torchrun("scripts/06_memory_tuning.py", [
                    "calibrate", "--model", args.model, "--max-steps", str(args.steps), "--strategies",
                    args.strategies, "--no-progress", "--output-dir", tmp], nproc=nproc, live=False)
                report = read_json(Path(tmp) / "time_model.json")
            inputs.setdefault(nproc, []).append({"compute": report["compute"], "link_fits": report["link"]["fits"]})
            jobs.append(report["rows"])
    rows = median_rows(jobs)
    print(f"\ntime model vs measured steps: model={args.model}, {args.steps} steps per run (first one left out), "
          f"median of {args.repeats} jobs")
    print(f"{'strategy':<9}{'procs':>6}{'predicted ms':>14}{'measured ms':>13}{'pred/meas':>11}{'range':>13}")
    for r in rows:
        print(f"{r['strategy']:<9}{r['processes']:>6}{1000 * r['predicted_s']:>14.1f}{1000 * r['measured_s']:>13.1f}"
              f"{r['ratio']:>11.2f}{r['ratio_min']:>7.2f}-{r['ratio_max']:.2f}")
    worst = max(abs(r["ratio"] - 1) for r in rows)
    verdict("worst |median predicted/measured - 1|", worst, f"<= {GOAL:.0%}", worst <= GOAL)
    write_artifact("bench_calibration", rows, extra={
        "settings": vars(args), "inputs_by_processes": inputs, "worst_ratio_error": worst, "goal": GOAL,
        "columns": ["strategy", "processes", "predicted_s", "measured_s", "ratio", "ratio_min", "ratio_max"],
        "headers": ["strategy", "processes", "predicted s", "measured s", "predicted / measured (median)",
                    "lowest", "highest"],
        "notes": [f"model {args.model}, fp32, micro-batch 4 × 32 tokens, {args.steps} steps per strategy, "
                  f"{args.repeats} fresh jobs per process count (medians; the range is over the jobs); inputs "
                  "measured in each job before training: one process's forward+backward+AdamW, the same for "
                  "FSDP2 and a DeepSpeed ZeRO-2 engine on a one-rank group, and gloo α-β sweeps (all-reduce, "
                  "all-gather, reduce-scatter, and FSDP2's all-gather and reduce-scatter as it issues them)"]})


if __name__ == "__main__":
    main()
