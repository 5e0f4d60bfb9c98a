"""``--compile`` on a CPU: how long the first step compiles, and whether a compiled step is faster, per mode.

The issue's questions: regional compilation (``fast/compile.py``: one BLOOM
block compiled for every block, the head + loss apart) should keep compile
time from growing with depth, and a compile mode should be offered where it
measures faster. This runs ``scripts/02_data_parallel.py`` in one process on
the catalog job with packing on (one shape every step, so nothing recompiles
after the first step), for each model and each case:

- ``plain``: no ``--compile``;
- ``compile``: ``--compile`` (``--compile-mode default``);
- ``compile max-autotune-no-cudagraphs``: inductor also tunes its kernels.

(``reduce-overhead`` is CUDA graphs: nothing to measure on a CPU.) Every run
starts with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR``), as a user's
first run does. Compile time is the first step's time minus the steady step
time, as gpu_bench's compile row takes it. Speed is real tokens/s over the
steady steps; rounds rotate the order of the cases and a ratio is taken
within a round. A mode is "faster" when its median paired ratio over plain is
at least ``FASTER`` (and every round agrees it is above 1).

    python benchmarks/bench_compile.py [--models tiny small] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from typing import Any
from unittest import mock

from common import rotation, write_artifact
from gpu_jobs import measured, run_script

CASES = {"plain": None, "compile": "default",      # case -> its --compile-mode (None: no --compile)
         "compile max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs"}
COLUMNS = ["model", "case", "round", "first_step_s", "compile_s", "step_time_s", "tokens_per_s", "final_loss"]
HEADERS = ["model", "case", "round", "first step (s)", "compiling (s)", "steady step (s)", "real tokens/s",
           "final loss"]
FASTER = 1.05       # a compiled case is offered when it is at least 5 % faster than plain, in every round above 1
TIMEOUT_S = 1200.0  # one run (max-autotune tunes on the CPU for a while)


def run_args(model: str, steps: int, untimed: int, rows: int) -> list[str]:
    return ["--model", model, "--packing", "on", "--n-rows", str(rows), "--max-steps", str(steps),
            "--untimed-steps", str(untimed), "--log-interval", "1", "--eval-interval", "0", "--eval-batches", "1",
            "--final-eval-samples", "8", "--no-save-model", "--no-progress", "--report-to", "none"]


def one_run(model: str, case: str, args: list[str]) -> dict[str, Any]:
    """One script run with a cold inductor cache; the row with its first step, steady step and tokens/s."""
    mode = CASES[case]
    row = {"model": model, "case": case, "compile_mode": mode}
    flags = [] if mode is None else ["--compile", "--compile-mode", mode]
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache, \
            mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}):   # gpu_jobs' launch passes it on
        done = run_script(row, 1, "02_data_parallel.py", [*args, *flags], TIMEOUT_S)
    if done["status"] != "ok":
        return done
    r = measured(done)
    r["compile_s"] = r["first_step_s"] - r["step_time_s"] if case != "plain" else None
    return r


def verdicts(rows: list[dict[str, Any]], models: list[str]) -> list[dict[str, Any]]:
    """Per model and compiled case: the paired speed ratio over plain, and whether the mode is worth offering."""
    out = []
    for model in models:
        ok = [r for r in rows if r["model"] == model and r["status"] == "ok"]
        plain = {r["round"]: r["tokens_per_s"] for r in ok if r["case"] == "plain"}
        for case in [c for c in CASES if c != "plain"]:
            runs = [r for r in ok if r["case"] == case and r["round"] in plain]
            if not runs:
                continue
            ratios = [r["tokens_per_s"] / plain[r["round"]] for r in runs]
            median = statistics.median(ratios)
            out.append({"model": model, "case": case, "speed_vs_plain": median, "ratios": ratios,
                        "compile_s_median": statistics.median(r["compile_s"] for r in runs),
                        "faster": median >= FASTER and min(ratios) > 1.0})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"], help="model presets to compile")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of every case (order rotating)")
    parser.add_argument("--steps", type=int, default=40, help="steps per run")
    parser.add_argument("--untimed", type=int, default=10, help="first steps left out of the steady figures")
    parser.add_argument("--rows", type=int, default=2000, help="catalog rows")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for model in args.models:
        run = run_args(model, args.steps, args.untimed, args.rows)
        for rnd in range(args.repeats):
            for case in rotation(list(CASES), rnd):
                row = {**one_run(model, case, run), "round": rnd}
                rows.append(row)
                if row["status"] == "ok":
                    extra = "" if row["compile_s"] is None else f", compiling {row['compile_s']:.1f} s"
                    print(f"  {model} round {rnd + 1}: {case}: {row['tokens_per_s']:,.0f} tokens/s, first step "
                          f"{row['first_step_s']:.2f} s, steady {row['step_time_s'] * 1000:.1f} ms{extra}", flush=True)
                else:
                    print(f"  {model} round {rnd + 1}: {case}: {row['status']}: {row.get('reason')}", flush=True)
    table = verdicts(rows, args.models)
    notes = [f"{v['model']} {v['case']}: {v['speed_vs_plain']:.2f}x plain's real tokens/s (rounds "
             f"{', '.join(f'{x:.2f}' for x in v['ratios'])}), compiling {v['compile_s_median']:.1f} s (median): "
             f"{'faster' if v['faster'] else 'not faster'} (goal >= {FASTER}x in the median, > 1 in every round)"
             for v in table]
    print("\n".join(notes))
    write_artifact("bench_compile", rows, {
        "verdicts": table, "faster_goal": FASTER, "notes": notes, "columns": COLUMNS, "headers": HEADERS,
        "settings": {k: getattr(args, k) for k in ("models", "repeats", "steps", "untimed", "rows")}})


if __name__ == "__main__":
    main()
