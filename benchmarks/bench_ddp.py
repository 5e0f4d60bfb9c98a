#!/usr/bin/env python
"""Chapter 02 benchmark: DDP scaling, ecomkit's loop against HF Trainer, and whether ranks wait on each other.

  python benchmarks/bench_ddp.py [--model small] [--steps 30]

All variants run side by side in this one invocation, one thread per process,
on the same model, data, global batch and steps, and are measured the same
way: samples/s = total samples / total wall time of the steady steps (the
first step is warm-up), at the slowest rank's pace; never a mean of per-step
rates.

1. ecomkit DDP, 2 processes / 1 process at the same global batch
   (goal: >= 1.9x; two cores, so 2.0x is the ceiling). Every rank repeats the
   whole optimizer step, so the optimizer's share of the 1-process step caps
   the ratio below 2.0x even with free communication (Amdahl; printed as the
   bound). The same pair runs again with 4 and with 8 accumulation micro-steps
   per optimizer step (global batch x4, x8), where the optimizer step and the
   all-reduce are paid once per 4 or 8 micro-batches. These are larger
   batches, not the same workload run longer: every pair's result is kept and
   printed with its own verdict.
   Two independent copies of the 1-process run, started together with no
   communication, measure the machine's own ceiling for two processes
   (shared memory bandwidth and caches); DDP's ratio is shown against it.
2. ecomkit / HF Trainer, both 2 processes, Trainer at its best with
   ``train_sampling_strategy="group_by_length"`` (goal: >= 1.3x). Trainer
   with its default random sampler runs too. For every run: padding and the
   split of the step into data / forward-backward / optimizer / other.
3. Do ranks wait on each other? From the sampler's plan for this run's data
   (no training): the share of rank time spent waiting for the slowest rank
   at each step's all-reduce, with one length bucket per step (ecomkit's
   sampler) and with random batches; and ecomkit with random batches, measured.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

import datasets
from common import bench_env, print_table, run_summary, verdict, write_artifact

from ecomkit.data import build_datasets
from ecomkit.data.padding import compare_padding, compare_rank_wait
from ecomkit.metrics import concurrent_ceiling, replicated_work_bound
from ecomkit.models.tokenizer import get_tokenizer

DDP_GOAL, TRAINER_GOAL = 1.9, 1.3


def plan_lengths(n_rows: int, seq_len: int, seed: int = 0) -> list[int]:
    """Token lengths of the training set the runs use (same data, tokenizer and split as the scripts)."""
    datasets.disable_progress_bars()
    tok = get_tokenizer("synthetic", bench_env()["ECOMKIT_CACHE"])
    train_ds, *_ = build_datasets("synthetic", n_rows=n_rows, seed=seed, task="lm", tokenizer=tok,
                                  max_length=seq_len)
    return list(train_ds["length"])


def row(name: str, s: dict) -> dict:
    split = s.get("time_split") or {}
    return {"run": name, "processes": s["world_size"], "samples/s": s["samples_per_s"],
            "real tokens/s": s["tokens_per_s"], "ms/step": 1000 * s["step_time_s"],
            "median ms": 1000 * s["step_time_median_s"], "p90 ms": 1000 * s["step_time_p90_s"],
            "padding %": 100 * s["padding_rate"] if s.get("padding_rate") is not None else None,
            **{f"{k} %": 100 * v for k, v in split.items()}, "final loss": s["final_loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--n-rows", type=int, default=2000)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--accum", default="4,8",
                    help="accumulation micro-steps of the extra DDP pairs, comma-separated (one pair each)")
    ap.add_argument("--accum-steps", type=int, default=12, help="optimizer steps of each accumulation pair")
    args = ap.parse_args()
    def flags(steps: int) -> list[str]:
        return ["--model", args.model, "--max-steps", str(steps), "--eval-interval", "0", "--eval-batches", "1",
                "--n-rows", str(args.n_rows), "--seq-len", str(args.seq_len), "--no-save-model", "--lr", "1e-3"]

    common = flags(args.steps)
    gb, half = args.global_batch, str(args.global_batch // 2)
    runs = {
        "ecomkit 1 process": run_summary("02_data_parallel.py", common + ["--micro-batch-size", str(gb)], nproc=1),
        "ecomkit DDP": run_summary("02_data_parallel.py", common + ["--micro-batch-size", half], nproc=2),
        "HF Trainer, group_by_length": run_summary(
            "02_hf_trainer.py", common + ["--micro-batch-size", half, "--hf-sampling", "group_by_length"], nproc=2),
        "HF Trainer, random (its default)": run_summary(
            "02_hf_trainer.py", common + ["--micro-batch-size", half, "--hf-sampling", "random"], nproc=2),
        "ecomkit DDP, random batches": run_summary(
            "02_data_parallel.py", common + ["--micro-batch-size", half, "--no-bucketed"], nproc=2),
    }
    with ThreadPoolExecutor(2) as pool:   # the machine's own ceiling: two independent 1-process jobs, no comm
        copies = list(pool.map(lambda _: run_summary("02_data_parallel.py", common + ["--micro-batch-size", str(gb)],
                                                     nproc=1), range(2)))
    accums = [int(a) for a in args.accum.split(",") if a]
    for a in accums:
        accum = flags(args.accum_steps) + ["--grad-accum", str(a)]
        runs[f"ecomkit 1 process, accumulation {a}"] = run_summary(
            "02_data_parallel.py", accum + ["--micro-batch-size", str(gb)], nproc=1)
        runs[f"ecomkit DDP, accumulation {a}"] = run_summary(
            "02_data_parallel.py", accum + ["--micro-batch-size", half], nproc=2)
    rows = [row(name, s) for name, s in runs.items()]
    columns = list(rows[0])
    two, one, hf = runs["ecomkit DDP"], runs["ecomkit 1 process"], runs["HF Trainer, group_by_length"]
    print(f"\nmodel={args.model} params={two['params']:,} global batch={gb} steps={args.steps} "
          f"(1 thread per process; steady phase = steps 2..{args.steps}, slowest rank)\n")
    print_table(rows, columns)

    lengths = plan_lengths(args.n_rows, args.seq_len)
    wait = compare_rank_wait(lengths, gb // 2, 1, 2)
    pad = compare_padding(lengths, micro_batch_size=gb // 2, num_replicas=2)
    print(f"\nfrom the sampler's plan for this data (epoch 0): {wait.summary()}; {pad.summary()}\n")

    notes = []
    ddp = two["samples_per_s"] / one["samples_per_s"]
    notes.append(verdict("DDP 2 proc / 1 proc samples/s", ddp, f">= {DDP_GOAL}x", ddp >= DDP_GOAL))
    ceiling = concurrent_ceiling(one["samples_per_s"], [c["samples_per_s"] for c in copies])
    notes.append(f"this machine's ceiling: two independent 1-process jobs at once run {ceiling:.2f}x one alone "
                 f"(no communication); DDP reaches {ddp / ceiling:.0%} of it")
    print(notes[-1])
    optim = (one.get("time_split") or {}).get("optim", 0.0)
    notes.append(f"bound from the optimizer step every rank repeats ({optim:.1%} of the 1-process step): "
                 f"{replicated_work_bound(2, optim):.2f}x with free communication")
    print(notes[-1])
    for a in accums:
        one_acc, two_acc = runs[f"ecomkit 1 process, accumulation {a}"], runs[f"ecomkit DDP, accumulation {a}"]
        ddp_acc = two_acc["samples_per_s"] / one_acc["samples_per_s"]
        notes.append(verdict(f"DDP 2 proc / 1 proc samples/s with accumulation {a} (global batch {gb * a}; "
                             f"optimizer and all-reduce once per {a} micro-batches)",
                             ddp_acc, f">= {DDP_GOAL}x", ddp_acc >= DDP_GOAL))
    vs_hf = two["samples_per_s"] / hf["samples_per_s"]
    notes.append(verdict("ecomkit / HF Trainer (group_by_length) samples/s", vs_hf, f">= {TRAINER_GOAL}x",
                         vs_hf >= TRAINER_GOAL))
    vs_random = two["samples_per_s"] / runs["HF Trainer, random (its default)"]["samples_per_s"]
    print(f"      ecomkit / HF Trainer (random sampler) samples/s: {vs_random:.2f}")
    notes.append(f"ecomkit / HF Trainer with its default random sampler: {vs_random:.2f}x samples/s")
    bucket_gain = two["samples_per_s"] / runs["ecomkit DDP, random batches"]["samples_per_s"]
    print(f"      ecomkit bucketed / random batches samples/s: {bucket_gain:.2f}")
    notes.append(f"ecomkit, bucketed / random batches: {bucket_gain:.2f}x samples/s")
    notes.append(f"ranks waiting at the all-reduce, from the sampler's plan: {wait.bucketed:.1%} of rank time with "
                 f"one length bucket per step, {wait.random:.1%} with random batches")
    if vs_hf < TRAINER_GOAL:
        split = hf.get("time_split") or {}
        where = ", ".join(f"{k} {v:.0%}" for k, v in split.items())
        line = (f"where HF Trainer's step goes (group_by_length): {where}; padding {hf['padding_rate']:.1%} "
                f"vs ecomkit {two['padding_rate']:.1%}")
        print(line)
        notes.append(line)
    write_artifact("bench_ddp", rows, extra={
        "settings": {**vars(args), "threads_per_process": 1},
        "columns": ["run", "processes", "samples/s", "real tokens/s", "ms/step", "median ms", "p90 ms", "padding %",
                    "data %", "fwd_bwd %", "optim %", "other %"],
        "rank_wait": {"bucketed": wait.bucketed, "random": wait.random},
        "plan_padding": {"bucketed": pad.bucketed, "random": pad.random},
        "notes": notes})


if __name__ == "__main__":
    main()
