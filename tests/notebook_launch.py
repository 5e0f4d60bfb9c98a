"""The suite's notebook kernels launch chapter scripts from the preloaded forkserver (:mod:`fastlaunch`).

Why: a notebook's ``run_torchrun`` starts torchrun's agent and N ranks, each importing torch and transformers
(about 4 CPU-seconds a process); the chapters launch about 30 jobs in all, on 2 cores shared with a second
pytest worker. :func:`install` replaces ``ecomkit.launch.run_torchrun`` and ``run_python`` in the kernel with
the same launch forked from one preloaded server, as ``conftest.run_script`` does for the scripts' tests.

Restarts (``max_restarts``) are fastlaunch's, as torchrun's agent makes them. A launch keeps the real path
when it needs it: a variable a preloaded module reads at import, or ``ECOMKIT_TESTS_TORCHRUN=1`` (every
launch under torchrun itself); chapter 07's signals go to torchrun's agent through their own helpers. The result is what
the real helper returns: every rank's output in ``stdout`` (stdout, then stderr), printed unless the call
asked for quiet, and :class:`~ecomkit.errors.EcomkitError` with the output's tail when a rank fails.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

import fastlaunch

import ecomkit.launch as launch
from ecomkit.errors import EcomkitError

NO_TIMEOUT_S = 3600.0   # the real helpers wait without a limit when given None
STARTUP_FILE = "00-ecomkit-fastlaunch.py"
ORIGINAL = {"run_torchrun": launch.run_torchrun, "run_python": launch.run_python}


def run_torchrun(script: str | Path, args: Sequence[str] = (), nproc: int = 2, *,
                 env: Mapping[str, str] | None = None, timeout: float | None = None,
                 max_restarts: int = 0, live: bool = True) -> subprocess.CompletedProcess:
    """``launch.run_torchrun``'s launch, forked from the preloaded server unless it needs torchrun itself."""
    merged = launch.child_env(env)
    if _needs_real_launcher(merged):
        return ORIGINAL["run_torchrun"](script, args, nproc, env=env, timeout=timeout, max_restarts=max_restarts,
                                        live=live)
    root = launch.repo_root()
    return _as_launch_result(lambda: fastlaunch.run(launch._resolve_script(script, root), args, nproc, env=merged,
                                                    cwd=root, timeout=timeout or NO_TIMEOUT_S,
                                                    max_restarts=max_restarts), live)


def run_python(script: str | Path, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
               timeout: float | None = None, live: bool = True) -> subprocess.CompletedProcess:
    """``launch.run_python``'s process, forked from the preloaded server unless it needs python itself."""
    merged = launch.child_env(env)
    if _needs_real_launcher(merged):
        return ORIGINAL["run_python"](script, args, env=env, timeout=timeout, live=live)
    root = launch.repo_root()
    return _as_launch_result(lambda: fastlaunch.plain(launch._resolve_script(script, root), args, env=merged,
                                                      cwd=root, timeout=timeout or NO_TIMEOUT_S), live)


def _needs_real_launcher(env: Mapping[str, str]) -> bool:
    return os.environ.get(fastlaunch.TORCHRUN_ENV) == "1" or bool(fastlaunch.import_time_vars(env))


def _as_launch_result(start: Callable[[], subprocess.CompletedProcess], live: bool) -> subprocess.CompletedProcess:
    """The real helper's result: one output text, printed when ``live``, checked as ``launch._check`` does."""
    try:
        proc = start()
    except subprocess.TimeoutExpired as exc:
        raise EcomkitError(f"{' '.join(exc.cmd)} did not finish within {exc.timeout} s and was killed. "
                           f"Last output:\n{launch._tail((exc.output or '') + (exc.stderr or ''))}") from None
    out = proc.stdout + proc.stderr
    if live:
        print(out, end="", flush=True)
    return launch._check(subprocess.CompletedProcess(proc.args, proc.returncode, stdout=out, stderr=""))


def install() -> None:
    """Replace the launch helpers in this process (a kernel): later ``from ecomkit.launch import`` gets these."""
    launch.run_torchrun, launch.run_python = run_torchrun, run_python


def kernel_profile(tests_dir: Path) -> Path:
    """An IPYTHONDIR whose startup file installs these helpers in every kernel started under it."""
    root = Path(tempfile.mkdtemp(prefix="ecomkit-ipython-"))
    atexit.register(shutil.rmtree, root, True)
    startup = root / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / STARTUP_FILE).write_text(f"import sys\nsys.path.insert(0, {str(tests_dir)!r})\n"
                                        "import notebook_launch\nnotebook_launch.install()\n")
    return root
