"""Eager vs SDPA attention for BLOOM on CPU: training step time and peak memory at seq 512/1024/2048.

Goals (issue 9): at seq 2048 SDPA's peak memory is <= 0.5x eager's, and its
step time is <= 1.0x eager's.

Each (attn, seq) pair runs in a fresh process: CPU peak memory is the process's
``ru_maxrss``, which only grows, so one process cannot measure two configs
(trap 13: tracemalloc does not see tensors). The figure reported is the peak
RSS of the measured steps minus the peak RSS after a warm-up step at seq 32
(model, AdamW states and the allocator already in place), i.e. what the
attention/activations of the measured steps added. Step time is the median of
the timed steps (forward + backward + AdamW), measured after one untimed step.

    python benchmarks/bench_attention.py [--model tiny] [--batch 4] [--seqs 512 1024 2048] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

MEMORY_GOAL, TIME_GOAL = 0.5, 1.0
MiB = 1024 * 1024


def measure(model_name: str, attn: str, seq: int, batch: int, steps: int, seed: int = 0) -> dict:
    """Train ``steps`` + 1 steps at ``seq`` in this process; return step time and peak-memory growth."""
    import torch

    from ecomkit.models import build_model
    from ecomkit.models_attention import install_attention

    torch.manual_seed(seed)
    model = build_model(model_name)
    install_attention(model, attn)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size

    def step(length: int) -> float:
        ids = torch.randint(3, vocab, (batch, length))
        mask = torch.ones_like(ids)
        mask[0, : length // 8] = 0  # one left-padded row, as in bucketed batches
        t0 = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    step(32)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    step(seq)  # untimed: first-call allocations
    times = [step(seq) for _ in range(steps)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"attn": attn, "seq": seq, "batch": batch, "model": model_name, "step_s": statistics.median(times),
            "peak_delta_bytes": peak - base, "peak_rss_bytes": peak, "threads": torch.get_num_threads()}


def run_fresh(args: argparse.Namespace, attn: str, seq: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", attn, "--model", args.model, "--batch", str(args.batch),
           "--steps", str(args.steps), "--seqs", str(seq)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.model, args.worker, args.seqs[0], args.batch, args.steps)))
        return

    print(f"model={args.model} batch={args.batch} steps={args.steps} (median) "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; one fresh process per row\n")
    print(f"{'seq':>5}  {'eager s/step':>12} {'sdpa s/step':>11} {'time ratio':>10}   "
          f"{'eager MiB':>9} {'sdpa MiB':>8} {'mem ratio':>9}")
    results = []
    for seq in args.seqs:
        eager, sdpa = run_fresh(args, "eager", seq), run_fresh(args, "sdpa", seq)
        t_ratio = sdpa["step_s"] / eager["step_s"]
        m_ratio = sdpa["peak_delta_bytes"] / max(eager["peak_delta_bytes"], 1)
        results.append((seq, t_ratio, m_ratio))
        print(f"{seq:>5}  {eager['step_s']:>12.3f} {sdpa['step_s']:>11.3f} {t_ratio:>9.2f}x   "
              f"{eager['peak_delta_bytes'] / MiB:>9.0f} {sdpa['peak_delta_bytes'] / MiB:>8.0f} {m_ratio:>8.2f}x")

    seq, t_ratio, m_ratio = max(results)
    print(f"\nseq {seq}: sdpa peak memory {m_ratio:.2f}x eager (goal <= {MEMORY_GOAL}x: "
          f"{'PASS' if m_ratio <= MEMORY_GOAL else 'MISS'}); step time {t_ratio:.2f}x eager "
          f"(goal <= {TIME_GOAL}x: {'PASS' if t_ratio <= TIME_GOAL else 'MISS'})")


if __name__ == "__main__":
    main()
