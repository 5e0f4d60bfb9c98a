#!/usr/bin/env python
"""Load peak: resident memory per rank while a local checkpoint is loaded, per strategy, against the bound.

A BLOOM checkpoint is written as sharded safetensors to a temporary folder,
then loaded by 2 processes (gloo, CPU) the way each strategy loads it:

- ``whole``: every rank loads the whole model (DDP, ZeRO-1/2, pipelines): the baseline;
- ``zero3``: built under ``deepspeed.zero.Init``, rank 0 reads module by module, each rank keeps its partition;
- ``fsdp``: built on the meta device, sharded by FSDP2, each rank reads tensor by tensor and keeps its shard;
- ``lora_bf16``: LoRA under DDP with ``--precision bf16``: every rank loads the whole model straight into bf16
  (its frozen base's dtype), then PEFT adds the fp32 adapters, as the training loop does.

Each rank records its fixed overhead (peak RSS after imports and process-group
set-up, before loading), its peak RSS after loading and reading every value it
holds once (``ru_maxrss``; ``from_pretrained`` may leave weights as views of
mapped files, resident only once touched), and the bytes of its shard. The bound the issue sets is
``peak <= 1.2 × (shard + largest tensor + overhead)``; the planner's
``load_peak`` says the same per strategy on GPUs.

    python benchmarks/bench_load.py [--hidden 1024 --layers 24 --vocab 8192]

``--worker`` is the per-rank part (also used by tests/test_load_peak.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

BOUND_FACTOR = 1.2
STRATEGIES = ("whole", "zero3", "fsdp", "lora_bf16")


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


PLANNER_STRATEGY = {"whole": "ddp", "zero3": "zero3", "fsdp": "fsdp2", "lora_bf16": "ddp"}   # the planner's names
TRAIN_STRATEGY = {"whole": "ddp", "zero3": "zero", "fsdp": "fsdp", "lora_bf16": "ddp"}        # --strategy


def planned_load_bytes(strategy: str, hidden: int, layers: int, heads: int, vocab: int, nproc: int = 2) -> int:
    """The planner's "while loading" row per rank for this checkpoint and load path (CPU: no CUDA context).

    fp32 full fine-tuning for ``whole``, ``zero3`` and ``fsdp``; ``lora_bf16`` is the LoRA plan (rank 16,
    bf16), whose row is what :func:`ecomkit.planner.lora.plan_lora_memory` reports.
    """
    from ecomkit.models.bloom import preset_config
    from ecomkit.planner.lora import LoraPlan, plan_lora_memory
    from ecomkit.planner.memory import PlanInput, plan_memory

    cfg = preset_config("tiny", vocab_size=vocab, hidden_size=hidden, n_layer=layers, n_head=heads)
    if strategy == "lora_bf16":
        inp = PlanInput(model=cfg, world_size=nproc, strategy="ddp", precision="bf16", device="cpu")
        return plan_lora_memory(inp, LoraPlan(r=16)).load_bytes
    inp = PlanInput(model=cfg, world_size=nproc, strategy=PLANNER_STRATEGY[strategy], precision="fp32", device="cpu")
    return plan_memory(inp).load_bytes


def write_checkpoint(out_dir: str | Path, hidden: int, layers: int, heads: int, vocab: int,
                     shard_mb: int = 64) -> int:
    """Save a randomly initialised BLOOM of this shape as sharded safetensors; return its fp32 bytes."""
    import torch

    from ecomkit.models.bloom import build_model, preset_config

    cfg = preset_config("tiny", vocab_size=vocab, hidden_size=hidden, n_layer=layers, n_head=heads)
    model = build_model(cfg, seed=0)
    model.save_pretrained(str(out_dir), max_shard_size=f"{shard_mb}MB")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    torch.manual_seed(0)
    return size


def worker(strategy: str, model_dir: str, out_json: str) -> None:
    """One rank: measure the overhead, load the way ``strategy`` does, measure the peak and the shard."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from ecomkit.config import TrainConfig
    from ecomkit.dist import distributed_session, gather_objects
    from ecomkit.models.bloom import ModelSource
    from ecomkit.models.checkpoint_files import CheckpointReader
    from ecomkit.models.lora import apply_peft
    from ecomkit.parallel import build_strategy
    from ecomkit.train.resolve import precision_choice
    from ecomkit.parallel.zero.env import ensure_deepspeed_env
    from ecomkit.parallel.zero.load import partition_bytes

    cfg = TrainConfig()
    cfg.model, cfg.output_dir = model_dir, tempfile.mkdtemp(prefix="ecomkit-load-")
    cfg.strategy = TRAIN_STRATEGY[strategy]
    cfg.zero.stage, cfg.zero.param_persistence_threshold = 3, 0
    if strategy == "lora_bf16":
        cfg.peft, cfg.precision, cfg.lora_r = "lora", "bf16", 16
        import peft  # noqa: F401  (imported before the overhead is read: apply_peft imports it lazily)
    with distributed_session() as env:
        if strategy == "zero3":
            ensure_deepspeed_env()
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        cfg.precision = precision_choice(cfg.precision, env).value   # --precision auto, as a run resolves it
        strat = build_strategy(cfg, env)
        largest = CheckpointReader(model_dir).largest_tensor_bytes()
        gc.collect()
        dist.barrier()
        overhead = peak_rss_bytes()
        t0 = time.perf_counter()
        model = strat.build_model(ModelSource(model_dir))
        if strategy == "fsdp":
            strat.setup(model, total_steps=1)   # FSDP2 shards on meta, then loads each rank's part, in setup
        if strategy == "lora_bf16":
            model = apply_peft(model, cfg)      # the training loop's order: built, then the adapters
        seconds = time.perf_counter() - t0
        # Read every value this rank holds once, as the first training step would: from_pretrained may leave
        # weights as views of mapped files, which count as resident only once touched.
        local = [getattr(p, "ds_tensor", None) if strategy == "zero3" else
                 (p.to_local() if isinstance(p, DTensor) else p) for p in model.parameters()]
        with torch.no_grad():
            for t in local:
                t.sum()
        peak = peak_rss_bytes()
        shard = partition_bytes(model) if strategy == "zero3" else sum(t.numel() * t.element_size() for t in local)
        row = {"strategy": strategy, "rank": env.rank, "overhead": overhead, "peak": peak, "shard": shard,
               "largest": largest, "load_s": seconds,
               "bound": BOUND_FACTOR * (shard + largest + overhead)}
        rows = gather_objects(row, env)
        if env.is_main:
            Path(out_json).write_text(json.dumps(rows))
        del model
        strat.close()
        gc.collect()
        dist.barrier()
    torch.set_num_threads(1)


