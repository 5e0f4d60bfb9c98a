"""What a preempted run does at its agreed step: write that step's checkpoint, then the record, then exit 75.

Why apart: only a signalled run needs it. The checkpoint goes through the periodic checkpoints' code (DDP/FSDP2/TP:
DCP; ZeRO: DeepSpeed's); the record ``preempted.json`` names it, and a rerun of the command resumes there.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ecomkit import find
from ecomkit.config import StrategyName
from ecomkit.dist import gather_objects, log
from ecomkit.faults import CHECKPOINTS
from ecomkit.train.preempt import PREEMPTED_EXIT_CODE, RECORD, PreemptionCallback, read_record


def save_and_exit(callback: PreemptionCallback, run: Any) -> None:
    """Every rank: this step's checkpoint, a barrier, rank 0's record and summary, a barrier, exit 75."""
    signals = gather_objects(callback.signals.first, run.env)  # which ranks were signalled
    t0 = time.perf_counter()
    path, earlier_s = save_step(callback, run)
    if run.env.distributed:
        dist.barrier()  # every rank's part is written before rank 0 writes the record
    save_s = round(time.perf_counter() - t0 + earlier_s, 3)
    record = {"step": run.step, "checkpoint": str(path.resolve()), "save_s": save_s, "signals": signals,
              "strategy": run.strategy.name, "world_size": run.env.world_size, "total_steps": run.total_steps}
    if run.env.is_main:
        write_record(callback.root, record)
        log.info("preempted (%s): checkpoint of step %d written to %s in %.2f s; exiting with code %d, "
                 "rerun the same command to resume", next(s for s in signals if s), run.step, path, save_s,
                 PREEMPTED_EXIT_CODE)
        run.metrics.finish({"status": "preempted", "strategy": run.strategy.name, "steps": run.step,
                            "total_steps": run.total_steps, "preemption": record,
                            "output_dir": str(run.out_dir.resolve()), "config": run.cfg.to_dict()})
    if run.env.distributed:
        dist.barrier()  # nobody exits (and so makes torchrun stop the others) before the record exists
    raise SystemExit(PREEMPTED_EXIT_CODE)


def save_step(callback: PreemptionCallback, run: Any) -> tuple[Path, float]:
    """This step's checkpoint, and the seconds of a periodic save of this step that already wrote it."""
    cb = callback.checkpoint or dcp_callback(callback, run)
    if callback.cfg.strategy == StrategyName.ZERO:   # DeepSpeed's own sharded checkpoint
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


def dcp_callback(callback: PreemptionCallback, run: Any) -> Any:
    """A checkpoint callback that saves nothing periodically, set up now on every rank."""
    callback.checkpoint = find(f"{CHECKPOINTS}:CheckpointCallback")(callback.cfg)
    callback.checkpoint.resume_from, callback.checkpoint.resuming = None, False
    callback.checkpoint.on_train_start(run)
    return callback.checkpoint


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


__all__ = ["dcp_callback", "save_and_exit", "save_step", "write_record"]
