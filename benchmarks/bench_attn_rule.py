#!/usr/bin/env python
"""Where ``--attn auto`` switches: eager vs SDPA training step time by sequence length, at fp32 and bf16.

  python benchmarks/bench_attn_rule.py [--model small] [--seqs 64 128 256 512 1024] [--steps 6]

One real training step as the loop runs it (chunked loss, backward, AdamW; the
forward under CPU autocast for bf16), one thread, in this one process: for each
(precision, seq) one model is built, and eager and SDPA alternate step by step
(``install_attention`` swaps only the modules' classes), so a change in the
machine's load hits both sides alike. Every step holds the same number of
tokens (``--tokens``; batch = tokens / seq). After one untimed step of each,
``--steps`` timed steps of each run; the comparison is the median step time
of each side.

The rule's constant, ``ecomkit.models.attention_rule.CPU_EAGER_MAX_SEQ``,
is :func:`~ecomkit.models.attention_rule.eager_max_seq` of this artifact's
rows; ``tests/test_attention_rule.py`` recomputes it from the newest artifact.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch
from common import warn_emulated_bf16, write_artifact

from ecomkit.config import TrainConfig
from ecomkit.models.attention import install_attention
from ecomkit.models.attention_rule import CPU_EAGER_MAX_SEQ, EAGER_MIN_GAIN, eager_max_seq
from ecomkit.models.bloom import build_model
from ecomkit.models.loss import install_chunked_loss

def measure(model_name: str, precision: str, seq: int, batch: int, steps: int, seed: int = 0) -> list[dict]:
    """``steps`` timed training steps of each attention at ``seq``, alternating eager / sdpa, on one model."""
    torch.manual_seed(seed)
    model = build_model(model_name)
    install_chunked_loss(model, TrainConfig().loss_chunk_tokens)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, model.config.vocab_size, (batch, seq))
    mask = torch.ones_like(ids)
    mask[-1, seq - seq // 8:] = 0  # one right-padded row, as ecomkit's collate makes
    labels = ids.masked_fill(mask == 0, -100)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext

    def step(attn: str) -> float:
        install_attention(model, attn)
        t0 = time.perf_counter()
        with autocast():
            loss = model(input_ids=ids, attention_mask=mask, token_loss_labels=labels).loss / mask.sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    step("eager"), step("sdpa")  # untimed: first-call allocations and kernel choice for both
    rows = []
    for k in range(steps):
        for attn in (("eager", "sdpa") if k % 2 == 0 else ("sdpa", "eager")):
            rows.append({"precision": precision, "seq": seq, "batch": batch, "attn": attn, "step": k,
                         "step_s": step(attn)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per step (batch = tokens / seq)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps of each attention per (precision, seq)")
    args = ap.parse_args()
    warn_emulated_bf16(args.precisions, "--precisions fp32 skips bf16.")
    torch.set_num_threads(1)
    print(f"model={args.model}, {args.tokens} tokens per step, {args.steps} timed steps of each attention, "
          f"alternating, 1 thread, load average {os.getloadavg()[0]:.1f}\n", flush=True)
    rows, table = [], []
    for precision in args.precisions:
        for seq in args.seqs:
            batch = max(1, args.tokens // seq)
            rows += measure(args.model, precision, seq, batch, args.steps)
            med = {a: statistics.median(r["step_s"] for r in rows if r["precision"] == precision
                                        and r["seq"] == seq and r["attn"] == a) for a in ("eager", "sdpa")}
            table.append({"precision": precision, "seq": seq, "batch": batch, "eager_step_s": med["eager"],
                          "sdpa_step_s": med["sdpa"], "sdpa_over_eager": med["sdpa"] / med["eager"],
                          "faster": "eager" if med["eager"] < med["sdpa"] else "sdpa"})  # eager_max_seq needs a margin
            t = table[-1]
            print(f"{precision} seq {seq:>5} batch {batch:>3}: eager {t['eager_step_s']:.3f} s, sdpa "
                  f"{t['sdpa_step_s']:.3f} s, sdpa/eager {t['sdpa_over_eager']:.2f}x -> {t['faster']}", flush=True)
    found = {p: eager_max_seq(rows, p) for p in args.precisions}
    notes = [f"{p}: eager faster than sdpa by more than {EAGER_MIN_GAIN:.0%} at every measured length up to seq "
             f"{found[p]} (0 = not even at the shortest, {min(args.seqs)})" for p in args.precisions]
    for n in notes:
        print(n)
    for p in args.precisions:   # printed, not kept: tests/test_attention_rule.py holds the constant to the artifact
        same = found[p] == CPU_EAGER_MAX_SEQ.get(p)
        print(f"the rule's CPU_EAGER_MAX_SEQ[{p!r}] = {CPU_EAGER_MAX_SEQ.get(p)}: "
              + ("matches this run" if same else f"differs from this run's {found[p]}; update it"))
    write_artifact("bench_attn_rule", table, extra={
        "settings": vars(args), "measurements": rows, "eager_max_seq": found,
        "columns": ["precision", "seq", "batch", "eager_step_s", "sdpa_step_s", "sdpa_over_eager", "faster"],
        "headers": ["precision", "seq", "batch", "eager s/step", "sdpa s/step", "sdpa / eager", "faster"],
        "notes": notes})


if __name__ == "__main__":
    main()
