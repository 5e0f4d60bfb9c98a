#!/usr/bin/env python
"""Chapter 02 benchmark: DDP scaling at fp32 and bf16, ecomkit's loop against HF Trainer, and whether ranks wait.

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
   is the share of the ceiling DDP could reach with free communication.
2. ecomkit / HF Trainer, both 2 processes at ``--best-precision`` (bf16), back
   to back, each at its best (goal: >= 1.2x): Trainer with
   ``train_sampling_strategy="group_by_length"``, ecomkit with its bucketed
   sampler, each compiled (``torch_compile=True`` / ``--compile``; this
   benchmark's ``--no-compile`` drops these runs) and not; a side's best is
   the faster of its runs. ecomkit's DDP runs use ``--best-allreduce`` (shm);
   one more uncompiled ecomkit run uses the process group's all-reduce, the
   transport Trainer has. Trainer also runs with its default random sampler, ecomkit
   with random batches. Trainer runs BLOOM's own (eager) attention; ecomkit
   its ``--attn auto`` pick, printed beside the rows. These runs time
   ``--best-steps`` steps after ``--best-untimed`` untimed ones, the same for
   every row, since compiled runs recompile for new batch shapes early on.
   For every run: padding and the split of the step into data / forward-
   backward / optimizer / other.
3. Do ranks wait on each other? From the sampler's plan for this run's data
   (no training): the share of rank time spent waiting for the slowest rank
   at each step's all-reduce, with one length bucket per step (ecomkit's
   sampler) and with random batches.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ThreadPoolExecutor

import datasets
from common import bench_env, print_table, run_summary, verdict, write_artifact

from ecomkit.data import build_datasets
from ecomkit.data.padding import compare_padding, compare_rank_wait
from ecomkit.metrics import concurrent_ceiling, paired_ratios, pooled_rate, replicated_work_bound
from ecomkit.models.tokenizer import get_tokenizer

CEILING_GOAL, TRAINER_GOAL = 0.9, 1.2  # share of the two-process ceiling; ecomkit / Trainer


def plan_lengths(n_rows: int, seq_len: int, seed: int = 0) -> list[int]:
    """Token lengths of the training set the runs use (same data, tokenizer and split as the scripts)."""
    datasets.disable_progress_bars()
    tok = get_tokenizer("synthetic", bench_env()["ECOMKIT_CACHE"])
    train_ds, *_ = build_datasets("synthetic", n_rows=n_rows, seed=seed, task="lm", tokenizer=tok,
                                  max_length=seq_len)
    return list(train_ds["length"])


def row(name: str, runs: list[dict]) -> dict:
    """One table row for ``runs`` of the same job: pooled rates (totals over totals), the runs' median step times.

    ``ms/step`` is the pooled steady wall time per step; ``median ms`` and
    ``p90 ms`` the median over the runs of each run's own; the time split and
    padding are weighted by each run's steady wall time.
    """
    wall = sum(r["steady_wall_s"] for r in runs)

    def weighted(get) -> float | None:
        vals = [(get(r), r["steady_wall_s"]) for r in runs]
        return None if any(v is None for v, _ in vals) else sum(v * w for v, w in vals) / wall

    parts = list((runs[0].get("time_split") or {}).keys())
    pad = weighted(lambda r: r.get("padding_rate"))
    return {"run": name, "processes": runs[0]["world_size"], "runs": len(runs),
            "samples/s": pooled_rate(runs), "real tokens/s": pooled_rate(runs, "tokens_per_s"),
            "ms/step": 1000 * wall / sum(r["steady_steps"] for r in runs),
            "median ms": 1000 * statistics.median(r["step_time_median_s"] for r in runs),
            "p90 ms": 1000 * statistics.median(r["step_time_p90_s"] for r in runs),
            "padding %": 100 * pad if pad is not None else None,
            **{f"{k} %": 100 * weighted(lambda r, k=k: (r.get("time_split") or {}).get(k, 0.0)) for k in parts},
            "final loss": runs[0]["final_loss"]}


def run_pairs(one_args: list[str], others: dict[str, tuple[list[str], int]], repeats: int,
              ceiling: bool = False) -> tuple[list[dict], dict[str, list[dict]], list[float]]:
    """``repeats`` rounds of the 1-process job and each job of ``others`` (its args, its processes), rotating.

    Rotating cancels a drift of the machine's speed within the benchmark
    instead of charging it to one side. With ``ceiling``, each round is followed
    by two independent copies of the 1-process job started together (no
    communication): their summed rate over the round's 1-process rate is the
    machine's own ceiling for two processes at that moment.
    """
    ones: list[dict] = []
    twos: dict[str, list[dict]] = {k: [] for k in others}
    ceilings: list[float] = []
    jobs = [(ones, one_args, 1)] + [(twos[k], a, n) for k, (a, n) in others.items()]
    for r in range(repeats):
        for runs, args, nproc in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
            runs.append(run_summary("02_data_parallel.py", args, nproc=nproc))
        if ceiling:
            with ThreadPoolExecutor(2) as pool:
                copies = list(pool.map(lambda _: run_summary("02_data_parallel.py", one_args, nproc=1), range(2)))
            ceilings.append(concurrent_ceiling(ones[-1]["samples_per_s"], [c["samples_per_s"] for c in copies]))
    return ones, twos, ceilings


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
    jobs = {a: (common + ["--micro-batch-size", half, "--ddp-allreduce", a], 2) for a in args.allreduces}
    jobs["per-rank batch"] = (common + ["--micro-batch-size", half], 1)   # one process at each rank's batch
    ones, twos, ceilings = run_pairs(common + ["--micro-batch-size", str(gb)], jobs, args.repeats, ceiling=True)
    runs[f"ecomkit 1 process, {precision}"] = ones
    per_rank = twos.pop("per-rank batch")
    runs[f"ecomkit 1 process, {precision}, micro-batch {half} (each rank's)"] = per_rank
    ceiling = statistics.median(ceilings)
    result: dict = {"ceilings": ceilings}
    for a, rs in twos.items():
        runs[ddp_name(precision, a)] = rs
        ratio = paired_ratios([r["samples_per_s"] for r in rs], [r["samples_per_s"] for r in ones])
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
    small = paired_ratios([r["samples_per_s"] for r in per_rank], [r["samples_per_s"] for r in ones])
    result["per_rank_batch"] = list(small.ratios)
    notes.append(f"{precision}: one process at each rank's micro-batch ({half}) / at the global batch ({gb}), "
                 f"samples/s {small.describe()}: with free communication DDP reaches at most that share of the "
                 f"ceiling ({small.median:.0%}), since each rank's smaller batch runs the same per-step work "
                 "(optimizer, per-operation overheads) for half the samples")
    print(notes[-1])
    for n in [int(n) for n in args.accum.split(",") if n]:
        acc = flags(args.accum_steps) + ["--grad-accum", str(n)]
        a1, a2 = run_pairs(acc + ["--micro-batch-size", str(gb)],
                           {"ddp": (acc + ["--micro-batch-size", half, "--ddp-allreduce", args.allreduces[0]], 2)},
                           args.repeats)[:2]
        runs[f"ecomkit 1 process, {precision}, accumulation {n}"] = a1
        runs[ddp_name(precision, args.allreduces[0], f", accumulation {n}")] = a2["ddp"]
        r = paired_ratios([x["samples_per_s"] for x in a2["ddp"]], [x["samples_per_s"] for x in a1])
        notes.append(verdict(f"{precision}: DDP 2/1 with accumulation {n} (global batch {gb * n}), {r.describe()}, "
                             f"{r.median / ceiling:.0%} of the ceiling", r.median / ceiling,
                             f">= {CEILING_GOAL:.0%}", r.median / ceiling >= CEILING_GOAL))
        result[f"accum_{n}"] = list(r.ratios)
    return result


def trainer_section(args: argparse.Namespace, runs: dict, notes: list[str]) -> None:
    """Section 2: ecomkit and HF Trainer at ``--best-precision``, each at its best, and without compilation."""
    p, first = args.best_precision, len(notes)
    two = ["--model", args.model, "--max-steps", str(args.best_steps), "--untimed-steps", str(args.best_untimed),
           "--eval-interval", "0", "--eval-batches", "1", "--n-rows", str(args.n_rows), "--seq-len",
           str(args.seq_len), "--no-save-model", "--lr", "1e-3", "--precision", p,
           "--micro-batch-size", str(args.global_batch // 2)]
    comp = ["--compile"] if args.compile else []
    best = args.best_allreduce
    eco = ["--ddp-allreduce", best]
    variants = [(ddp_name(p, best, ", compiled" if comp else ""), "02_data_parallel.py", eco + comp),
                (f"HF Trainer, {p}, group_by_length" + (", torch_compile" if comp else ""), "02_hf_trainer.py",
                 ["--hf-sampling", "group_by_length", *comp])]
    if comp:
        variants += [(ddp_name(p, best, ", not compiled"), "02_data_parallel.py", eco),
                     (f"HF Trainer, {p}, group_by_length, not compiled", "02_hf_trainer.py",
                      ["--hf-sampling", "group_by_length"])]
    variants += [(f"HF Trainer, {p}, random sampler (its default)", "02_hf_trainer.py", ["--hf-sampling", "random"]),
                 (ddp_name(p, best, ", random batches"), "02_data_parallel.py", eco + ["--no-bucketed"])]
    if best != "process_group":  # the transport Trainer has (gloo), for a like-for-like row
        variants += [(ddp_name(p, "process_group", ", not compiled" if comp else ""), "02_data_parallel.py", [])]
    for name, script, extra in variants:
        runs[name] = [run_summary(script, two + extra, nproc=2)]
        print(f"  ran {name}: {runs[name][0]['samples_per_s']:.1f} samples/s", flush=True)
    # Each side at its best: the faster of its compiled and uncompiled runs (bucketed / group_by_length).
    eco_name = max((v[0] for v in variants[::2][:2 if comp else 1]), key=lambda n: runs[n][0]["samples_per_s"])
    hf_name = max((v[0] for v in variants[1::2][:2 if comp else 1]), key=lambda n: runs[n][0]["samples_per_s"])
    eco, hf = runs[eco_name][0], runs[hf_name][0]
    vs_hf = eco["samples_per_s"] / hf["samples_per_s"]
    eco_cfg = eco.get("config", {})
    gelu = "fused GeLU" if eco_cfg.get("fused_gelu") else "transformers' GeLU"
    notes.append(verdict(f"ecomkit / HF Trainer, each at its best ({eco_name} vs {hf_name}; ecomkit attention "
                         f"{eco_cfg.get('attn', '?')} and {gelu}, Trainer BLOOM's eager attention "
                         "and transformers' GeLU) samples/s",
                         vs_hf, f">= {TRAINER_GOAL}x", vs_hf >= TRAINER_GOAL))
    # (denominator, numerator) indices into variants: like-for-like pairs
    pairs = [(2, 3), (0, 1), (4, 3), (5, 2)] if comp else [(0, 1), (2, 1), (3, 0)]
    if best != "process_group":  # the same transport on both sides, and what shared memory adds
        gloo, hf_plain, eco_plain = len(variants) - 1, (3 if comp else 1), (2 if comp else 0)
        pairs += [(gloo, hf_plain), (gloo, eco_plain)]
    for a, b in pairs:
        ra, rb = runs[variants[a][0]][0], runs[variants[b][0]][0]
        notes.append(f"{variants[b][0]} / {variants[a][0]}: {rb['samples_per_s'] / ra['samples_per_s']:.2f}x "
                     "samples/s")
    for name, r in ((eco_name, eco), (hf_name, hf)):
        split = ", ".join(f"{k} {v:.0%}" for k, v in (r.get("time_split") or {}).items())
        notes.append(f"where the step goes, {name}: {split}; padding {r['padding_rate']:.1%}")
    for n in notes[first:]:
        if not n.startswith(("PASS", "MISS")):   # verdict() printed those
            print(n)


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
    ap.add_argument("--best-precision", default="bf16", choices=["fp32", "bf16"],
                    help="precision of the ecomkit / HF Trainer comparison (section 2)")
    ap.add_argument("--allreduces", nargs="+", default=["process_group", "shm"], choices=["process_group", "shm"],
                    help="gradient transports of the DDP-scaling runs (section 1; --ddp-allreduce)")
    ap.add_argument("--best-allreduce", default="shm", choices=["process_group", "shm"],
                    help="ecomkit's gradient transport in section 2 (--ddp-allreduce)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="section 2 also compiles both sides (ecomkit --compile, Trainer torch_compile=True)")
    ap.add_argument("--best-steps", type=int, default=40, help="steps of each section-2 run")
    ap.add_argument("--best-untimed", type=int, default=8, help="untimed first steps of each section-2 run")
    ap.add_argument("--accum", default="",
                    help="accumulation micro-steps of extra DDP pairs, comma-separated (one pair each; e.g. 4)")
    ap.add_argument("--accum-steps", type=int, default=12, help="optimizer steps of each accumulation pair")
    ap.add_argument("--repeats", type=int, default=2,
                    help="back-to-back pairs per DDP comparison (and copies of the ceiling run); the median "
                         "ratio is the verdict")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {}
    notes: list[str] = []
    scaling = {p: ddp_section(args, p, runs, notes) for p in args.precisions}
    trainer_section(args, runs, notes)
    rows = [row(name, rs) for name, rs in runs.items()]
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
