"""Start a script's N ranks by forking one preloaded process, as torchrun's workers would start; for the suite's time.

Why: a 2-process ``torchrun`` of two ``tiny`` steps costs about 16 CPU-seconds, nearly all of it the agent
and both ranks importing torch, transformers and datasets before the first step; the suite launches
scripts dozens of times on 2 cores. The standard library's forkserver imports those modules once per
pytest worker (:data:`PRELOAD`) and forks every rank from that never-used process, so a rank starts
with its imports done.

What is the same as under torchrun:
- the script runs as ``__main__`` with its own argv, in fresh processes that exchange over gloo;
- the worker environment of torch 2.13's local agent (:func:`worker_env`): ``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``TORCHELASTIC_*``, and ``MASTER_ADDR``/``MASTER_PORT`` naming a
  TCPStore this process hosts, as the agent hosts its own (``TORCHELASTIC_USE_AGENT_STORE=True``); the
  store is bound to a port the system chose and held, so no other launch can take the port in between;
- stdout and stderr of all ranks, kept apart; exit status 0, or 1 when a rank fails, and the other
  ranks are then stopped (SIGTERM, then SIGKILL), as torchrun stops them.

:func:`plain` is ``python script args`` the same way: one process forked from that server, without torchrun's
variables, its own exit status.

Restarts (``max_restarts``) follow the agent: a failed attempt stops every rank, and all of them start
again with the next ``TORCHELASTIC_RESTART_COUNT``, on the same store (whose keys a restarted rank must not
mistake for its own: ``ecomkit.dist.restart_safe_rendezvous``).

What torchrun does that this does not: forwarding signals, its own failure report, rendezvous across nodes.
A rank's garbage collections skip the objects it inherits from the server (``gc.freeze``).
Tests of those and ``tests/test_launch.py`` run torchrun itself; the notebooks' kernels launch through this
too (``tests/notebook_launch.py``) but for signals; and
``ECOMKIT_TESTS_TORCHRUN=1 make test`` runs every launch of the suite under torchrun.
Environment variables that a preloaded module reads when it is imported cannot be changed per launch:
:func:`run` refuses them (:data:`READ_AT_IMPORT`, a ValueError), and ``conftest.run_script`` launches
such a run with torchrun instead.
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing as mp
import multiprocessing.connection
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Mapping, Sequence

import torch
import torch.distributed as dist

PRELOAD = ["torch", "transformers.models.bloom.modeling_bloom", "datasets", "peft", "ecomkit.train",
           "ecomkit.config", "ecomkit.metrics"]
# Prefixes of variables these modules read at import (inductor's config, HF's hub and cache settings, ...).
# PYTHONPATH is applied to the rank's sys.path instead.
READ_AT_IMPORT = ("TORCHINDUCTOR_", "TORCH_COMPILE", "TORCHDYNAMO_", "TORCH_LOGS", "HF_", "TRANSFORMERS_",
                  "PYTORCH_", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONFAULTHANDLER", "LD_", "KMP_", "MKL_",
                  "ONEDNN_", "DNNL_", "OMP_PROC_BIND", "GOMP_", "ACCELERATE_", "PEFT_")
# Variables under those prefixes that are read when called, not at import: a rank sees the launch's value,
# since it runs under the launch's environment. Code in a test process sets both (importing deepspeed does
# os.environ.setdefault of the first; inductor's cache_dir() writes its default of the second back), so the
# pytest worker's environment drifts from the forkserver's by them.
READ_AT_CALL = frozenset({"PYTORCH_NVML_BASED_CUDA_CHECK",  # torch.cuda.is_available() reads it each call
                          "TORCHINDUCTOR_CACHE_DIR"})  # torch._inductor.runtime.cache_dir_utils.cache_dir()
TORCHRUN_ENV = "ECOMKIT_TESTS_TORCHRUN"  # "1": every launch runs torchrun itself (slower; for comparison)
# After one rank fails: how long the others may take to end by themselves (ranks that fail together, at the
# same check, each print their own message; torchrun's agent looks every 0.1 s and then spends a while on
# its failure report, which this launcher does not write), then how long they get to end after SIGTERM.
SETTLE_S = 1.0
STOP_GRACE_S = 10.0

_context: mp.context.ForkServerContext | None = None
_server_env: dict[str, str] = {}  # the environment the forkserver imported PRELOAD under


def _forkserver() -> mp.context.ForkServerContext:
    global _context  # one forkserver per pytest worker; it is started, with PRELOAD, by the first launch
    if _context is None:
        _server_env.update(os.environ)
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def server_env() -> dict[str, str]:
    """The environment the forkserver imported PRELOAD under; before it starts, this process's own."""
    return dict(_server_env or os.environ)


