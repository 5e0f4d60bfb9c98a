"""Chapter 07's checkpoint callback: save every N steps and resume after a killed rank.

Why callbacks: the training loop knows nothing of faults; a resume restores model, optimizer, scheduler, scaler,
sampler position and every rank's RNG, so it gives the losses an uninterrupted run would have given.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ecomkit.config import TrainConfig
from ecomkit.dist import log
from ecomkit.errors import EcomkitError
from ecomkit.faults import checkpoint_root, checkpoints_requested
from ecomkit.faults.checkpoint import (
    TRAINER_STATE,
    CheckpointWriter,
    SaveRecord,
    apply_model_optimizer_state,
    capture_rng_state,
    is_complete,
    latest_checkpoint,
    load_dcp,
    model_optimizer_state,
    read_json_file,
    remove_stale_temp_dirs,
    restore_rng_state,
)

AUTO_MAX_INTERVAL = 100  # steps: the longest automatic interval, however long the run


def effective_checkpoint_interval(cfg: TrainConfig, total_steps: int) -> int:
    """Steps between checkpoints; ``-1`` (auto) means ~5 % of the run, between 1 and 100 steps.

    Auto saves only when something can use it (``--max-restarts > 0`` or an injected fault); else a rerun starts fresh.
    """
    if not checkpoints_requested(cfg):
        return 0
    if cfg.fault.checkpoint_interval > 0:
        return cfg.fault.checkpoint_interval
    return max(1, min(AUTO_MAX_INTERVAL, math.ceil(total_steps / 20)))


def trainer_state(run: Any) -> dict[str, Any]:
    """Everything besides tensors needed to continue exactly where ``run`` is now."""
    strategy = run.strategy
    return {
        "step": run.step, "epoch": run.epoch, "total_steps": run.total_steps,
        "world_size": run.env.world_size, "global_batch": run.global_batch(), "strategy": strategy.name,
        "sampler": run.sampler.state_dict(),
        "scheduler": strategy.scheduler.state_dict() if strategy.scheduler is not None else None,
        "scaler": strategy.scaler.state_dict() if getattr(strategy, "scaler", None) is not None else None,
        "saved_at": time.time(),
    }


class CheckpointCallback:
    """Saves every ``interval`` steps and, on start, resumes from the newest complete checkpoint.

    ``resuming`` is decided at construction, before the loop opens ``metrics.jsonl``, so a resume appends to it.
    """

    def __init__(self, cfg: TrainConfig):
        self.cfg, self.root = cfg, checkpoint_root(cfg)
        self.resume_from = latest_checkpoint(self.root) if cfg.fault.resume else None
        self.resuming = self.resume_from is not None
        self.interval = 0
        self.writer: CheckpointWriter | None = None
        self.resumed_step: int | None = None
        self.restore_s: float | None = None

    def on_train_start(self, run: Any) -> None:
        env = run.env
        self.interval = effective_checkpoint_interval(self.cfg, run.total_steps)
        group = None
        if env.distributed:
            # Its own gloo group: on the default one, async_save's background gather interleaves with the
            # training collectives and deadlocks.
            group = dist.new_group(backend="gloo", timeout=_dt.timedelta(seconds=self.cfg.timeout_s))
        self.writer = CheckpointWriter(self.root, self.cfg.fault.keep_last, self.cfg.fault.async_checkpoint,
                                       group, env.rank)
        if env.is_main and self.interval:
            for p in remove_stale_temp_dirs(self.root):
                log.info("checkpoint: removed %s (a save interrupted by the previous attempt)", p.name)
        path = self._agree_on_resume_path(env, group)
        if path is not None:
            self._restore(run, path)
        if env.distributed:
            dist.barrier(group=group)  # nobody writes into the root before rank 0 has cleaned it
        if env.is_main and self.interval:
            mode = "async (own gloo group)" if self.cfg.fault.async_checkpoint else "sync"
            log.info("checkpoint: every %d steps into %s, %s, keep last %d", self.interval, self.root, mode,
                     self.cfg.fault.keep_last)

    def on_step_end(self, run: Any, row: dict[str, Any]) -> None:
        if self.writer is None:
            return
        self.writer.poll()
        if self.interval and run.step % self.interval == 0 and run.step < run.total_steps:
            self.save(run)

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        if self.writer is None:
            return
        self.writer.wait()
        recs = self.writer.records
        summary["checkpoint"] = {
            "interval": self.interval, "async": self.cfg.fault.async_checkpoint, "dir": str(self.root.resolve()),
            "saves": len(recs), "saved_steps": [r.step for r in recs],
            "blocking_s": [round(r.blocking_s, 4) for r in recs],
            "total_s": [round(r.total_s, 4) if r.total_s is not None else None for r in recs],
            "resumed_from_step": self.resumed_step, "restore_s": self.restore_s,
        }

    def save(self, run: Any) -> SaveRecord:
        state = model_optimizer_state(run.strategy.raw_model, run.strategy.optimizer)
        files: dict[str, Any] = {f"rng_rank{run.env.rank}.json": capture_rng_state()}
        if run.env.is_main:
            files[TRAINER_STATE] = trainer_state(run)
        return self.writer.save(run.step, state, files)

    def _agree_on_resume_path(self, env: Any, group: Any) -> Path | None:
        """Rank 0's choice wins; a rank that cannot see it has a checkpoint dir that is not shared."""
        if not env.distributed:
            return self.resume_from
        choice = [str(self.resume_from) if self.resume_from else None]
        dist.broadcast_object_list(choice, src=0, group=group)
        path = Path(choice[0]) if choice[0] else None
        if path is not None and not is_complete(path):
            raise EcomkitError(
                f"[rank {env.rank}] rank 0 resumes from {path}, but this rank cannot see that complete checkpoint. "
                "--fault-checkpoint-dir must be a folder that every node sees (a shared filesystem).")
        return path

    def _restore(self, run: Any, path: Path) -> None:
        t0 = time.perf_counter()
        strategy, env = run.strategy, run.env
        ts = read_json_file(path / TRAINER_STATE)
        if ts["total_steps"] != run.total_steps:
            log.warning("checkpoint %s was written by a run of %d steps; this run has %d, so the learning-rate "
                        "schedule continues on the new length", path.name, ts["total_steps"], run.total_steps)
        state = model_optimizer_state(strategy.raw_model, strategy.optimizer)
        load_dcp(path, state, self.writer.group)
        apply_model_optimizer_state(strategy.raw_model, strategy.optimizer, state)
        if strategy.scheduler is not None and ts.get("scheduler") is not None:
            strategy.scheduler.load_state_dict(ts["scheduler"])
        if getattr(strategy, "scaler", None) is not None and ts.get("scaler"):
            strategy.scaler.load_state_dict(ts["scaler"])
        run.sampler.load_state_dict(ts["sampler"])
        run.step, run.epoch = int(ts["step"]), int(ts["epoch"])
        rng_file = path / f"rng_rank{env.rank}.json"
        if ts["world_size"] == env.world_size and rng_file.is_file():
            restore_rng_state(read_json_file(rng_file))
        elif env.is_main:
            log.warning("resuming at world size %d from a checkpoint written at %d: random-number streams are "
                        "per rank, so they restart from the seed (data order is unaffected)",
                        env.world_size, ts["world_size"])
        self.resumed_step, self.restore_s = run.step, round(time.perf_counter() - t0, 4)
        if env.is_main:
            log.info("resumed from %s: step %d, epoch %d, %d global batches of this epoch already seen (%.2f s)",
                     path, run.step, run.epoch, ts["sampler"]["consumed_global_batches"], self.restore_s)


__all__ = ["AUTO_MAX_INTERVAL", "CheckpointCallback", "effective_checkpoint_interval", "trainer_state"]
