"""Save on SIGTERM/SIGUSR1, exit 75, and resume when the same command runs again (chapter 07, docs/faults.md).

Why a callback: the loop stays the same for every strategy. The handler only sets a flag, which rides on the
step's summed all-reduce, so every rank stops after the same step; that step's checkpoint is written through the
periodic checkpoints' code (DDP/FSDP2/TP: DCP; ZeRO: DeepSpeed's), then ``preempted.json`` names it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

import torch.distributed as dist

from ecomkit.config import StrategyName, TrainConfig, dcp_unsupported_reason
from ecomkit.dist import gather_objects, log
from ecomkit.faults.callbacks import CheckpointCallback
from ecomkit.faults.checkpoint import checkpoint_root, is_complete
from ecomkit.faults.preempt import (PREEMPTED_EXIT_CODE, PreemptionSignals, clear_record, parse_signals, read_record,
                                    write_record)
from ecomkit.parallel import find, strategy_spec


def preemption_root(cfg: TrainConfig) -> Path:
    """Where the preemption checkpoint and its record go: the folder the strategy's checkpoints use."""
    if cfg.strategy == StrategyName.ZERO:
        return Path(cfg.zero.checkpoint_dir or Path(cfg.output_dir) / "checkpoints")
    return checkpoint_root(cfg)


class PreemptionCallback:
    """Stop at the agreed step, checkpoint it, exit 75; on a rerun, report the resumed preemption."""

    def __init__(self, cfg: TrainConfig, checkpoint: Any, record: dict[str, Any]):
        self.cfg, self.checkpoint, self.root = cfg, checkpoint, preemption_root(cfg)
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
        signals = gather_objects(self.signals.first, run.env)  # which ranks were signalled, for the record
        t0 = time.perf_counter()
        path, earlier_s = self._save(run)
        if run.env.distributed:
            dist.barrier()  # every rank's part is written before rank 0 writes the record
        save_s = round(time.perf_counter() - t0 + earlier_s, 3)
        record = {"step": run.step, "checkpoint": str(path.resolve()), "save_s": save_s, "signals": signals,
                  "strategy": run.strategy.name, "world_size": run.env.world_size, "total_steps": run.total_steps}
        if run.env.is_main:
            write_record(self.root, record)
            log.info("preempted (%s): checkpoint of step %d written to %s in %.2f s; exiting with code %d, "
                     "rerun the same command to resume", next(s for s in signals if s), run.step, path, save_s,
                     PREEMPTED_EXIT_CODE)
            run.metrics.finish({"status": "preempted", "strategy": run.strategy.name, "steps": run.step,
                                "total_steps": run.total_steps, "preemption": record,
                                "output_dir": str(run.out_dir.resolve()), "config": run.cfg.to_dict()})
        if run.env.distributed:
            dist.barrier()  # nobody exits (and so makes torchrun stop the others) before the record exists
        raise SystemExit(PREEMPTED_EXIT_CODE)

    def _save(self, run: Any) -> tuple[Path, float]:
        """This step's checkpoint through the strategy's own checkpoint code, and the seconds of a periodic
        save of this very step that already wrote it (it is not written twice)."""
        cb = self.checkpoint
        if not isinstance(cb, CheckpointCallback):   # ZeRO: DeepSpeed's own sharded checkpoint
            tag = f"step{run.step}"
            if not cb.saved or cb.saved[-1] != tag:
                client = {"step": run.step, "epoch": run.epoch, "sampler": run.sampler.state_dict()}
                run.strategy.save_checkpoint(str(cb.ckpt_dir), tag, client)
                cb.saved.append(tag)
            return cb.ckpt_dir / tag, 0.0
        records = cb.writer.records
        earlier = records[-1] if records and records[-1].step == run.step else None
        if earlier is None:
            cb.save(run)
        cb.writer.wait()  # an async save (--fault-async-checkpoint) is committed before the exit
        return Path(cb.writer.records[-1].path), (earlier.total_s or earlier.blocking_s) if earlier else 0.0

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
    """``callbacks`` plus :class:`PreemptionCallback` and the checkpoint callback it saves and resumes through
    (a periodic one is reused; else one that resumes only from a preemption record, so a rerun starts fresh)."""
    out = list(callbacks)
    if not parse_signals(cfg.fault.preempt_signals) or any(isinstance(c, PreemptionCallback) for c in out):
        return out
    if cfg.strategy != StrategyName.ZERO and dcp_unsupported_reason(cfg) is not None:
        return out  # pipeline stages: no checkpoint to write, the signal ends the run as before
    root = preemption_root(cfg)
    record = read_record(root) if cfg.fault.resume else {}
    own = strategy_spec(cfg.strategy).checkpoint_callback
    if own is not None:   # ZeRO's own callback (ecomkit.parallel.STRATEGIES), imported only by ZeRO runs
        own = find(own)
        cb = next((c for c in out if isinstance(c, own)), None)
        if cb is None:
            cb = own(root, 0, None)
            out.append(cb)
        if record and Path(record["checkpoint"]).is_dir():
            cb.resume_from, cb.resuming = record["checkpoint"], True
    else:
        cb = next((c for c in out if isinstance(c, CheckpointCallback)), None)
        if cb is None:
            cb = CheckpointCallback(cfg)
            cb.resume_from, cb.resuming = None, False  # only a preemption record makes this one resume
            out.append(cb)
        if record and is_complete(Path(record["checkpoint"])):
            cb.resume_from, cb.resuming = Path(record["checkpoint"]), True
    out.append(PreemptionCallback(cfg, cb, record))
    return out


__all__ = ["PREEMPTED_EXIT_CODE", "PreemptionCallback", "add_preemption_callbacks", "preemption_root"]