def import_time_vars(env: Mapping[str, str]) -> list[str]:
    """The variables a preloaded module reads at import whose value in ``env`` is not the forkserver's."""
    server = server_env()
    names = (set(env) | set(server)) - READ_AT_CALL
    return sorted(k for k in names if k.startswith(READ_AT_IMPORT) and env.get(k) != server.get(k))


def worker_env(base: Mapping[str, str], rank: int, nproc: int, port: int, restart: int = 0,
               max_restarts: int = 0) -> dict[str, str]:
    """What torch 2.13's LocalElasticAgent adds to a worker's environment on one node, at attempt ``restart``."""
    return {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nproc),
            "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "localhost",
            "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": str(restart),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_RUN_ID": f"fastlaunch-{os.getpid()}-{port}", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}


def _rank_main(script: str, argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """One rank, in a process forked from the preloaded server: become ``python script argv`` and run it."""
    # The preloaded modules' objects live as long as the process: leave them out of every garbage collection,
    # as a pre-fork server's children should (a full collection over them costs ~0.3 s, e.g. in ecomkit.dist's
    # teardown); what the script creates is collected as under torchrun.
    gc.freeze()
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR is per test; the server may have cached another
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_APPEND), fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # each line as it is printed, in one write: ranks share a file
    if "OMP_NUM_THREADS" in env:
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = [script, *argv]
    sys.path[0] = str(Path(script).parent)
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        sys.path.insert(1, entry)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a rank's crash is reported like the interpreter would
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # os._exit below skips them; python script.py would run them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(script: str | Path, args: Sequence[str] = (), nproc: int = 2, *, env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None, timeout: float = 300, max_restarts: int = 0) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node N [--max-restarts R] script args``, forked from the preloaded server.

    A failed attempt stops every rank and, while restarts are left, starts them all again with the next
    ``TORCHELASTIC_RESTART_COUNT``, as torchrun's agent does. Returns a CompletedProcess like
    ``subprocess.run(..., capture_output=True, text=True)`` holding every attempt's output; raises
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds in all (the ranks are killed first).
    """
    env = dict(os.environ if env is None else env)
    if os.environ.get(TORCHRUN_ENV) == "1":
        return torchrun(script, args, nproc, env=env, cwd=cwd, timeout=timeout,
                        torchrun_args=("--max-restarts", str(max_restarts)) if max_restarts else ())
    _refuse_import_time_vars(env, "torchrun")
    cmd = ["fastlaunch", "--nproc_per_node", str(nproc), *(["--max-restarts", str(max_restarts)] if max_restarts
                                                           else []), str(Path(script).resolve()), *map(str, args)]
    deadline, outs, errs = time.monotonic() + timeout, [], []
    store = dist.TCPStore("localhost", 0, nproc, is_master=True, wait_for_workers=False)  # kept across restarts
    try:
        for restart in range(max_restarts + 1):
            envs = [worker_env(env, r, nproc, store.port, restart, max_restarts) for r in range(nproc)]
            codes, out, err = _fork(script, args, envs, cwd, deadline - time.monotonic(), cmd)
            outs.append(out)
            errs.append(err)
            if all(c == 0 for c in codes):
                break
    finally:
        del store
    return subprocess.CompletedProcess(cmd, 1 if any(c != 0 for c in codes) else 0, "".join(outs), "".join(errs))


def plain(script: str | Path, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
          cwd: str | Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python script args``: one process forked from the preloaded server, without torchrun's variables.

    The script sees what ``python script args`` gives it (no RANK or WORLD_SIZE, so no process group) and
    the exit status is its own, not torchrun's; only the imports of :data:`PRELOAD` are already done.
    Under ``ECOMKIT_TESTS_TORCHRUN=1`` it runs ``python`` itself.
    """
    env = dict(os.environ if env is None else env)
    cmd = [sys.executable, str(Path(script).resolve()), *map(str, args)]
    if os.environ.get(TORCHRUN_ENV) == "1":
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    _refuse_import_time_vars(env, "python")
    (code,), out, err = _fork(script, args, [env], cwd, timeout, ["fastlaunch", "--plain", *cmd[1:]])
    return subprocess.CompletedProcess(["fastlaunch", "--plain", *cmd[1:]], code, out, err)


