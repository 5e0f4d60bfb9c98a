"""Shared helpers for benchmarks: run a chapter script, read its summary, print a ratio table.

Every benchmark measures all of its variants side by side in one run, on
this machine, and prints ratios; nothing is read from earlier runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]


def bench_env(threads: int = 1) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
    return env


def run_summary(script: str, args: Sequence[str], nproc: int = 1, threads: int = 1,
                out_dir: str | None = None) -> dict[str, Any]:
    """Run ``scripts/<script>`` (plain python for nproc=1, torchrun otherwise) and return its summary.json."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="ecomkit-bench-"))
    script_path = str(REPO / "scripts" / script)
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               script_path]
    else:
        cmd = [sys.executable, script_path]
    cmd += [*args, "--output-dir", str(out), "--no-progress"]
    proc = subprocess.run(cmd, cwd=REPO, env=bench_env(threads), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


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