def run_workers(strategy: str, model_dir: str | Path, nproc: int = 2, timeout: int = 600) -> list[dict]:
    """Launch the worker under torchrun and return every rank's row."""
    out = Path(tempfile.mkdtemp(prefix="ecomkit-load-")) / "rows.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           __file__, "--worker", strategy, str(model_dir), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import print_table, write_artifact

    mib = 2 ** 20
    with tempfile.TemporaryDirectory(prefix="ecomkit-ckpt-") as ckpt:
        size = write_checkpoint(ckpt, args.hidden, args.layers, args.heads, args.vocab)
        print(f"checkpoint: {size / mib:,.0f} MiB fp32 (hidden {args.hidden}, {args.layers} blocks, vocab {args.vocab})")
        rows = []
        for strategy in args.strategies.split(","):
            planned = planned_load_bytes(strategy, args.hidden, args.layers, args.heads, args.vocab)
            for r in run_workers(strategy, ckpt):
                rows.append({**{k: r[k] / mib for k in ("overhead", "peak", "shard", "largest", "bound")},
                             "strategy": r["strategy"], "rank": r["rank"], "load_s": r["load_s"],
                             "within_bound": r["peak"] <= r["bound"], "planned": planned / mib,
                             "measured_over_plan": (r["peak"] - r["overhead"]) / planned})
    columns = ["strategy", "rank", "overhead", "shard", "largest", "peak", "bound", "within_bound", "planned",
               "measured_over_plan", "load_s"]
    print_table(rows, columns)
    write_artifact("bench_load", rows, extra={
        "columns": columns,
        "headers": ["strategy", "rank", "fixed overhead (MiB)", "shard (MiB)", "largest tensor (MiB)",
                    "peak RSS (MiB)", "bound 1.2×(shard+largest+overhead)", "within bound",
                    "planner's load peak (MiB)", "(peak − overhead) / planner", "load (s)"],
        "settings": vars(args), "model_fp32_mib": size / mib,
        "notes": [f"model {size / mib:,.0f} MiB fp32, 2 processes (gloo, CPU); `whole` is every rank loading the "
                  "whole model (DDP, ZeRO-1/2, pipelines), shown for contrast; `lora_bf16` is LoRA (r 16) under DDP "
                  "with --precision bf16: the whole model in bf16 on every rank, then its fp32 adapters",
                  "peak = ru_maxrss after loading and reading every held value once; overhead = ru_maxrss after "
                  "imports and process-group set-up; the planner's load peak "
                  "(ecomkit.planner.loading.load_peak) counts the tensors a load path holds, not the process"],
    })


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    else:
        main()
