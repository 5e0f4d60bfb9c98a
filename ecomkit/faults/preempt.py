"""Preemption: the signals a cluster sends before it takes a job back, and the record a rerun resumes from.

SLURM sends SIGTERM (or the signal of ``--signal=USR1@90``, 90 s before the
end), Kubernetes and spot instances SIGTERM, and then kill the job after a
grace period. :class:`PreemptionSignals` turns such a signal into a request
(a flag), never into an exception: the current optimizer step finishes, the
ranks agree on the step to stop at (the flag rides on the step's count
all-reduce, :meth:`ecomkit.train.loop.TrainingRun._reduce_counts`), a
checkpoint is written at that step, and the process exits with
:data:`PREEMPTED_EXIT_CODE`. A second signal while the checkpoint is written
is counted and ignored, so it cannot interrupt the save.

SIGUSR1 keeps printing the Python stacks (:func:`ecomkit.dist.install_stack_dump_signal`):
while this handler is installed, it prints them itself (``faulthandler.dump_traceback``, from Python, in the
main thread) and asks for a checkpoint. It does not chain faulthandler's C-level handler: that one walks the
frames at any instruction, and under SLURM, which signals every process of the step while the agent forwards
the signal too, a rank was seen dying mid-dump inside a data-loader frame, without a checkpoint. Restored, the
C-level dump comes back for hung ranks. ``--fault-preempt-signals ""`` leaves both signals as they were.

The record (``preempted.json`` in the checkpoint folder, written last and
atomically by rank 0) names the checkpoint. Its presence is what makes the
same command, rerun, resume there even when no periodic checkpoints were
asked for; a run that finishes removes it, so a later rerun starts fresh.
The training callback is :class:`ecomkit.train.preempt.PreemptionCallback`.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ecomkit.config import parse_signal_names as parse_signals  # the one parser, also used by validate

# EX_TEMPFAIL (sysexits.h): "a temporary failure; the user is invited to retry". Every worker exits with
# it after a preemption checkpoint; torchrun then exits 1 (it reports the workers' code in its summary).
PREEMPTED_EXIT_CODE = 75
RECORD = "preempted.json"


# A signalled rank that does not reach the end of its step within this (plus 3 × its longest step so far) is
# stuck (a hung peer, a stalled loader): it then exits as the signal's default would, so a job whose rank
# hangs still ends when torchrun sends SIGTERM, instead of waiting for torchrun's SIGKILL.
STUCK_AFTER_S = 10.0


class PreemptionSignals:
    """Installs handlers that only record the signal; :attr:`requested` is read once per step.

    Handlers can only be installed from the main thread (a notebook running
    the loop in a worker thread gets none, and says so through ``installed``).
    """

    def __init__(self, signals: list[signal.Signals], rank: int = 0):
        self.signals, self.rank = signals, rank
        self.received: list[str] = []      # names, in order of arrival
        self.saving = False
        self.longest_step_s = 0.0          # updated by the training callback each step
        self._stuck_timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}
        self._stack_dump: set[int] = set()  # signals faulthandler was registered for: the stacks print here
        self.installed = False

    @property
    def requested(self) -> bool:
        return bool(self.received)

    @property
    def first(self) -> str | None:
        return self.received[0] if self.received else None

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if signum in self._stack_dump:   # what `kill -USR1 <pid>` printed before this handler was installed
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if len(self.received) == 1:
            print(f"[rank {self.rank}] {name} received: finishing this step, then a checkpoint and exit "
                  f"{PREEMPTED_EXIT_CODE}", file=sys.stderr, flush=True)
            self._stuck_timer = threading.Timer(STUCK_AFTER_S + 3 * self.longest_step_s, self._stuck, (signum,))
            self._stuck_timer.daemon = True
            self._stuck_timer.start()
        elif self.saving:
            print(f"[rank {self.rank}] {name} received again while the checkpoint is written: ignored",
                  file=sys.stderr, flush=True)

    def _stuck(self, signum: int) -> None:
        """The step never ended after the signal: exit now, without a checkpoint, as the signal would have."""
        if self.saving:
            return
        print(f"[rank {self.rank}] the step did not finish within "
              f"{STUCK_AFTER_S + 3 * self.longest_step_s:.0f} s of {signal.Signals(signum).name} (this rank or a "
              "peer is stuck): exiting without a checkpoint; its stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)   # where it hung (the main thread is in C)
        os._exit(128 + signum)

    def install(self) -> bool:
        if not self.signals or threading.current_thread() is not threading.main_thread():
            return False
        for sig in self.signals:
            # faulthandler's C handler sits below Python's; unregister it (it restores what was there before
            # it) and install ours, which prints the stacks itself (see the module docstring)
            if hasattr(faulthandler, "unregister") and faulthandler.unregister(sig):
                self._stack_dump.add(sig)
            self._previous[sig] = signal.signal(sig, self._handle)
        self.installed = True
        return True

    def restore(self) -> None:
        """Put back the handlers found at :meth:`install` (the C-level stack dump, as dist installs it)."""
        if self._stuck_timer is not None:
            self._stuck_timer.cancel()
        if not self.installed:
            return
        for sig, old in self._previous.items():
            signal.signal(sig, old)
            if sig in self._stack_dump:
                faulthandler.register(sig, file=sys.stderr, all_threads=True, chain=False)
        self._previous.clear()
        self.installed = False


# ---------------------------------------------------------------------- the record a rerun resumes from
def write_record(root: Path, record: dict[str, Any]) -> Path:
    """Rank 0, after the checkpoint is complete on every rank: one atomic rename makes it the resume point."""
    root.mkdir(parents=True, exist_ok=True)
    path, tmp = root / RECORD, root / (RECORD + ".tmp")
    history = read_record(root).get("history", []) if (root / RECORD).is_file() else []
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({**record, "history": [*history, record], "written_at": time.time()}, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def read_record(root: Path) -> dict[str, Any]:
    """The record in ``root``, or ``{}`` when the last run there was not preempted (or it is unreadable)."""
    try:
        record = json.loads((Path(root) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and "checkpoint" in record else {}


def clear_record(root: Path) -> None:
    """A finished run: the next rerun of the command starts fresh again."""
    try:
        (Path(root) / RECORD).unlink()
    except FileNotFoundError:
        pass


__all__ = ["PREEMPTED_EXIT_CODE", "RECORD", "PreemptionSignals", "clear_record", "parse_signals", "read_record",
           "write_record"]
