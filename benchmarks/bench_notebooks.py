#!/usr/bin/env python
"""How long each chapter takes to run: ``pytest --nbmake`` per notebook, the figure its introduction states.

Each notebook runs top to bottom as ``make test`` runs it (one process, nbmake, the notebook's own torchrun
launches). With ``--baseline REF`` the same notebooks of an earlier commit (extracted with ``git archive``) run
too, alternating with the current ones notebook by notebook, so a change's cost is measured side by side on the
same machine at the same load. The chapters' "Running time" lines are the current rows' medians, in minutes
(:func:`stated_minutes`; ``tests/test_lessons_order.py`` holds each to the newest artifact in which it passed).

    python benchmarks/bench_notebooks.py [--notebooks 01_environment 02_data_parallel] [--repeats 1]
                                         [--baseline 2f4884f] [--cell-timeout 900]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, bench_env, print_table, write_artifact

CHAPTERS = ("01_environment", "02_data_parallel", "05_gradient_compression", "06_memory_tuning",
            "07_troubleshooting", "08_tasks")


def stated_minutes(seconds: float) -> int:
    """The whole minutes an introduction states for a run of ``seconds`` (at least 1)."""
    return max(1, round(seconds / 60))


def run_notebook(root: Path, name: str, cell_timeout: int | None = None) -> dict:
    """One ``pytest --nbmake`` of ``notebooks/<name>.ipynb`` in the tree at ``root``: seconds and pass/fail."""
    env = {**bench_env(), "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbmake", f"notebooks/{name}.ipynb",
           *([f"--nbmake-timeout={cell_timeout}"] if cell_timeout else [])]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stdout[-3000:], file=sys.stderr)
    return {"seconds": round(seconds, 1), "passed": proc.returncode == 0}


def extract(ref: str, into: Path) -> Path:
    """The tree of commit ``ref``, written under ``into`` (``git archive``: tracked files only)."""
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--notebooks", nargs="+", default=list(CHAPTERS), help="notebook names, without .ipynb")
    p.add_argument("--repeats", type=int, default=1, help="runs of each notebook (per tree)")
    p.add_argument("--baseline", default=None, help="a commit whose notebooks run alternately with these")
    p.add_argument("--cell-timeout", type=int, default=None,
                   help="seconds a cell may take (nbmake's own limit, 300, when not given; a busy machine needs more)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-notebooks-") as tmp:
        trees = {"current": REPO}
        if args.baseline:
            trees = {"baseline": extract(args.baseline, Path(tmp)), **trees}
        rows = []
        for r in range(args.repeats):
            for name in args.notebooks:
                for tree, root in (trees.items() if r % 2 == 0 else reversed(trees.items())):
                    row = {"notebook": name, "tree": tree, "repeat": r, **run_notebook(root, name, args.cell_timeout)}
                    print(row, flush=True)
                    rows.append(row)
    summary = []
    for name in args.notebooks:
        med = {t: statistics.median(x["seconds"] for x in rows if x["notebook"] == name and x["tree"] == t)
               for t in trees}
        summary.append({"notebook": name, **{f"{t}_s": s for t, s in med.items()},
                        "stated_minutes": stated_minutes(med["current"]),
                        **({"current/baseline": round(med["current"] / med["baseline"], 2)} if "baseline" in med else {}),
                        "passed": all(x["passed"] for x in rows if x["notebook"] == name)})
    print_table(summary, list(summary[0]))
    write_artifact("bench_notebooks", rows, {"summary": summary, "baseline": args.baseline})
    if not all(s["passed"] for s in summary):
        raise SystemExit("a notebook failed: see the output above")


if __name__ == "__main__":
    main()
