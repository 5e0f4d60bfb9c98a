#!/usr/bin/env python
"""Chapter 02 benchmark: ecomkit's loop against HF Trainer, each at its best, 2 processes, in paired rounds.

  python benchmarks/bench_trainer.py [--model small] [--precision bf16] [--repeats 3]

Both sides run the same job: ``--model``, the synthetic catalog, 2 processes of
one thread each, the same global batch, ``--steps`` steps of which the first
``--untimed`` are not timed (compilation, then recompilation for new batch
shapes), at ``--precision``. Throughput is total samples over the steady
phase's wall time at the slowest rank's pace, never a mean of per-step rates.

Variants:
- HF Trainer (``scripts/02_hf_trainer.py``) with ``group_by_length`` and
  ``bf16=True``, compiled (``torch_compile=True``) and not; also with its
  default random sampler;
- ecomkit (``scripts/02_data_parallel.py``) with its bucketed sampler and
  ``--ddp-allreduce`` ``--allreduce`` (shm), compiled (``--compile``) and not;
  also with random batches, and with the process group's all-reduce (gloo),
  the transport Trainer has, for a like-for-like row.

Every variant runs ``--repeats`` times, in rounds whose order rotates, so a
drift of the machine's speed is not charged to one side. A side's best is its
variant with the higher pooled rate over all rounds (compiled or not); the
goal (>= 1.2x) is the median over the rounds of ecomkit's best run / Trainer's
best run in the same round, printed with the range. The notes give each
side's split of the step (data, forward-backward, optimizer, other) and its
padding, which is where a difference comes from, and the attention and GeLU
each side ran.
"""

from __future__ import annotations

import argparse

from common import (paired_rates, pooled_row, print_table, rotating_rounds, verdict, warn_emulated_bf16,
                    write_artifact)

from ecomlab.rates import pooled_rate

GOAL = 1.2   # ecomkit / HF Trainer, each at its best
ECO, HF = "02_data_parallel.py", "02_hf_trainer.py"


def variants(args: argparse.Namespace) -> dict[tuple[str, str], tuple[str, str, list[str]]]:
    """(side, kind) -> (row name, script, extra flags); kinds: compiled, plain, random, gloo."""
    p, best = args.precision, args.allreduce
    shm = ["--ddp-allreduce", best]
    eco = f"ecomkit DDP, {p}" + ("" if best == "process_group" else f", {best}")
    out = {("ecomkit", "compiled"): (f"{eco}, compiled", ECO, shm + ["--compile"]),
           ("ecomkit", "plain"): (f"{eco}, not compiled", ECO, shm),
           ("trainer", "compiled"): (f"HF Trainer, {p}, group_by_length, torch_compile", HF,
                                     ["--hf-sampling", "group_by_length", "--compile"]),
           ("trainer", "plain"): (f"HF Trainer, {p}, group_by_length, not compiled", HF,
                                  ["--hf-sampling", "group_by_length"]),
           ("trainer", "random"): (f"HF Trainer, {p}, random sampler (its default)", HF, ["--hf-sampling", "random"]),
           ("ecomkit", "random"): (f"{eco}, random batches", ECO, shm + ["--no-bucketed"])}
    if not args.compile:
        out = {k: v for k, v in out.items() if k[1] != "compiled"}
    if best != "process_group":   # the transport Trainer has
        out[("ecomkit", "gloo")] = (f"ecomkit DDP, {p}, gloo all-reduce, not compiled", ECO, [])
    return out


# (numerator, denominator) pairs the notes print: like for like across sides, then each option on its own side
PAIRS = [(("ecomkit", "plain"), ("trainer", "plain")), (("ecomkit", "compiled"), ("trainer", "compiled")),
         (("ecomkit", "gloo"), ("trainer", "plain")), (("ecomkit", "compiled"), ("ecomkit", "plain")),
         (("trainer", "compiled"), ("trainer", "plain")), (("ecomkit", "plain"), ("ecomkit", "random")),
         (("trainer", "plain"), ("trainer", "random")), (("ecomkit", "plain"), ("ecomkit", "gloo"))]


