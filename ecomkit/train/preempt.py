"""Preemption: save on SIGTERM/SIGUSR1, exit 75, and resume when the same command runs again (docs/preemption.md).

Why a flag, not an exception: the handler only records the signal, which rides on the step's all-reduce, so every
rank stops after the same step and a second signal cannot cut the save.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Iterable

from ecomkit import find
from ecomkit.config import StrategyName, TrainConfig, dcp_unsupported_reason
from ecomkit.config import parse_signal_names as parse_signals
from ecomkit.dist import log
from ecomkit.faults import CHECKPOINTS, checkpoint_root
from ecomkit.parallel import strategy_spec

# EX_TEMPFAIL (sysexits.h), "a temporary failure; the user is invited to retry"; torchrun then exits 1.
PREEMPTED_EXIT_CODE = 75
RECORD = "preempted.json"
SAVE = "ecomkit.train.preempt_save"   # the save at the agreed step: loaded only by a preempted run
# A signalled rank whose step does not end within this (plus 3 × its longest step) is stuck: it exits unsaved.
STUCK_AFTER_S = 10.0


class PreemptionSignals:
    """Installs handlers that only record the signal; :attr:`requested` is read once per step (main thread only)."""

    def __init__(self, signals: list[signal.Signals], rank: int = 0):
        self.signals, self.rank = signals, rank
        self.received: list[str] = []
        self.saving = False
        self.longest_step_s = 0.0
        self._stuck_timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}
        self._stack_dump: set[int] = set()  # signals faulthandler had: the stacks print here
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
        """The step never ended after the signal: exit now, without a checkpoint."""
        if self.saving:
            return
        print(f"[rank {self.rank}] the step did not finish within "
              f"{STUCK_AFTER_S + 3 * self.longest_step_s:.0f} s of {signal.Signals(signum).name} (this rank or a "
              "peer is stuck): exiting without a checkpoint; its stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(128 + signum)

    def install(self) -> bool:
        if not self.signals or threading.current_thread() is not threading.main_thread():
            return False
        for sig in self.signals:
            if hasattr(faulthandler, "unregister") and faulthandler.unregister(sig):
                self._stack_dump.add(sig)
            self._previous[sig] = signal.signal(sig, self._handle)
        self.installed = True
        return True

    def restore(self) -> None:
        """Put back the handlers found at :meth:`install`."""
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


def preemption_root(cfg: TrainConfig) -> Path:
    """Where the preemption checkpoint and its record go: the folder the strategy's checkpoints use."""
    if cfg.strategy == StrategyName.ZERO:
        return Path(cfg.zero.checkpoint_dir or Path(cfg.output_dir) / "checkpoints")
    return checkpoint_root(cfg)


class PreemptionCallback:
    """Stop at the agreed step, checkpoint it, exit 75; on a rerun, report the resumed preemption."""

    def __init__(self, cfg: TrainConfig, checkpoint: Any, record: dict[str, Any]):
        self.cfg, self.root = cfg, preemption_root(cfg)
        self.checkpoint = checkpoint      # None: made at the first signal
        self.record = record              # the preemption this run resumes from ({} for none)
        self.signals: PreemptionSignals | None = None

    def on_train_start(self, run: Any) -> None:
        self.signals = PreemptionSignals(parse_signals(self.cfg.fault.preempt_signals), run.env.rank)
        if self.signals.install():
            run.stop_flag = lambda: self.signals.requested
        elif run.env.is_main:
            log.warning("preemption: no signal handlers outside the main thread; SIGTERM ends this run unsaved")

    def on_step_end(self, run: Any, row: dict[str, Any]) -> None:
        self.signals.longest_step_s = max(self.signals.longest_step_s, row.get("step_time_s") or 0.0)
        if not run.stop_agreed:
            return
        if run.step >= run.total_steps:
            if run.env.is_main:
                log.info("preemption requested at the last step (%d): the run finishes instead", run.step)
            return
        self.signals.saving = True
        find(f"{SAVE}:save_and_exit")(self, run)

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        if self.signals is not None:
            self.signals.restore()
        if self.record:
            summary["preemption"] = {"resumed_from_step": self.record["step"],
                                     "checkpoint": self.record["checkpoint"],
                                     "save_s": [r["save_s"] for r in self.record.get("history", [self.record])],
                                     "history": self.record.get("history", [])}
        if run.env.is_main:
            clear_record(self.root)


def add_preemption_callbacks(cfg: TrainConfig, callbacks: Iterable[Any]) -> list[Any]:
    """``callbacks`` plus :class:`PreemptionCallback` and the checkpoint callback it saves and resumes through."""
    out = list(callbacks)
    if not parse_signals(cfg.fault.preempt_signals) or any(isinstance(c, PreemptionCallback) for c in out):
        return out
    if cfg.strategy != StrategyName.ZERO and dcp_unsupported_reason(cfg) is not None:
        return out  # pipeline stages: no checkpoint to write, the signal ends the run as before
    root = preemption_root(cfg)
    record = read_record(root) if cfg.fault.resume else {}
    own = strategy_spec(cfg.strategy).checkpoint_callback
    if own is not None:   # ZeRO's own callback
        own = find(own)
        cb = next((c for c in out if isinstance(c, own)), None)
        if cb is None:
            cb = own(root, 0, None)
            out.append(cb)
        if record and Path(record["checkpoint"]).is_dir():
            cb.resume_from, cb.resuming = record["checkpoint"], True
    else:
        module = sys.modules.get(CHECKPOINTS)   # loaded wherever a CheckpointCallback was made
        cb = next((c for c in out if module and isinstance(c, module.CheckpointCallback)), None)
        if record and find("ecomkit.faults.checkpoint:is_complete")(Path(record["checkpoint"])):
            if cb is None:
                cb = find(f"{CHECKPOINTS}:CheckpointCallback")(cfg)
                out.append(cb)
            cb.resume_from, cb.resuming = Path(record["checkpoint"]), True
    out.append(PreemptionCallback(cfg, cb, record))
    return out


__all__ = ["PREEMPTED_EXIT_CODE", "RECORD", "SAVE", "PreemptionCallback", "PreemptionSignals",
           "add_preemption_callbacks", "clear_record", "parse_signals", "preemption_root", "read_record"]
