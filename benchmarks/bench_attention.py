#!/usr/bin/env python
"""Eager vs SDPA attention for BLOOM on CPU: training step time and peak memory at seq 512/1024/2048.

Goals (issue 9), at seq 2048: SDPA's peak memory <= 0.5x eager's, and its step
time <= 1.0x eager's.

Two measurements per (attention, seq), each in a fresh process:

- ``full``: one real training step as ecomkit's loop does it by default:
  forward with the chunked LM-head loss (``ecomkit.models.loss``, chunks of
  ``TrainConfig.loss_chunk_tokens`` positions), backward, AdamW.
- ``logits``: the same step with the full-logits loss (``--loss-chunk-tokens
  0``; what transformers' own ``labels=`` loss does). Its peak also holds the
  ``batch × T × vocab`` logits, their fp32 log-softmax and the gradients of
  both, which no attention change can remove: this is why the chunked loss
  exists.
- ``blocks``: the same step through the transformer blocks only (loss =
  mean square of the last hidden state), i.e. the part attention changes.

The goal is judged on ``full``, ecomkit's default training step; the other
two rows are printed beside it.

Peak memory is ``ru_maxrss`` (CPU tensors are invisible to tracemalloc, trap
13). It only ever grows, hence one process per measurement, and the figure
reported is the peak during the measured steps minus the peak after a warm-up
step at seq 32 (model, AdamW states and the allocator in place).
``MALLOC_MMAP_THRESHOLD_`` is pinned to 128 KiB in the workers so that glibc
returns freed tensor memory to the OS at once; with its default dynamic
threshold, freed blocks below 32 MiB can stay resident and RSS then
over-states the live peak. Step time is the best of the timed steps after one
untimed step (min, not mean: other processes on a shared machine only ever
add time).

    python benchmarks/bench_attention.py [--model tiny] [--batch 4] [--seqs 512 1024 2048] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_artifact  # noqa: E402

MEMORY_GOAL, TIME_GOAL = 0.5, 1.0
MiB = 1024 * 1024


def measure(model_name: str, attn: str, part: str, seq: int, batch: int, steps: int, seed: int = 0) -> dict:
    """Train ``steps`` + 1 steps at ``seq`` in this process; return best step time and peak-memory growth."""
    import torch

    from ecomkit.config import TrainConfig
    from ecomkit.models.bloom import build_model
    from ecomkit.fast.attention import install_attention
    from ecomkit.models.loss import TokenLoss, lm_loss_sum, token_loss_sum

    torch.manual_seed(seed)
    model = build_model(model_name)
    install_attention(model, attn)
    loss_fn = TokenLoss("chunked", TrainConfig().loss_chunk_tokens)   # part "full": the loop's whole step
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size

    def step(length: int) -> float:
        ids = torch.randint(3, vocab, (batch, length))
        mask = torch.ones_like(ids)
        mask[-1, length - length // 8:] = 0  # one right-padded row, as ecomkit's collate makes
        labels = ids.masked_fill(mask == 0, -100)
        t0 = time.perf_counter()
        if part == "full":
            loss = lm_loss_sum(model, loss_fn, ids, mask, labels) / mask.sum()
        elif part == "logits":
            loss = token_loss_sum(model(input_ids=ids, attention_mask=mask).logits, labels) / mask.sum()
        else:
            loss = model.transformer(input_ids=ids, attention_mask=mask).last_hidden_state.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    step(32)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    step(seq)  # untimed: first-call allocations at this length
    times = [step(seq) for _ in range(steps)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"attn": attn, "part": part, "seq": seq, "batch": batch, "model": model_name, "step_s": min(times),
            "peak_delta_bytes": peak - base, "peak_rss_bytes": peak, "threads": torch.get_num_threads()}


def run_fresh(args: argparse.Namespace, attn: str, part: str, seq: int, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", attn, part, "--model", args.model, "--batch", str(args.batch),
           "--steps", str(steps), "--seqs", str(seq)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        attn, part = args.worker
        print(json.dumps(measure(args.model, attn, part, args.seqs[0], args.batch, args.steps)))
        return

    load = os.getloadavg()[0]
    print(f"model={args.model} batch={args.batch}, best of {args.steps} steps, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {load:.1f} on "
          f"{os.cpu_count()} CPUs; one fresh process per measurement\n")
    parts = ("full", "logits", "blocks")
    print(f"{'seq':>5} | {'full step: eager s':>18} {'sdpa s':>7} {'ratio':>6} | peak MiB eager / sdpa / ratio: "
          f"{'full step (chunked loss)':>24} | {'full-logits loss':>22} | {'blocks only':>22}")
    last, artifact_rows = {}, []
    for seq in args.seqs:
        r = {(a, p): run_fresh(args, a, p, seq, 1 if p == "blocks" else args.steps) for a in ("eager", "sdpa")
             for p in parts}
        t_ratio = r["sdpa", "full"]["step_s"] / r["eager", "full"]["step_s"]
        mem = {p: (r["eager", p]["peak_delta_bytes"], r["sdpa", p]["peak_delta_bytes"]) for p in parts}
        m_ratio = {p: s / max(e, 1) for p, (e, s) in mem.items()}
        cells = " | ".join(f"{mem[p][0] / MiB:>8.0f} {mem[p][1] / MiB:>6.0f} {m_ratio[p]:>5.2f}x" for p in parts)
        print(f"{seq:>5} | {r['eager', 'full']['step_s']:>18.3f} {r['sdpa', 'full']['step_s']:>7.3f} "
              f"{t_ratio:>5.2f}x | {cells}", flush=True)
        last = {"seq": seq, "t": t_ratio, "m": m_ratio, "mem": mem, "r": r}
        artifact_rows.append({"seq": seq, "eager_step_s": r["eager", "full"]["step_s"],
                              "sdpa_step_s": r["sdpa", "full"]["step_s"], "step_time_ratio": t_ratio,
                              **{f"peak_ratio_{p}": m_ratio[p] for p in parts},
                              **{f"peak_bytes_{a}_{p}": mem[p][i] for p in parts for i, a in enumerate(("eager", "sdpa"))}})

    seq, m = last["seq"], last["m"]
    print(f"\nseq {seq}, goal sdpa/eager peak memory <= {MEMORY_GOAL}x: ecomkit's training step (chunked loss) "
          f"{m['full']:.2f}x {verdict(m['full'] <= MEMORY_GOAL)}; with the full-logits loss {m['logits']:.2f}x; "
          f"transformer blocks only {m['blocks']:.2f}x")
    full, logits = last["mem"]["full"], last["mem"]["logits"]
    t_chunk = last["r"]["sdpa", "full"]["step_s"] / last["r"]["sdpa", "logits"]["step_s"]
    print(f"seq {seq}, the chunked loss itself: sdpa peak {full[1] / max(logits[1], 1):.2f}x of the full-logits "
          f"loss's, eager {full[0] / max(logits[0], 1):.2f}x; sdpa step time {t_chunk:.2f}x (one head recompute)")
    print(f"seq {seq}, goal sdpa/eager step time <= {TIME_GOAL}x: {last['t']:.2f}x {verdict(last['t'] <= TIME_GOAL)}")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    write_artifact("bench_attention", artifact_rows, extra={
        "settings": {k: v for k, v in vars(args).items() if k != "worker"},
        "columns": ["seq", "step_time_ratio", "peak_ratio_full", "peak_ratio_logits", "peak_ratio_blocks"],
        "headers": ["seq", "step time sdpa / eager", "peak memory sdpa / eager: training step", "full-logits loss",
                    "blocks only"],
        "notes": [f"seq {seq}: goal step time ≤ {TIME_GOAL}× — {verdict(last['t'] <= TIME_GOAL)} ({last['t']:.2f}×); "
                  f"goal peak memory ≤ {MEMORY_GOAL}× — {verdict(m['full'] <= MEMORY_GOAL)} ({m['full']:.2f}×)",
                  f"seq {seq}: chunked loss peak {full[1] / max(logits[1], 1):.2f}× the full-logits loss's (sdpa), "
                  f"step time {t_chunk:.2f}×"]})


if __name__ == "__main__":
    main()
