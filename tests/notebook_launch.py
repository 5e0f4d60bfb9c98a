"""The suite's notebook kernels launch chapter scripts from the pytest worker's forkserver (:mod:`fastlaunch`).

Why: a notebook's ``run_torchrun`` starts torchrun's agent and N ranks, each importing torch and transformers
(about 4 CPU-seconds a process); the chapters launch about 30 jobs in all, on 2 cores shared with a second
pytest worker. :func:`install` replaces ``ecomkit.launch.run_torchrun`` and ``run_python`` in the kernel with
the same launch forked from a preloaded server, as ``conftest.run_script`` does for the scripts' tests. The
server is the pytest worker's own: the kernel sends each launch to the worker (:func:`serve`, a thread on a
local socket), so no kernel pays for importing a server of its own.

Restarts (``max_restarts``) are fastlaunch's, as torchrun's agent makes them. A launch keeps the real path
when it needs it: a variable a preloaded module reads at import, or ``ECOMKIT_TESTS_TORCHRUN=1`` (every
launch under torchrun itself); chapter 07's signals go to torchrun's agent through their own helpers.
The result is what the real helper returns: every rank's output in ``stdout`` (stdout, then stderr), printed
unless the call asked for quiet, and :class:`~ecomkit.errors.EcomkitError` with the output's tail when a rank
fails.
"""

from __future__ import annotations

import atexit
import multiprocessing.connection as mpc
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import fastlaunch

import ecomkit.launch as launch
from ecomkit.errors import EcomkitError

NO_TIMEOUT_S = 3600.0   # the real helpers wait without a limit when given None
STARTUP_FILE = "00-ecomkit-fastlaunch.py"
SERVICE_ENV = "ECOMKIT_TESTS_LAUNCH_SERVICE"   # "<socket path> <hex key>" of the pytest worker's launch thread
ORIGINAL = {"run_torchrun": launch.run_torchrun, "run_python": launch.run_python}


def run_torchrun(script: str | Path, args: Sequence[str] = (), nproc: int = 2, *,
                 env: Mapping[str, str] | None = None, timeout: float | None = None,
                 max_restarts: int = 0, live: bool = True) -> subprocess.CompletedProcess:
    """``launch.run_torchrun``'s launch, forked from the preloaded server unless it needs torchrun itself."""
    job = _job(script, args, nproc, env, timeout, max_restarts)
    result = _as_launch_result(job, live) if job else None
    if result is None:
        return ORIGINAL["run_torchrun"](script, args, nproc, env=env, timeout=timeout, max_restarts=max_restarts,
                                        live=live)
    return result


def run_python(script: str | Path, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
               timeout: float | None = None, live: bool = True) -> subprocess.CompletedProcess:
    """``launch.run_python``'s process, forked from the preloaded server unless it needs python itself."""
    job = _job(script, args, 0, env, timeout)
    result = _as_launch_result(job, live) if job else None
    if result is None:
        return ORIGINAL["run_python"](script, args, env=env, timeout=timeout, live=live)
    return result


def _job(script: str | Path, args: Sequence[str], nproc: int, env: Mapping[str, str] | None, timeout: float | None,
         max_restarts: int = 0) -> dict[str, Any] | None:
    """What fastlaunch is to run (``nproc`` ranks, or 0: ``python``), or None when the launch needs the real one."""
    merged = launch.child_env(env)
    if os.environ.get(fastlaunch.TORCHRUN_ENV) == "1" or fastlaunch.import_time_vars(merged):
        return None
    root = launch.repo_root()
    return {"script": str(launch._resolve_script(script, root)), "args": [str(a) for a in args], "nproc": nproc,
            "env": merged, "cwd": str(root), "timeout": timeout or NO_TIMEOUT_S, "max_restarts": max_restarts}


def _forked(job: dict[str, Any]) -> subprocess.CompletedProcess | None:
    """The job run by the pytest worker when it serves (else here); None when its forkserver cannot take it."""
    if not os.environ.get(SERVICE_ENV):
        return _run(job)
    address, key = os.environ[SERVICE_ENV].split()
    with mpc.Client(address, family="AF_UNIX", authkey=bytes.fromhex(key)) as conn:
        conn.send(job)
        reply = conn.recv()
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _run(job: dict[str, Any]) -> subprocess.CompletedProcess | None:
    if fastlaunch.import_time_vars(job["env"]):   # this forkserver imported under other values of them
        return None
    common = {"env": job["env"], "cwd": job["cwd"], "timeout": job["timeout"]}
    if job["nproc"]:
        return fastlaunch.run(job["script"], job["args"], job["nproc"], max_restarts=job["max_restarts"], **common)
    return fastlaunch.plain(job["script"], job["args"], **common)


def serve() -> str:
    """Run kernels' launches in this process, from its forkserver, on a thread; the ``SERVICE_ENV`` value."""
    key = secrets.token_bytes(16)
    folder = tempfile.mkdtemp(prefix="ecomkit-launch-")
    atexit.register(shutil.rmtree, folder, True)
    listener = mpc.Listener(os.path.join(folder, "socket"), family="AF_UNIX", authkey=key)
    atexit.register(listener.close)   # before the folder goes: it removes its socket file
    threading.Thread(target=_serve_forever, args=(listener,), name="notebook-launches", daemon=True).start()
    return f"{listener.address} {key.hex()}"


def _serve_forever(listener: mpc.Listener) -> None:
    while True:
        try:
            conn = listener.accept()
        except OSError:   # closed at exit
            return
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


def _serve_one(conn: mpc.Connection) -> None:
    with conn:
        job = conn.recv()
        try:
            reply: Any = _run(job)
        except Exception as exc:  # noqa: BLE001 - the kernel raises it, as a launch of its own would
            reply = exc
        conn.send(reply)


def _as_launch_result(job: dict[str, Any], live: bool) -> subprocess.CompletedProcess | None:
    """The real helper's result: one output text, printed when ``live``, checked as ``launch._check`` does."""
    try:
        proc = _forked(job)
    except subprocess.TimeoutExpired as exc:
        raise EcomkitError(f"{' '.join(exc.cmd)} did not finish within {exc.timeout} s and was killed. "
                           f"Last output:\n{launch._tail((exc.output or '') + (exc.stderr or ''))}") from None
    if proc is None:
        return None
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
