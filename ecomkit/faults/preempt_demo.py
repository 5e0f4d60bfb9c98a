"""Preempt a real torchrun job at a chosen step, the way a cluster does (chapter 07 and the tests).

Once step ``at_step`` is logged, ``signum`` goes to the agent (which forwards it) or to one worker. The workers are
paused with SIGSTOP around it, since a tiny model could finish before the signal lands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import psutil

from ecomkit.errors import EcomkitError
from ecomkit.launch import child_env, repo_root


@dataclass
class PreemptedRun:
    """What one preempted launch did: its exit status, output, and who got the signal."""

    returncode: int
    stdout: str              # stdout and stderr of every rank, merged (as run_torchrun's result)
    signalled: str           # "agent" or "rank R"
    signal_name: str
    signalled_after_step: int


def last_logged_step(metrics: Path) -> int:
    """The step of the newest train row in ``metrics.jsonl`` (0 when there is none yet)."""
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # the line being written right now
        if row.get("type") == "train":
            steps.append(int(row["step"]))
    return steps[-1]


def worker_pids(agent_pid: int) -> dict[int, int]:
    """``{rank: pid}`` of the agent's worker processes, read from their environment (RANK)."""
    out = {}
    for child in psutil.Process(agent_pid).children(recursive=False):
        try:
            rank = child.environ().get("RANK")
        except (psutil.Error, OSError):
            continue
        if rank is not None:
            out[int(rank)] = child.pid
    return out


def run_preempted(script: str | Path, args: Sequence[str], output_dir: str | Path, at_step: int,
                  signum: int = signal.SIGTERM, rank: int | None = None, nproc: int = 2,
                  torchrun_args: Sequence[str] = (), timeout: float = 300, live: bool = False) -> PreemptedRun:
    """Launch, signal the agent (``rank=None``) or one worker once step ``at_step`` is logged, wait for the end."""
    root = repo_root()
    metrics = Path(output_dir) / "metrics.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           *map(str, torchrun_args), str(root / script), *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=root, env=child_env(None), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, errors="replace", start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if live:
                print(line, end="", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while last_logged_step(metrics) < at_step:
            if proc.poll() is not None:
                raise EcomkitError(f"the job ended (status {proc.returncode}) before step {at_step} was logged:\n"
                                   + "".join(lines[-40:]))
            if time.monotonic() > deadline:
                raise EcomkitError(f"step {at_step} was not logged within {timeout} s:\n" + "".join(lines[-40:]))
            time.sleep(0.005)
        workers = worker_pids(proc.pid)
        for pid in workers.values():
            os.kill(pid, signal.SIGSTOP)
        seen = last_logged_step(metrics)
        os.kill(proc.pid if rank is None else workers[rank], signum)
        time.sleep(0.3)  # the agent forwards its signal to the (paused) workers
        for pid in workers.values():
            os.kill(pid, signal.SIGCONT)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
    return PreemptedRun(proc.returncode, "".join(lines), "agent" if rank is None else f"rank {rank}",
                        signal.Signals(signum).name, seen)


__all__ = ["PreemptedRun", "last_logged_step", "run_preempted", "worker_pids"]
