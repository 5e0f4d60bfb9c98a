#!/usr/bin/env python
"""bf16 against fp32 on this CPU, one process, the same job, side by side; and the share of the measured peak.

  python benchmarks/bench_precision.py [--model small] [--steps 12] [--untimed 8] [--repeats 2]

Each repeat runs the same chapter 02 job (one process, one thread) as fp32
and bf16 (both with the defaults: ``--attn auto``, ecomkit's CPU kernels), as
bf16 with each attention named (``--attn eager``, ``--attn sdpa``), as bf16 and
fp32 with ATen's kernels (``--no-cpu-kernels``) and as bf16 with ``--compile``,
the order rotating per repeat, so a drift of the shared machine's speed is not charged
to one side. Every run times ``--steps`` steps after ``--untimed`` untimed ones: the
first batch of each new length pays one-off work (oneDNN generates its bf16
kernels per shape, about 100 ms on ``small``; compilation and recompilations
under ``--compile``), so the timed steps are the steady phase, but for the chunked LM head's row counts, of
which a run meets up to 64 at 8 × 128: these steps still meet new ones, which a long run pays once and then
stops paying (docs/perf.md, bench_kernels' head row). fp32 and bf16 also
run once per repeat with the loop's default of 1 untimed step (the shorter measurement of the earlier
artifacts): their ratio is printed beside the verdict, which is the steady phase's.
Rates are totals over the steady steps (chapter 02's summary).
The share of peak is a run's model FLOP/s (the planner's ``flops_per_token`` × real tokens / wall time, from
its summary) over the GEMM peak of its precision (the fastest of 256/512/1024² GEMMs, ``matmul_peak``), timed
by this benchmark at one thread before the runs: a run times no GEMM itself (issue 55).

Goals (not moved when missed): bf16 / fp32 real tokens/s >= 2.0x with the
final loss within 1 %; the default bf16 run at >= 50 % of the measured bf16 matmul peak (the compiled
run's share is printed beside it, not counted for the goal: compilation is not the default).

  python benchmarks/bench_precision.py --baseline PATH [--repeats 5]

Before against after: the default fp32 and bf16 runs of this checkout and of another one (``PATH``: a worktree
of the commit to compare with, its ``scripts/`` and ``ecomkit`` on its own ``PYTHONPATH``), alternating, the order
rotating per repeat; each variant's after / before real tokens/s paired per repeat, and its final losses side by
side (the same job: equal unless the change changed what the step computes). Goal (not moved when missed): after
/ before >= 0.97 at fp32 and at bf16 (a regression beyond a shared machine's noise). Artifact ``bench_precision_ab``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path

import torch

from common import paired_rates, print_table, rotating_rounds, verdict, warn_emulated_bf16, write_artifact

from ecomkit.hardware import matmul_peak
from ecomlab.rates import PairedRatio

SPEEDUP_GOAL, LOSS_TOL, PEAK_GOAL = 2.0, 0.01, 0.50
NO_REGRESSION = 0.97   # after / before real tokens/s (--baseline)
VARIANTS = {"fp32": ["--precision", "fp32"], "bf16": ["--precision", "bf16"],
            "bf16 eager": ["--precision", "bf16", "--attn", "eager"],
            "bf16 sdpa": ["--precision", "bf16", "--attn", "sdpa"],
            "fp32 ATen kernels": ["--precision", "fp32", "--no-cpu-kernels"],
            "bf16 ATen kernels": ["--precision", "bf16", "--no-cpu-kernels"],
            "bf16 compiled": ["--precision", "bf16", "--compile"],
            "fp32, 1 untimed step": ["--precision", "fp32", "--untimed-steps", "1"],
            "bf16, 1 untimed step": ["--precision", "bf16", "--untimed-steps", "1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=12, help="timed steps of each run")
    ap.add_argument("--untimed", type=int, default=8, help="untimed first steps of each run (warm-up)")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline", default=None, metavar="PATH",
                    help="a checkout of another commit: time its default fp32 and bf16 runs against this one's")
    args = ap.parse_args()
    warn_emulated_bf16(["bf16"], "It compares bf16 with fp32 and has no fp32-only mode.")
    common = ["--model", args.model, "--eval-interval", "0", "--eval-batches", "1",
              "--micro-batch-size", str(args.micro_batch_size), "--seq-len", str(args.seq_len), "--n-rows", "2000",
              "--no-save-model", "--lr", "1e-3", "--untimed-steps", str(args.untimed)]
    if args.baseline:
        before_after(args, common + ["--max-steps", str(args.steps + args.untimed)], Path(args.baseline))
        return
    torch.set_num_threads(1)   # the runs' thread count
    peaks = {p: matmul_peak(p)[0] for p in ("fp32", "bf16")}

    def peak_share(s: dict) -> float:
        return s["model_flops_per_s"] / peaks[s["config"]["precision"]]

    jobs = {name: ("02_data_parallel.py",
                   common + flags + ["--max-steps", str(args.steps + (1 if "1 untimed" in name else args.untimed))], 1)
            for name, flags in VARIANTS.items()}
    runs = rotating_rounds(jobs, args.repeats, describe=lambda s: (
        f"{s['tokens_per_s']:.0f} real tokens/s, loss {s['final_loss']:.4f}, {peak_share(s):.1%} of the "
        f"{s['config']['precision']} GEMM peak"))
    rows = []
    for name, rs in runs.items():
        rows.append({"run": name, "attention": rs[0]["config"]["attn"], "runs": len(rs),
                     "real tokens/s": statistics.median(s["tokens_per_s"] for s in rs),
                     "model GFLOP/s": statistics.median(s["model_flops_per_s"] for s in rs) / 1e9,
                     "peak GFLOP/s": peaks[rs[0]["config"]["precision"]] / 1e9,
                     "share of measured peak %": 100 * statistics.median(peak_share(s) for s in rs),
                     "MFLOPs/token": statistics.median(s["model_flops_per_s"] / s["tokens_per_s"] for s in rs) / 1e6,
                     "final loss": rs[0]["final_loss"], "padding %": 100 * (rs[0].get("padding_rate") or 0)})

    def speed_up(num: str, den: str) -> PairedRatio:   # real tokens/s of ``num`` over ``den``, per repeat
        return paired_rates(runs[num], runs[den], "tokens_per_s")

    speed, eager = speed_up("bf16", "fp32"), speed_up("bf16 eager", "bf16 sdpa")
    compiled = speed_up("bf16 compiled", "bf16")
    kernels = {p: speed_up(p, f"{p} ATen kernels") for p in ("fp32", "bf16")}
    short = speed_up("bf16, 1 untimed step", "fp32, 1 untimed step")
    aten_speed = speed_up("bf16 ATen kernels", "fp32 ATen kernels")
    compiled_share = statistics.median(peak_share(s) for s in runs["bf16 compiled"])
    loss_rel = abs(runs["bf16"][0]["final_loss"] - runs["fp32"][0]["final_loss"]) / runs["fp32"][0]["final_loss"]
    share = statistics.median(peak_share(s) for s in runs["bf16"])
    columns = list(rows[0])
    print_table(rows, columns)
    fp32_loss, bf16_loss = runs["fp32"][0]["final_loss"], runs["bf16"][0]["final_loss"]
    notes = [
        f"bf16 / fp32 real tokens/s, paired per repeat: {speed.describe()}",
        f"the same with 1 untimed step instead of {args.untimed} (the shorter measurement): {short.describe()}",
        verdict("bf16 / fp32 real tokens/s (median)", speed.median, f">= {SPEEDUP_GOAL}x", speed.median >= SPEEDUP_GOAL),
        verdict(f"final loss bf16 {bf16_loss:.4f} vs fp32 {fp32_loss:.4f}, relative difference", loss_rel,
                f"<= {LOSS_TOL}", loss_rel <= LOSS_TOL),
        verdict(f"default bf16 run's share of the measured bf16 GEMM peak (attention "
                f"{runs['bf16'][0]['config']['attn']})", share, f">= {PEAK_GOAL}", share >= PEAK_GOAL),
        f"bf16 with --compile: {compiled_share:.1%} of the measured bf16 peak; compiled / default real tokens/s "
        f"{compiled.describe()} (not the default recipe, so not counted for the goal)",
        "FLOPs per token (MFLOPs/token column): the planner's flops_per_token (6 N plus the attention term at "
        "each batch's real lengths), real tokens only; peak: the fastest of 256/512/1024² GEMMs of the run's "
        "precision, timed by this benchmark at one thread before the runs",
        f"bf16 eager / bf16 sdpa, real tokens/s: {eager.describe()}",
        *(f"{p}: ecomkit's CPU kernels / ATen's, real tokens/s: {kernels[p].describe()}" for p in kernels),
        f"with ATen's kernels: bf16 / fp32 real tokens/s {aten_speed.describe()}",
        f"every run: {args.steps} timed steps after {args.untimed} untimed (warm-up: oneDNN's per-shape bf16 "
        "kernels, compilation)",
        "one process, one thread; other jobs shared the machine (load average above): levels move, the ratios "
        "are paired within each repeat",
    ]
    for n in notes:
        if not n.startswith(("PASS", "MISS")):   # verdict() printed those
            print(n)
    write_artifact("bench_precision", rows, {"columns": columns, "notes": notes, "speedups": list(speed.ratios),
                                             "eager_over_sdpa": list(eager.ratios), "loss_rel": loss_rel,
                                             "compiled_over_default": list(compiled.ratios),
                                             "speedups_1_untimed": list(short.ratios),
                                             "kernels_over_aten": {p: list(r.ratios) for p, r in kernels.items()},
                                             "peak_share": share, "args": vars(args)})


def before_after(args: argparse.Namespace, common: list[str], baseline: Path) -> None:
    """The default fp32 and bf16 runs of this checkout (after) and of ``baseline`` (before), side by side."""
    jobs = {f"{p} {side}": ("02_data_parallel.py", common + VARIANTS[p], 1, *([baseline] if side == "before" else []))
            for p in ("fp32", "bf16") for side in ("before", "after")}
    runs = rotating_rounds(jobs, args.repeats, describe=lambda s: (
        f"{s['tokens_per_s']:.0f} real tokens/s, loss {s['final_loss']:.6f}"))
    rows, notes, ratios = [], [], {}
    for name, rs in runs.items():
        rows.append({"run": name, "runs": len(rs), "real tokens/s": statistics.median(s["tokens_per_s"] for s in rs),
                     "min": min(s["tokens_per_s"] for s in rs), "max": max(s["tokens_per_s"] for s in rs),
                     "final loss": rs[0]["final_loss"]})
    for p in ("fp32", "bf16"):
        ratio = paired_rates(runs[f"{p} after"], runs[f"{p} before"], "tokens_per_s")
        ratios[p] = list(ratio.ratios)
        same = runs[f"{p} after"][0]["final_loss"] == runs[f"{p} before"][0]["final_loss"]
        notes += [f"{p}: after / before real tokens/s, paired per repeat: {ratio.describe()}",
                  verdict(f"{p}: after / before real tokens/s (median)", ratio.median, f">= {NO_REGRESSION}",
                          ratio.median >= NO_REGRESSION),
                  f"{p}: final loss after {runs[f'{p} after'][0]['final_loss']:.6f}, before "
                  f"{runs[f'{p} before'][0]['final_loss']:.6f} ({'equal' if same else 'different'})"]
    before = subprocess.run(["git", "rev-parse", "HEAD"], cwd=baseline, capture_output=True, text=True).stdout.strip()
    notes += [f"before: commit {before[:10]} (a checkout of its own); after: this artifact's commit",
              f"every run: {args.steps} timed steps after {args.untimed} untimed, one process, one thread; other jobs "
              "shared the machine (load average above): levels move, the ratios are paired within each repeat"]
    columns = list(rows[0])
    print_table(rows, columns)
    for n in notes:
        if not n.startswith(("PASS", "MISS")):
            print(n)
    write_artifact("bench_precision_ab", rows, {"columns": columns, "notes": notes, "after_over_before": ratios,
                                                "baseline_commit": before, "args": vars(args)})


if __name__ == "__main__":
    main()
