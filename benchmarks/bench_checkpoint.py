"""Step-time cost of checkpointing: none vs synchronous DCP save vs ``async_save``, in one process.

One model (``small`` BLOOM by default) and AdamW train on a fixed random batch;
blocks of ``--steps`` steps run with no checkpoint, a synchronous save, or an
async save every ``--interval`` steps, interleaved (none, sync, async, none,
...) so that a change in machine load hits all three alike. Per configuration
(median over ``--repeats`` blocks):

- wall time per step, including every wait a save imposes (for async: the
  wait for the last write before the block ends, as a job must before exit);
- how long the training loop was blocked per save (sync: the whole write;
  async: ``get_state_dict`` plus the copy of the state into CPU memory);
- how long after the save started its files were all written (sync: the same as blocked).

On a CPU-only machine the background writer competes with training for the
same cores, so async hides less than on a GPU node, where the GPU keeps
training while the host writes. The load average is printed so a noisy
machine is recognisable.

    python benchmarks/bench_checkpoint.py [--model small] [--steps 9] [--interval 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import print_table, write_artifact
from ecomkit.faults.checkpoint import TRAINER_STATE, CheckpointWriter, model_optimizer_state
from ecomkit.models.bloom import build_model


def train_block(model, opt, batch, steps: int, writer: CheckpointWriter | None, interval: int) -> float:
    """Seconds for ``steps`` training steps with a save every ``interval`` (waiting for the last one)."""
    start = time.perf_counter()
    for step in range(1, steps + 1):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if writer is not None and step % interval == 0:
            writer.save(step, model_optimizer_state(model, opt), {TRAINER_STATE: {"step": step}})
    if writer is not None:
        writer.wait()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small")
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--interval", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5, help="blocks per configuration (median); 2 was too few to tell the wall times apart")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args()
    torch.manual_seed(0)
    model = build_model(args.model, vocab_size=8192)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 8192, (args.micro_batch_size, args.seq_len))
    train_block(model, opt, batch, 2, None, args.interval)  # warm-up: allocations, optimizer state
    results: dict[str, list[float]] = {"none": [], "sync": [], "async": []}
    writers: dict[str, list[CheckpointWriter]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        for r in range(args.repeats):
            for mode in results:
                writer = None if mode == "none" else CheckpointWriter(Path(tmp) / f"{mode}{r}", keep_last=1,
                                                                      use_async=mode == "async")
                results[mode].append(train_block(model, opt, batch, args.steps, writer, args.interval) / args.steps)
                if writer is not None:
                    writers[mode].append(writer)
        size = sum(f.stat().st_size for f in next((Path(tmp) / "sync0").glob("step_*")).iterdir())
    rows = []
    for mode, per_step in results.items():
        recs = [rec for w in writers.get(mode, []) for rec in w.records]
        rows.append({"config": mode, "saves": len(recs), "wall_per_step_s": statistics.median(per_step),
                     "blocked_per_save_s": statistics.median([x.blocking_s for x in recs]) if recs else 0.0,
                     "save_written_after_s": statistics.median([x.total_s for x in recs]) if recs else 0.0})
    print(f"\n{args.model}: {sum(p.numel() for p in model.parameters()):,} parameters, checkpoint "
          f"{size / 2**20:.0f} MiB; {args.steps} steps per block, a save every {args.interval}; "
          f"{args.repeats} blocks each; load average {os.getloadavg()[0]:.1f}")
    print_table(rows, ["config", "saves", "wall_per_step_s", "blocked_per_save_s", "save_written_after_s"])
    base, sync, asyn = (r["wall_per_step_s"] for r in rows)
    print(f"\nwall per step vs no checkpoint: sync {sync / base:.2f}x, async {asyn / base:.2f}x")
    blocked = rows[2]['blocked_per_save_s'] / rows[1]['blocked_per_save_s']
    print(f"training blocked per save, async / sync: {blocked:.2f}")
    for r in rows:
        r["wall_vs_none"] = r["wall_per_step_s"] / base
    write_artifact("bench_checkpoint", rows, extra={
        "settings": vars(args), "checkpoint_bytes": size,
        "columns": ["config", "saves", "wall_per_step_s", "wall_vs_none", "blocked_per_save_s", "save_written_after_s"],
        "headers": ["saves", "count", "wall s/step (median)", "vs no checkpoint", "training blocked s/save",
                    "save complete after s"],
        "notes": [f"model {args.model}, checkpoint {size / 2**20:.0f} MiB, a save every {args.interval} steps",
                  f"training blocked per save, async / sync: {blocked:.2f}"]})


if __name__ == "__main__":
    main()
