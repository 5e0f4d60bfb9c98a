#!/usr/bin/env python
"""Where ``--attn auto`` switches: eager vs SDPA training step time by sequence length, at fp32 and bf16.

  python benchmarks/bench_attn_rule.py [--model small] [--seqs 64 128 256 512 1024] [--repeats 3]

One real training step as the loop runs it (chunked loss, backward, AdamW; the
forward under CPU autocast for bf16), each measurement in a fresh process
(``bench_attention``'s worker), one thread. Every step holds the same number of
tokens (``--tokens``; batch = tokens / seq), so lengths cost alike. Each
(precision, seq) pair runs ``--repeats`` times, eager and SDPA alternating
which goes first; a run's figure is its best step (other processes only ever
add time), and the comparison is the median over runs.

The rule's constant, ``ecomkit.models.attention_rule.CPU_EAGER_MAX_SEQ``,
is :func:`~ecomkit.models.attention_rule.eager_max_seq` of this artifact's
rows; ``tests/test_attention_rule.py`` recomputes it from the newest artifact.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import REPO, bench_env, write_artifact

from ecomkit.models.attention_rule import CPU_EAGER_MAX_SEQ, eager_max_seq

WORKER = Path(__file__).resolve().parent / "bench_attention.py"


def measure(model: str, attn: str, precision: str, seq: int, batch: int, steps: int) -> dict:
    cmd = [sys.executable, str(WORKER), "--worker", attn, "full", "--model", model, "--batch", str(batch),
           "--steps", str(steps), "--seqs", str(seq), "--precision", precision]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO, env=bench_env(1))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per step (batch = tokens / seq)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (best counts), after one untimed")
    ap.add_argument("--repeats", type=int, default=3, help="runs per (precision, seq, attention)")
    args = ap.parse_args()
    print(f"model={args.model}, {args.tokens} tokens per step, best of {args.steps} steps per run, "
          f"{args.repeats} runs each, 1 thread, load average {os.getloadavg()[0]:.1f}\n", flush=True)
    rows, table = [], []
    for precision in args.precisions:
        for seq in args.seqs:
            batch = max(1, args.tokens // seq)
            for k in range(args.repeats):
                for attn in (("eager", "sdpa") if k % 2 == 0 else ("sdpa", "eager")):
                    rows.append({**measure(args.model, attn, precision, seq, batch, args.steps), "repeat": k})
            med = {a: statistics.median(r["step_s"] for r in rows if r["precision"] == precision
                                        and r["seq"] == seq and r["attn"] == a) for a in ("eager", "sdpa")}
            table.append({"precision": precision, "seq": seq, "batch": batch, "eager_step_s": med["eager"],
                          "sdpa_step_s": med["sdpa"], "sdpa_over_eager": med["sdpa"] / med["eager"],
                          "faster": "eager" if med["eager"] < med["sdpa"] else "sdpa"})
            t = table[-1]
            print(f"{precision} seq {seq:>5} batch {batch:>3}: eager {t['eager_step_s']:.3f} s, sdpa "
                  f"{t['sdpa_step_s']:.3f} s, sdpa/eager {t['sdpa_over_eager']:.2f}x -> {t['faster']}", flush=True)
    found = {p: eager_max_seq(rows, p) for p in args.precisions}
    notes = [f"{p}: eager faster than sdpa at every measured length up to seq {found[p]} (0 = not even at the "
             f"shortest, {min(args.seqs)})" for p in args.precisions]
    for p in args.precisions:
        same = found[p] == CPU_EAGER_MAX_SEQ.get(p)
        notes.append(f"the rule's CPU_EAGER_MAX_SEQ[{p!r}] = {CPU_EAGER_MAX_SEQ.get(p)}: "
                     + ("matches this run" if same else f"differs from this run's {found[p]}; update it"))
    for n in notes:
        print(n)
    write_artifact("bench_attn_rule", table, extra={
        "settings": vars(args), "measurements": rows, "eager_max_seq": found,
        "columns": ["precision", "seq", "batch", "eager_step_s", "sdpa_step_s", "sdpa_over_eager", "faster"],
        "headers": ["precision", "seq", "batch", "eager s/step", "sdpa s/step", "sdpa / eager", "faster"],
        "notes": notes})


if __name__ == "__main__":
    main()
