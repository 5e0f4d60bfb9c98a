"""Shared helpers for benchmarks: run a chapter script, read its summary, print a ratio table, write an artifact.

Every benchmark measures all of its variants side by side in one run, on
this machine, and prints ratios; nothing is read from earlier runs. Each run
ends with ``write_artifact``: ``benchmarks/results/<bench>-<yyyy-mm-dd>-<machine>.json``
holds the command, the commit, the machine facts, the load average before and
after, and the raw rows; ``benchmarks/report.py`` renders the docs' tables
from the newest artifact of each benchmark.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ecomkit.hardware import NO_BF16_UNITS, cpu_bf16_units
from ecomlab.rates import PairedRatio, paired_ratios, pooled_rate

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
# Read once when the benchmark module imports this file: the load average "before" the run.
_LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else None


def bench_env(threads: int = 1) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
    return env


def run_summary(script: str, args: Sequence[str], nproc: int = 1, threads: int = 1,
                out_dir: str | None = None, root: Path = REPO) -> dict[str, Any]:
    """Run ``scripts/<script>`` (plain python for nproc=1, torchrun otherwise) and return its summary.json.

    ``root``: the checkout whose script and ``ecomkit`` run (another commit's, to compare it with this one).
    """
    out = Path(out_dir or tempfile.mkdtemp(prefix="ecomkit-bench-"))
    script_path = str(root / "scripts" / script)
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               script_path]
    else:
        cmd = [sys.executable, script_path]
    cmd += [*args, "--output-dir", str(out), "--no-progress"]
    env = bench_env(threads) if root == REPO else {**bench_env(threads), "PYTHONPATH": str(root)}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def rotation(names: Sequence[str], r: int) -> list[str]:
    """``names`` in round ``r``'s order: starting one later each round (see :func:`rotating_rounds`)."""
    names = list(names)
    return names[r % len(names):] + names[:r % len(names)]


def rotating_rounds(jobs: dict[str, tuple], repeats: int,
                    after_round: Callable[[dict[str, list[dict]]], None] | None = None,
                    describe: Callable[[dict], str] = lambda s: f"{s['samples_per_s']:.1f} samples/s"
                    ) -> dict[str, list[dict]]:
    """``repeats`` rounds of every job (script, args, processes[, checkout root]), the start rotating by one job
    each round.

    Rotating cancels a drift of the machine's speed within the benchmark instead
    of charging it to one job, and a ratio of two jobs' rates is paired within
    a round. ``after_round(runs)`` runs after each round (a ceiling measurement);
    ``describe(summary)`` is the progress line's account of each run.
    """
    names = list(jobs)
    runs: dict[str, list[dict]] = {k: [] for k in names}
    for r in range(repeats):
        for name in rotation(names, r):
            script, args, nproc, *root = jobs[name]
            runs[name].append(run_summary(script, args, nproc=nproc, root=Path(root[0]) if root else REPO))
            print(f"  round {r + 1}/{repeats}: {name}: {describe(runs[name][-1])}", flush=True)
        if after_round is not None:
            after_round(runs)
    return runs


def paired_rates(numerator_runs: list[dict], denominator_runs: list[dict], key: str = "samples_per_s") -> PairedRatio:
    """Each run's ``key`` rate over its partner's, pair by pair (the runs of one round, as the benchmarks pair them)."""
    return paired_ratios([r[key] for r in numerator_runs], [r[key] for r in denominator_runs])


def pooled_row(name: str, runs: list[dict]) -> dict:
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


def print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return "-" if v is None else str(v)


def verdict(name: str, value: float, goal: str, ok: bool) -> str:
    line = f"{'PASS' if ok else 'MISS'}  {name}: {value:.2f} (goal {goal})"
    print(line)
    return line


def failure_reason(proc: subprocess.CompletedProcess) -> str:
    """The rank's own message (ecomkit prints '[rank N] error: ...') rather than torchrun's generic summary."""
    lines = (proc.stderr + "\n" + proc.stdout).strip().splitlines()
    own = [l.strip() for l in lines if re.match(r"\[rank \d+\] error:", l.strip())]
    if own:
        return own[0]
    errors = [l.strip() for l in lines if re.search(r"(Error|error)[:\s]", l) and "elastic" not in l]
    return errors[-1] if errors else " | ".join(lines[-3:]) or "no output"


# -- artifacts -----------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu_name() -> str | None:
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken CUDA set-up means "no GPU" for the facts
        return None
    return None


def machine_slug(facts: dict[str, Any]) -> str:
    """Short name of the machine for artifact file names: the GPU (``h100-80gb-hbm3``) or ``cpu<cores>``."""
    if facts.get("gpu"):
        return re.sub(r"[^a-z0-9]+", "-", facts["gpu"].lower().replace("nvidia", "")).strip("-")
    return f"cpu{facts['cores']}"


def machine_facts() -> dict[str, Any]:
    """What a reader needs to judge a number: CPU model, cores, GPU, OS and library versions, commit."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "cpu_bf16_units": cpu_bf16_units(),
        "gpu": _gpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("torch", "transformers", "deepspeed", "accelerate")},
        "commit": commit,
        "dirty": dirty,
    }


def warn_emulated_bf16(precisions: Sequence[str], how_to_skip: str) -> None:
    """Say so before a CPU benchmark runs bf16 on a CPU without bf16 matmul units (it would take hours, silently)."""
    if "bf16" in precisions and not _gpu_name() and cpu_bf16_units() is False:
        print(f"WARNING: this CPU has {NO_BF16_UNITS}: its bf16 runs are converted, tens of times slower "
              f"than fp32, and this benchmark's bf16 part may take hours. "
              f"{how_to_skip}", file=sys.stderr, flush=True)


def write_artifact(bench: str, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None,
                   results_dir: str | Path | None = None) -> Path:
    """Write ``<results_dir>/<bench>-<yyyy-mm-dd>-<machine>.json`` and return its path.

    ``rows`` are the raw measurements (one dict per variant), ``extra`` anything else the report needs
    (settings, ratios, verdicts). The command line, the machine facts and the load average when this
    module was imported and now are added here, so every benchmark records them the same way.
    """
    facts = machine_facts()
    now = _dt.datetime.now(_dt.timezone.utc)
    doc = {
        "bench": bench,
        "date": now.strftime("%Y-%m-%d"),
        "time_utc": now.isoformat(timespec="seconds"),
        "command": " ".join(["python", os.path.relpath(sys.argv[0], REPO) if sys.argv[0] else "-", *sys.argv[1:]]),
        "machine": machine_slug(facts),
        **facts,
        "load_before": list(_LOAD_AT_START) if _LOAD_AT_START else None,
        "load_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "rows": rows,
        "extra": extra or {},
    }
    out_dir = Path(results_dir) if results_dir is not None else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{bench}-{doc['date']}-{doc['machine']}.json"
    for k in range(2, 1000):     # a second run on the same day keeps the first one's file
        if not path.exists():
            break
        path = out_dir / f"{bench}-{doc['date']}-{doc['machine']}-{k}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"artifact: {os.path.relpath(path, REPO) if path.is_relative_to(REPO) else path}")
    return path
