"""Per-rank memory and collective bytes per step of DP, FSDP2, TP, PP and TP×DP, side by side in one run.

Each layout trains the same BLOOM (``small`` preset by default: hidden 256, 4 blocks, 8 heads) on the same
synthetic global batch for a few steps, under torchrun with gloo. Per rank it records the model-state bytes
(parameters, gradients, AdamW moments; counted tensor by tensor, DTensors by their local shard) and, for the
last step, every collective with its payload and the bytes the rank sends (ring estimate; see
``ecomkit.parallel.comm_count``). The parent prints one table with ratios to DP.

    python benchmarks/bench_mixed.py [--model small] [--seq-len 128] [--global-batch 8] [--steps 3]

DP is DDP (``ecomkit.parallel.ddp``); the others are ``ecomkit.parallel.mixed.MixedParallelStrategy``.
The 4-process TP×DP run oversubscribes a 2-core machine: compare bytes, not times.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, bench_env, print_table, write_artifact  # noqa: E402

LAYOUTS = {  # name: (processes, strategy, parallel degrees)
    "DP (DDP)": (2, "ddp", {}),
    "FSDP2": (2, "fsdp", {"dp": 2}),
    "TP 2": (2, "tp", {"tp": 2}),
    "PP 2 (1F1B)": (2, "pp", {"pp": 2}),
    "TP 2 × DP 2": (4, "mixed", {"tp": 2, "dp": 2}),
}


# ---------------------------------------------------------------------- worker (one rank)
def worker(args: argparse.Namespace) -> None:
    import torch

    from ecomkit.parallel.comm_count import CollectiveCounter
    from ecomkit.config import TrainConfig
    from ecomkit.dist import distributed_session
    from ecomkit.models.bloom import build_model
    from ecomkit.parallel import build_strategy
    from ecomkit.train.resolve import precision_choice
    from ecomkit.models.loss import count_label_tokens, token_loss_sum

    cfg = TrainConfig(model=args.model, strategy=args.strategy, seq_len=args.seq_len, lr=1e-3, warmup_steps=0)
    for key, value in json.loads(args.degrees).items():
        setattr(cfg.parallel, key, value)
    cfg.parallel.count_collectives = False  # counted here, the same way for DDP and the others
    with distributed_session(seed=0) as env:
        cfg.precision = precision_choice(cfg.precision, env).value   # --precision auto, as a run resolves it
        strategy = build_strategy(cfg, env)
        shard = getattr(strategy, "data_shard", lambda: (env.rank, env.world_size))
        data_rank, data_shards = shard()
        model = build_model(args.model, vocab_size=args.vocab, seed=0)
        strategy.setup(model, args.steps)
        torch.manual_seed(1)
        ids = torch.randint(3, args.vocab, (args.global_batch, args.seq_len))
        per_shard = args.global_batch // data_shards
        mine = ids[data_rank * per_shard:(data_rank + 1) * per_shard]
        batch = {"input_ids": mine, "attention_mask": torch.ones_like(mine), "labels": mine}
        scale = data_shards / count_label_tokens(ids)
        counter, memory, losses = CollectiveCounter(), {}, []
        for step in range(args.steps):
            counter.pop_stats()
            with counter:
                if getattr(strategy, "owns_forward_backward", False):
                    loss = strategy.forward_backward([batch], scale)
                else:
                    with strategy.micro_step_context(is_last=True):
                        tok_sum = token_loss_sum(strategy.forward_logits(mine, batch["attention_mask"]), mine)
                        strategy.backward(tok_sum * scale)
                    loss = float(tok_sum)
                if step == args.steps - 1:
                    memory = strategy.memory_report()  # gradients still held, optimizer states exist
                strategy.clip_and_step(1.0)
            losses.append(loss)
        comm = counter.pop_stats().as_dict()
        result = {"rank": env.rank, "memory": memory, "comm": comm, "local_loss_sum": losses[-1]}
        parts = [None] * env.world_size
        if env.distributed:
            import torch.distributed as dist

            dist.all_gather_object(parts, result)
        else:
            parts = [result]
        strategy.close()
        if env.is_main:
            Path(args.out).write_text(json.dumps(parts))


# ---------------------------------------------------------------------- parent
def run_layout(name: str, nproc: int, strategy: str, degrees: dict, args: argparse.Namespace, tmp: Path) -> list:
    import subprocess

    out = tmp / f"{strategy}_{nproc}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           __file__, "--worker", "--strategy", strategy, "--degrees", json.dumps(degrees), "--out", str(out),
           "--model", args.model, "--seq-len", str(args.seq_len), "--global-batch", str(args.global_batch),
           "--steps", str(args.steps), "--vocab", str(args.vocab)]
    proc = subprocess.run(cmd, cwd=REPO, env=bench_env(), capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--degrees", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    mib = 2 ** 20
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-mixed-") as tmp:
        for name, (nproc, strategy, degrees) in LAYOUTS.items():
            print(f"running {name} ({nproc} processes) ...", flush=True)
            for part in run_layout(name, nproc, strategy, degrees, args, Path(tmp)):
                rows.append({"layout": name, "rank": part["rank"],
                             "state MiB": part["memory"]["total"] / mib,
                             "params MiB": part["memory"]["params"] / mib,
                             "collectives/step": part["comm"]["comm_count"],
                             "payload MiB/step": part["comm"]["comm_payload_bytes"] / mib,
                             "sent MiB/step": part["comm"]["comm_wire_bytes"] / mib,
                             "kinds": ",".join(f"{k}×{v['count']}" for k, v in part["comm"]["comm_by_kind"].items())})
    dp = [r for r in rows if r["layout"] == "DP (DDP)"][0]
    for r in rows:
        r["state / DP"] = r["state MiB"] / dp["state MiB"]
        r["sent / DP"] = r["sent MiB/step"] / dp["sent MiB/step"] if dp["sent MiB/step"] else None
    print(f"\nmodel {args.model}, global batch {args.global_batch} × {args.seq_len} tokens, step {args.steps} of "
          f"{args.steps}; fp32 AdamW (16 bytes/parameter replicated)\n")
    columns = ["layout", "rank", "state MiB", "state / DP", "params MiB", "collectives/step", "payload MiB/step",
               "sent MiB/step", "sent / DP", "kinds"]
    print_table(rows, columns)
    write_artifact("bench_mixed", rows, extra={
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "strategy", "degrees", "out")},
        "columns": [c for c in columns if c != "kinds"],
        "notes": [f"model {args.model}, global batch {args.global_batch} × {args.seq_len} tokens, last of "
                  f"{args.steps} steps; fp32 AdamW; the 4-process run oversubscribes 2 cores: compare bytes, "
                  "not times"]})


if __name__ == "__main__":
    main()