def _refuse_import_time_vars(env: Mapping[str, str], instead: str) -> None:
    if stale := import_time_vars(env):
        raise ValueError(f"fastlaunch cannot change {', '.join(stale)} per launch (read at import by a "
                         f"preloaded module); launch this one with {instead}")


def _fork(script: str | Path, args: Sequence[str], envs: list[dict[str, str]], cwd: str | Path | None,
          timeout: float, cmd: list[str]) -> tuple[list[int], str, str]:
    """One process per environment, forked from the preloaded server; their exit codes, stdout and stderr."""
    script = str(Path(script).resolve())
    cwd = str(Path(cwd or Path.cwd()).resolve())
    with tempfile.TemporaryDirectory(prefix="fastlaunch-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        Path(out).touch()
        Path(err).touch()
        ctx = _forkserver()
        procs = [ctx.Process(target=_rank_main, name=f"rank{r}",
                             args=(script, list(map(str, args)), env, cwd, out, err)) for r, env in enumerate(envs)]
        for p in procs:
            p.start()
        _wait(procs, timeout, cmd, out, err)
        return [p.exitcode for p in procs], Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace")


def torchrun(script: str | Path, args: Sequence[str] = (), nproc: int = 2, *, env: Mapping[str, str] | None = None,
             cwd: str | Path | None = None, timeout: float = 300,
             torchrun_args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """The same launch under ``torchrun --standalone [torchrun_args]`` itself: for what needs the agent, and
    for every launch under ``ECOMKIT_TESTS_TORCHRUN=1``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           *torchrun_args, str(Path(script).resolve()), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=None if env is None else dict(env), capture_output=True, text=True,
                          timeout=timeout)


def _wait(procs: list, timeout: float, cmd: list[str], out: str, err: str) -> None:
    """Wait for every rank; on the first failure stop the rest, on the timeout kill all."""
    deadline = time.monotonic() + timeout
    failed = False
    while any(p.exitcode is None for p in procs):
        left = deadline - time.monotonic()
        if left <= 0:
            _stop(procs, signal.SIGKILL, 0)
            raise subprocess.TimeoutExpired(cmd, timeout, Path(out).read_text(errors="replace"),
                                            Path(err).read_text(errors="replace"))
        mp.connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=min(left, 1.0))
        if not failed and any(p.exitcode not in (None, 0) for p in procs):
            failed = True
            _settle(procs, SETTLE_S)
            _stop(procs, signal.SIGTERM, STOP_GRACE_S)


def _settle(procs: list, seconds: float) -> None:
    """Wait up to ``seconds`` for the ranks still running to end by themselves."""
    until = time.monotonic() + seconds
    while any(p.exitcode is None for p in procs) and time.monotonic() < until:
        mp.connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=until - time.monotonic())


def _stop(procs: list, sig: int, grace: float) -> None:
    """Send ``sig`` to the ranks still running; SIGKILL those still there ``grace`` seconds later."""
    for p in procs:
        if p.exitcode is None:
            os.kill(p.pid, sig)
    for p in procs:
        p.join(grace or None)
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGKILL)
            p.join()
