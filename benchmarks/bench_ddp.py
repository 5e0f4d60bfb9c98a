#!/usr/bin/env python
"""Chapter 02 benchmark: DDP scaling at fp32 and bf16, and whether ranks wait (HF Trainer: bench_trainer.py).

  python benchmarks/bench_ddp.py [--model small] [--steps 30] [--precisions fp32 bf16]

All variants run side by side in this one invocation, one thread per process,
on the same model, data, global batch and steps, and are measured the same
way: samples/s = total samples / total wall time of the steady steps (after
the untimed warm-up steps), at the slowest rank's pace; never a mean of
per-step rates.

1. ecomkit DDP, 2 processes / 1 process at the same global batch, once per
   precision in ``--precisions`` and per gradient transport in ``--allreduces``
   (``--ddp-allreduce``: the process group's gloo all-reduce over loopback TCP,
   and shared memory between the ranks of this host; goal: >= 90 % of this
   machine's measured two-process ceiling). Every rank repeats the whole optimizer step, so the
   optimizer's share of the 1-process step caps the ratio below 2.0x even with
   free communication (Amdahl; printed as the bound). Each comparison is
   ``--repeats`` back-to-back rounds (the 1-process run and one DDP run per
   transport), the order rotating; the verdict is the median of the rounds'
   ratios, printed with their range. After each pair, two
   independent copies of the 1-process run, started together with no
   communication, measure the machine's own ceiling for two processes at that
   moment; DDP's ratio is shown against it. ``--accum 4`` adds the same pair
   with 4 accumulation micro-steps per optimizer step (a larger batch, kept
   with its own verdict). Each run times ``--steps`` steps after ``--untimed``
   warm-up steps. One process also runs at each rank's micro-batch: at the same
   global batch every DDP rank does the per-step work (optimizer, per-operation
   overheads) for half the samples, so that run's rate over the 1-process run's
   is the share of the ceiling DDP could reach with free communication. And
   that is measured directly too: after each round, two independent copies of
   the per-rank-batch run, started together, are DDP at the same global batch
   without the all-reduce; DDP's ratio over theirs is what communication costs.
2. Do ranks wait on each other? From the sampler's plan for this run's data
   (no training): the share of rank time spent waiting for the slowest rank
   at each step's all-reduce, with one length bucket per step (ecomkit's
   sampler) and with random batches.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ThreadPoolExecutor

import datasets
from common import (bench_env, paired_rates, pooled_row, print_table, rotating_rounds, run_summary, verdict,
                    warn_emulated_bf16, write_artifact)

from ecomkit.data import build_datasets
from ecomkit.data.padding import compare_padding, compare_rank_wait
from ecomkit.models.tokenizer import get_tokenizer
from ecomlab.rates import concurrent_ceiling, replicated_work_bound

CEILING_GOAL = 0.9   # DDP's 2/1-process ratio as a share of the two-process ceiling
ONE = "1 process"   # the reference job of each round


def plan_lengths(n_rows: int, seq_len: int, seed: int = 0) -> list[int]:
    """Token lengths of the training set the runs use (same data, tokenizer and split as the scripts)."""
    datasets.disable_progress_bars()
    tok = get_tokenizer("synthetic", bench_env()["ECOMKIT_CACHE"])
    train_ds, *_ = build_datasets("synthetic", n_rows=n_rows, seed=seed, task="lm", tokenizer=tok,
                                  max_length=seq_len)
    return list(train_ds["length"])


def run_pairs(one_args: list[str], others: dict[str, tuple[list[str], int]], repeats: int,
              concurrent: dict[str, list[str]] | None = None
              ) -> tuple[list[dict], dict[str, list[dict]], dict[str, list[float]]]:
    """``repeats`` rounds of the 1-process job and each job of ``others`` (its args, its processes), rotating.

    ``concurrent`` (name: a 1-process job's args): after each round, two independent copies of each such job
    started together (no communication); their summed rate over the round's 1-process rate, per name. With
    ``one_args`` itself that is the machine's own ceiling for two processes at that moment; with each rank's
    micro-batch it is what DDP would reach at the same global batch if communication were free.
    """
    together: dict[str, list[float]] = {k: [] for k in concurrent or {}}

    def measure_concurrent(runs: dict[str, list[dict]]) -> None:
        for name, args in (concurrent or {}).items():
            with ThreadPoolExecutor(2) as pool:
                copies = list(pool.map(lambda _: run_summary("02_data_parallel.py", args, nproc=1), range(2)))
            together[name].append(concurrent_ceiling(runs[ONE][-1]["samples_per_s"],
                                                     [c["samples_per_s"] for c in copies]))

    jobs = {ONE: ("02_data_parallel.py", one_args, 1),
            **{k: ("02_data_parallel.py", a, n) for k, (a, n) in others.items()}}
    runs = rotating_rounds(jobs, repeats, measure_concurrent if concurrent else None)
    ones = runs.pop(ONE)
    return ones, runs, together


def ddp_name(precision: str, allreduce: str, suffix: str = "") -> str:
    """A DDP row's name: the transport is named unless it is the process group's (gloo) all-reduce."""
    return f"ecomkit DDP, {precision}" + ("" if allreduce == "process_group" else f", {allreduce}") + suffix


def ddp_section(args: argparse.Namespace, precision: str, runs: dict, notes: list[str]) -> dict:
    """Section 1 at one precision: 2/1-process rounds per transport, their ceilings, (``--accum``) a larger batch."""
    def flags(steps: int) -> list[str]:
        return ["--model", args.model, "--max-steps", str(steps + args.untimed), "--untimed-steps", str(args.untimed),
                "--eval-interval", "0", "--eval-batches", "1",
                "--n-rows", str(args.n_rows), "--seq-len", str(args.seq_len), "--no-save-model", "--lr", "1e-3",
                "--precision", precision]

    gb, half = args.global_batch, str(args.global_batch // 2)
    common = flags(args.steps)
    one_args, rank_args = common + ["--micro-batch-size", str(gb)], common + ["--micro-batch-size", half]
    jobs = {a: (rank_args + ["--ddp-allreduce", a], 2) for a in args.allreduces}
    jobs["per-rank batch"] = (rank_args, 1)   # one process at each rank's batch
    ones, twos, together = run_pairs(one_args, jobs, args.repeats,
                                     concurrent={"ceiling": one_args, "free communication": rank_args})
    runs[f"ecomkit 1 process, {precision}"] = ones
    per_rank = twos.pop("per-rank batch")
    runs[f"ecomkit 1 process, {precision}, micro-batch {half} (each rank's)"] = per_rank
    ceilings, free = together["ceiling"], together["free communication"]
    ceiling = statistics.median(ceilings)
    result: dict = {"ceilings": ceilings, "free_communication": free}
    for a, rs in twos.items():
        runs[ddp_name(precision, a)] = rs
        ratio = paired_rates(rs, ones)
        share = ratio.median / ceiling
        notes.append(verdict(f"{precision}, --ddp-allreduce {a}: DDP 2 proc / 1 proc samples/s {ratio.describe()} = "
                             f"{share:.0%} of this machine's two-process ceiling {ceiling:.2f}x (two independent "
                             f"1-process jobs at once, median of {len(ceilings)}, range {min(ceilings):.2f}-"
                             f"{max(ceilings):.2f})", share, f">= {CEILING_GOAL:.0%}", share >= CEILING_GOAL))
        result[a] = list(ratio.ratios)
    optim = (ones[0].get("time_split") or {}).get("optim", 0.0)
    notes.append(f"{precision}: bound from the optimizer step every rank repeats ({optim:.1%} of the 1-process "
                 f"step): {replicated_work_bound(2, optim):.2f}x with free communication")
    print(notes[-1])
    small = paired_rates(per_rank, ones)
    result["per_rank_batch"] = list(small.ratios)
    notes.append(f"{precision}: one process at each rank's micro-batch ({half}) / at the global batch ({gb}), "
                 f"samples/s {small.describe()}: with free communication DDP reaches at most that share of the "
                 f"ceiling ({small.median:.0%}), since each rank's smaller batch runs the same per-step work "
                 "(optimizer, per-operation overheads) for half the samples")
    print(notes[-1])
    f = statistics.median(free)
    notes.append(f"{precision}: two independent 1-process jobs at each rank's micro-batch ({half}), started together, "
                 f"over the 1-process job at {gb}: {f:.2f}x (median of {len(free)}, range {min(free):.2f}-"
                 f"{max(free):.2f}), {f / ceiling:.0%} of the ceiling: DDP at this global batch with free "
                 "communication, measured; " + ", ".join(
                     f"--ddp-allreduce {a} reached {statistics.median(result[a]) / f:.0%} of it" for a in twos))
    print(notes[-1])
    for n in [int(n) for n in args.accum.split(",") if n]:
        acc = flags(args.accum_steps) + ["--grad-accum", str(n)]
        a1, a2 = run_pairs(acc + ["--micro-batch-size", str(gb)],
                           {"ddp": (acc + ["--micro-batch-size", half, "--ddp-allreduce", args.allreduces[0]], 2)},
                           args.repeats)[:2]
        runs[f"ecomkit 1 process, {precision}, accumulation {n}"] = a1
        runs[ddp_name(precision, args.allreduces[0], f", accumulation {n}")] = a2["ddp"]
        r = paired_rates(a2["ddp"], a1)
        notes.append(verdict(f"{precision}: DDP 2/1 with accumulation {n} (global batch {gb * n}), {r.describe()}, "
                             f"{r.median / ceiling:.0%} of the ceiling", r.median / ceiling,
                             f">= {CEILING_GOAL:.0%}", r.median / ceiling >= CEILING_GOAL))
        result[f"accum_{n}"] = list(r.ratios)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=30, help="timed optimizer steps of each DDP-scaling run")
    ap.add_argument("--untimed", type=int, default=8,
                    help="untimed first steps of each DDP-scaling run (oneDNN's per-shape kernels are built there)")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--n-rows", type=int, default=2000)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                    help="precisions of the DDP-scaling pairs (section 1)")
    ap.add_argument("--allreduces", nargs="+", default=["process_group", "shm"], choices=["process_group", "shm"],
                    help="gradient transports of the DDP-scaling runs (section 1; --ddp-allreduce)")
    ap.add_argument("--accum", default="",
                    help="accumulation micro-steps of extra DDP pairs, comma-separated (one pair each; e.g. 4)")
    ap.add_argument("--accum-steps", type=int, default=12, help="optimizer steps of each accumulation pair")
    ap.add_argument("--repeats", type=int, default=2,
                    help="back-to-back pairs per DDP comparison (and copies of the ceiling run); the median "
                         "ratio is the verdict")
    args = ap.parse_args()
    warn_emulated_bf16(args.precisions, "--precisions fp32 skips bf16.")
    runs: dict[str, list[dict]] = {}
    notes: list[str] = []
    scaling = {p: ddp_section(args, p, runs, notes) for p in args.precisions}
    rows = [pooled_row(name, rs) for name, rs in runs.items()]
    print(f"\nmodel={args.model} global batch={args.global_batch} (1 thread per process; slowest rank; "
          f"{args.repeats} pairs per scaling comparison)\n")
    print_table(rows, list(rows[0]))
    gb = args.global_batch
    lengths = plan_lengths(args.n_rows, args.seq_len)
    wait = compare_rank_wait(lengths, gb // 2, 1, 2)
    pad = compare_padding(lengths, micro_batch_size=gb // 2, num_replicas=2)
    print(f"\nfrom the sampler's plan for this data (epoch 0): {wait.summary()}; {pad.summary()}\n")
    notes.append(f"ranks waiting at the all-reduce, from the sampler's plan: {wait.bucketed:.1%} of rank time with "
                 f"one length bucket per step, {wait.random:.1%} with random batches")
    write_artifact("bench_ddp", rows, extra={
        "settings": {**vars(args), "threads_per_process": 1},
        "columns": ["run", "processes", "runs", "samples/s", "real tokens/s", "ms/step", "median ms", "p90 ms",
                    "padding %", "data %", "fwd_bwd %", "optim %", "other %", "final loss"],
        "scaling": scaling, "rank_wait": {"bucketed": wait.bucketed, "random": wait.random},
        "plan_padding": {"bucketed": pad.bucketed, "random": pad.random},
        "notes": notes})


if __name__ == "__main__":
    main()
