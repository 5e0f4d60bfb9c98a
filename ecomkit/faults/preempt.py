"""Preemption: the signals a cluster sends before it takes a job back, and the record a rerun resumes from.

Why a flag, not an exception: the step finishes, the ranks agree on where to stop (on the step's count all-reduce),
a checkpoint is written and the process exits :data:`PREEMPTED_EXIT_CODE`; a second signal cannot cut the save.
While installed, the SIGUSR1 handler prints the stacks itself, from Python (see docs/preemption.md). The record
``preempted.json`` makes the same command, rerun, resume there; a run that finishes removes it.
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

# EX_TEMPFAIL (sysexits.h), "a temporary failure; the user is invited to retry"; torchrun then exits 1.
PREEMPTED_EXIT_CODE = 75
RECORD = "preempted.json"


# A signalled rank whose step does not end within this (plus 3 × its longest step) is stuck: it exits as the signal
# would.
STUCK_AFTER_S = 10.0


class PreemptionSignals:
    """Installs handlers that only record the signal; :attr:`requested` is read once per step.

    Only the main thread can install handlers (a notebook's worker thread gets none, and ``installed`` says so).
    """

    def __init__(self, signals: list[signal.Signals], rank: int = 0):
        self.signals, self.rank = signals, rank
        self.received: list[str] = []
        self.saving = False
        self.longest_step_s = 0.0
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
            # faulthandler's C handler sits below Python's: unregister it, ours prints the stacks from Python
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