def side_best(runs: dict[str, list[dict]], jobs: dict, side: str) -> str:
    """A side's best: of its compiled and uncompiled runs with length grouping, the higher pooled rate."""
    names = [jobs[(side, kind)][0] for kind in ("compiled", "plain") if (side, kind) in jobs]
    return max(names, key=lambda n: pooled_rate(runs[n]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="model preset both sides train")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"], help="precision of every run")
    ap.add_argument("--allreduce", default="shm", choices=["process_group", "shm"],
                    help="ecomkit's gradient transport (--ddp-allreduce); a gloo row is added for like-for-like")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="also compile both sides (ecomkit --compile, Trainer torch_compile=True)")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of each run, untimed ones included")
    ap.add_argument("--untimed", type=int, default=8, help="untimed first steps of each run")
    ap.add_argument("--global-batch", type=int, default=16, help="samples per optimizer step, over both processes")
    ap.add_argument("--n-rows", type=int, default=2000, help="rows of the synthetic catalog")
    ap.add_argument("--seq-len", type=int, default=128, help="longest sequence, in tokens")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; the verdict is the median of their ratios")
    args = ap.parse_args()
    warn_emulated_bf16([args.precision], "--precision fp32 runs both sides in fp32.")
    common = ["--model", args.model, "--max-steps", str(args.steps), "--untimed-steps", str(args.untimed),
              "--eval-interval", "0", "--eval-batches", "1", "--n-rows", str(args.n_rows), "--seq-len",
              str(args.seq_len), "--no-save-model", "--lr", "1e-3", "--precision", args.precision,
              "--micro-batch-size", str(args.global_batch // 2)]
    jobs = variants(args)
    runs = rotating_rounds({name: (script, common + extra, 2) for name, script, extra in jobs.values()},
                           args.repeats)
    eco_name, hf_name = side_best(runs, jobs, "ecomkit"), side_best(runs, jobs, "trainer")
    ratio = paired_rates(runs[eco_name], runs[hf_name])
    cfg = runs[eco_name][0].get("config", {})
    gelu = "fused GeLU" if cfg.get("fused_gelu") else "transformers' GeLU"
    notes = [verdict(f"ecomkit / HF Trainer, each at its best ({eco_name} vs {hf_name}; ecomkit attention "
                     f"{cfg.get('attn', '?')} and {gelu}, Trainer BLOOM's eager attention and transformers' GeLU) "
                     f"samples/s {ratio.describe()}", ratio.median, f">= {GOAL}x", ratio.median >= GOAL)]
    for num, den in (pair for pair in PAIRS if pair[0] in jobs and pair[1] in jobs):
        r = paired_rates(runs[jobs[num][0]], runs[jobs[den][0]])
        notes.append(f"{jobs[num][0]} / {jobs[den][0]}: samples/s {r.describe()}")
    for name in (eco_name, hf_name):
        r = pooled_row(name, runs[name])
        split = ", ".join(f"{k[:-2]} {r[k] * r['ms/step'] / 100:.0f} ms ({r[k]:.0f}%)" for k in r
                          if k.endswith(" %") and k != "padding %")
        notes.append(f"where the step goes, {name}: {split} of {r['ms/step']:.0f} ms; padding {r['padding %']:.1f}%")
    rows = [pooled_row(name, rs) for name, rs in runs.items()]
    print(f"\nmodel={args.model} global batch={args.global_batch} (2 processes, 1 thread each; slowest rank; "
          f"{args.repeats} rounds)\n")
    print_table(rows, list(rows[0]))
    print("\n".join(n for n in notes[1:]))
    write_artifact("bench_trainer", rows, extra={
        "settings": {**vars(args), "threads_per_process": 1},
        "columns": ["run", "processes", "runs", "samples/s", "real tokens/s", "ms/step", "median ms", "p90 ms",
                    "padding %", "data %", "fwd_bwd %", "optim %", "other %", "final loss"],
        "ratio": {"ecomkit": eco_name, "trainer": hf_name, "per_round": list(ratio.ratios)},
        "notes": notes})


if __name__ == "__main__":
    main()
