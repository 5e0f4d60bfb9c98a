"""What a run loads of a package: its modules and their lines, read from ``python -X importtime``.

Why a helper without ecomkit: the measurement must not load what it measures. A script runs in a fresh
interpreter under ``-X importtime`` (one process, or ``torchrun --no-python`` with every rank's stderr in its own
file); each rank's report names every module it imported, once, at its first import, over the whole run. The
lines are those of each module's file (a package: its ``__init__.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ImportCost:
    """The package modules one process imported, and their lines."""

    modules: frozenset[str]
    lines: int
    lab: frozenset[str] = frozenset()   # the modules of ``ecomlab`` it imported (a training run: none)

    def loaded(self, prefix: str) -> list[str]:
        """The modules at or under ``prefix`` (``ecomkit.parallel.zero``: the package and its modules)."""
        return sorted(m for m in self.modules if m == prefix or m.startswith(prefix + "."))


def imported_modules(report: str, package: str = "ecomkit") -> frozenset[str]:
    """The modules of ``package`` named in a ``-X importtime`` report (``import time: self | cumulative | name``)."""
    found = set()
    for line in report.splitlines():
        if not line.startswith("import time:") or line.count("|") < 2:
            continue
        name = line.rsplit("|", 1)[1].strip()
        if name == package or name.startswith(package + "."):
            found.add(name)
    return frozenset(found)


def module_file(name: str, root: Path = REPO) -> Path:
    """The file of module ``name`` under ``root``: ``a/b.py``, or ``a/b/__init__.py`` for a package."""
    path = root.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def cost(modules: Iterable[str], root: Path = REPO, lab: Iterable[str] = ()) -> ImportCost:
    modules = frozenset(modules)
    lines = sum(len(module_file(m, root).read_text(encoding="utf-8").splitlines()) for m in modules)
    return ImportCost(modules, lines, frozenset(lab))


def report_cost(report: str) -> ImportCost:
    """The ecomkit cost of one ``-X importtime`` report, with the ``ecomlab`` modules it names."""
    return cost(imported_modules(report), lab=imported_modules(report, "ecomlab"))


def run_script(script: str | Path, args: Sequence[str], nproc: int = 0, env: Mapping[str, str] | None = None,
               workdir: Path | None = None, timeout: float = 600) -> list[ImportCost]:
    """Run ``script`` under ``-X importtime``, one process (``nproc=0``) or ``nproc`` torchrun ranks; each rank's
    cost (one entry per process). Raises with the output when the run fails."""
    env = {**os.environ, **(env or {})}
    if nproc:
        logs = (Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="importtime-"))) / "importtime-logs"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               "--log-dir", str(logs), "--redirects", "2", "--no-python",
               sys.executable, "-X", "importtime", str(script), *args]
    else:
        cmd = [sys.executable, "-X", "importtime", str(script), *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
                             f"--- stderr\n{proc.stderr[-5000:]}")
    if not nproc:
        return [report_cost(proc.stderr)]
    reports = sorted(logs.rglob("stderr.log"), key=lambda p: int(p.parent.name))   # .../attempt_0/<rank>/stderr.log
    return [report_cost(p.read_text(encoding="utf-8", errors="replace")) for p in reports]


def python_import(module: str, env: Mapping[str, str] | None = None) -> ImportCost:
    """What ``import module`` alone loads in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr[-3000:])
    return report_cost(proc.stderr)


def fresh_python(code: str) -> str:
    """What ``python -c code`` prints in a fresh interpreter (e.g. whether a module is in ``sys.modules``)."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr[-3000:])
    return proc.stdout


if __name__ == "__main__":   # python tests/import_cost.py [--nproc N] SCRIPT ARGS...: print what each rank loaded
    argv = sys.argv[1:]
    n = int(argv[1]) if argv[:1] == ["--nproc"] else 0
    script, rest = (argv[2], argv[3:]) if n else (argv[0], argv[1:])
    for rank, c in enumerate(run_script(script, rest, n)):
        print(f"rank {rank}: {len(c.modules)} modules, {c.lines:,} lines")
        for m in sorted(c.modules):
            print(f"  {len(module_file(m).read_text(encoding='utf-8').splitlines()):5d} {m}")
