#!/usr/bin/env python
"""Where ``--attn auto`` switches: eager vs SDPA training step time by sequence length and precision, per device.

  python benchmarks/bench_attn_rule.py [--model small] [--seqs 64 128 256 512 1024] [--steps 6]   # CPU
  python benchmarks/bench_attn_rule.py                       # on a CUDA GPU: its own settings, below
  python benchmarks/bench_attn_rule.py --dry-run --out DIR   # the GPU settings' code path on CPU, tiny

One real training step as the loop runs it (chunked loss, backward, AdamW; the
forward under autocast for bf16), in this one process: for each (precision,
seq, micro-batch) one model is built, and eager and SDPA alternate step by step
(``install_attention`` swaps only the modules' classes), so a change in the
machine's load hits both sides alike. After ``--untimed`` steps of each,
``--steps`` timed steps of each run; the comparison is the median step time of
each side.

- **CPU** (one thread): every step holds the same number of tokens
  (``--tokens``; batch = tokens / seq), one row right-padded by an eighth.
  ``ecomkit.models.attention.CPU_EAGER_MAX_SEQ`` is
  :func:`~ecomlab.derive.attention.eager_max_seq` of the newest CPU
  artifact's rows.
- **CUDA**: SeqGPT-560M's real shape (vocabulary 250,880) built on the GPU,
  fp32 weights under bf16 autocast as the loop trains, micro-batches 8 and 16,
  rows padded as bucketed catalog rows are (each row's length drawn between
  half and all of ``seq``, one row full), 3 untimed and 10 timed steps of
  each, synchronised. ``GPU_EAGER_MAX_SEQ[kind]`` is ``eager_max_seq`` of the
  newest artifact of that GPU kind (eager must win at both micro-batches).

``tests/test_attention_rule.py`` recomputes both tables from the artifacts. ``--budget-s`` skips the cases that
would start after it (recorded as skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import warn_emulated_bf16, write_artifact

from ecomkit.config import TrainConfig
from ecomkit.hardware import device_kind
from ecomkit.fast.attention import install_attention
from ecomkit.models.attention import CPU_EAGER_MAX_SEQ, GPU_EAGER_MAX_SEQ
from ecomkit.models.bloom import build_model, preset_config
from ecomkit.models.loss import TokenLoss, lm_loss_sum
from ecomlab.derive.attention import EAGER_MIN_GAIN, eager_max_seq

GPU_SETTINGS = {"model": "seqgpt-560m", "precisions": ["bf16"], "batches": [8, 16], "seqs": [64, 128, 256, 512, 1024],
                "untimed": 3, "steps": 10, "ragged": True}
DRY_RUN_SETTINGS = {"model": "tiny", "precisions": ["bf16"], "batches": [2, 4], "seqs": [32, 64], "untimed": 1,
                    "steps": 1, "ragged": True}


def padding_mask(batch: int, seq: int, ragged: bool, device: torch.device) -> torch.Tensor:
    """Right padding: catalog-like (lengths between seq/2 and seq, one row full), or one row short by an eighth."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    if ragged:
        g = torch.Generator().manual_seed(seq * 1000 + batch)
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
        lengths[0] = seq
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    else:
        mask[-1, seq - seq // 8:] = 0
    return mask.to(device)


def build(model_name: str, device: torch.device) -> torch.nn.Module:
    """Random weights, fp32, made on ``device`` (a 560M model initialised on a CPU first would take a minute)."""
    if device.type == "cpu":
        return build_model(model_name)
    from transformers import BloomForCausalLM

    torch.manual_seed(0)
    with device:
        return BloomForCausalLM(preset_config(model_name))


def measure(model_name: str, precision: str, seq: int, batch: int, steps: int, device: torch.device | None = None,
            untimed: int = 1, ragged: bool = False, seed: int = 0) -> list[dict]:
    """``steps`` timed training steps of each attention at ``seq``, alternating eager / sdpa, on one model."""
    device = device or torch.device("cpu")
    torch.manual_seed(seed)
    model = build(model_name, device)
    loss_fn = TokenLoss("chunked", TrainConfig().loss_chunk_tokens)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, model.config.vocab_size, (batch, seq), device=device)
    mask = padding_mask(batch, seq, ragged, device)
    labels = ids.masked_fill(mask == 0, -100)
    autocast = ((lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16"
                else contextlib.nullcontext)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(attn: str) -> float:
        install_attention(model, attn)
        sync()
        t0 = time.perf_counter()
        with autocast():
            loss = lm_loss_sum(model, loss_fn, ids, mask, labels) / mask.sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0

    for _ in range(untimed):   # first-call allocations, kernel choice and autotuning for both
        step("eager"), step("sdpa")
    padding = 1 - float(mask.float().mean())
    rows = []
    for k in range(steps):
        for attn in (("eager", "sdpa") if k % 2 == 0 else ("sdpa", "eager")):
            rows.append({"precision": precision, "seq": seq, "batch": batch, "attn": attn, "step": k,
                         "step_s": step(attn), "padding": padding})
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def summary_row(rows: list[dict], precision: str, seq: int, batch: int) -> dict[str, Any]:
    med = {a: statistics.median(r["step_s"] for r in rows if r["precision"] == precision and r["seq"] == seq
                                and r["batch"] == batch and r["attn"] == a) for a in ("eager", "sdpa")}
    padding = next(r["padding"] for r in rows if r["seq"] == seq and r["batch"] == batch)
    return {"precision": precision, "seq": seq, "batch": batch, "padding": padding, "eager_step_s": med["eager"],
            "sdpa_step_s": med["sdpa"], "sdpa_over_eager": med["sdpa"] / med["eager"],
            "faster": "eager" if med["eager"] < med["sdpa"] else "sdpa"}   # eager_max_seq needs a margin


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="preset (CPU default small; GPU default seqgpt-560m)")
    ap.add_argument("--seqs", type=int, nargs="+", default=None, help="lengths (default 64 128 256 512 1024)")
    ap.add_argument("--precisions", nargs="+", default=None, choices=["fp32", "bf16"],
                    help="CPU default fp32 bf16; GPU default bf16")
    ap.add_argument("--batches", type=int, nargs="+", default=None,
                    help="micro-batches per length (GPU default 8 16; CPU: tokens / seq)")
    ap.add_argument("--tokens", type=int, default=2048, help="CPU: tokens per step (batch = tokens / seq)")
    ap.add_argument("--untimed", type=int, default=None, help="untimed steps of each attention first (CPU 1, GPU 3)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps of each attention per case (CPU 6, GPU 10)")
    ap.add_argument("--budget-s", type=float, default=0.0, help="skip the cases that would start after this many "
                    "seconds (0: no limit)")
    ap.add_argument("--dry-run", action="store_true", help="the GPU settings on the CPU, tiny and short; the "
                    "artifact goes to --out (default runs/bench_attn_rule_dryrun/), never to benchmarks/results/")
    ap.add_argument("--out", default=None, help="artifact folder (default benchmarks/results/)")
    return ap.parse_args(argv)


def resolve(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The run's settings: the CPU's defaults, the GPU's, or the dry run's; flags override."""
    if args.dry_run:
        base = dict(DRY_RUN_SETTINGS)
    elif device.type == "cuda":
        base = dict(GPU_SETTINGS)
    else:
        base = {"model": "small", "precisions": ["fp32", "bf16"], "batches": None,
                "seqs": [64, 128, 256, 512, 1024], "untimed": 1, "steps": 6, "ragged": False}
    for key in ("model", "precisions", "batches", "seqs", "untimed", "steps"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    return base


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.dry_run else torch.device("cpu")
    st = resolve(args, device)
    kind = device_kind(device)
    if device.type == "cpu":
        if not args.dry_run:
            warn_emulated_bf16(st["precisions"], "--precisions fp32 skips bf16.")
        torch.set_num_threads(1)
    print(f"{'DRY RUN (CPU)' if args.dry_run else kind}: model={st['model']}, {st['untimed']} untimed and "
          f"{st['steps']} timed steps of each attention, alternating, "
          + ("catalog-like padded rows" if st["ragged"] else f"{args.tokens} tokens per step")
          + f", load average {os.getloadavg()[0]:.1f}\n", flush=True)
    deadline = time.monotonic() + args.budget_s if args.budget_s else float("inf")
    rows, table, skipped = [], [], []
    for precision in st["precisions"]:
        for seq in st["seqs"]:
            for batch in st["batches"] or [max(1, args.tokens // seq)]:
                if time.monotonic() > deadline:
                    skipped.append({"precision": precision, "seq": seq, "batch": batch})
                    continue
                rows += measure(st["model"], precision, seq, batch, st["steps"], device, st["untimed"], st["ragged"])
                table.append(summary_row(rows, precision, seq, batch))
                t = table[-1]
                print(f"{precision} seq {seq:>5} batch {batch:>3}: eager {t['eager_step_s']:.4f} s, sdpa "
                      f"{t['sdpa_step_s']:.4f} s, sdpa/eager {t['sdpa_over_eager']:.2f}x -> {t['faster']}", flush=True)
    done = sorted({r["precision"] for r in rows})
    found = {p: eager_max_seq(rows, p) for p in done}
    where = "CPU" if device.type == "cpu" else kind
    notes = [f"{p}: eager faster than sdpa by more than {EAGER_MIN_GAIN:.0%} at every measured length (and "
             f"micro-batch) up to seq {found[p]} on {where} (0 = not even at the shortest, {min(st['seqs'])})"
             for p in done]
    if skipped:
        notes.append(f"skipped after --budget-s {args.budget_s:.0f}: " + ", ".join(
            f"{s['precision']} seq {s['seq']} batch {s['batch']}" for s in skipped))
    table_now = CPU_EAGER_MAX_SEQ if device.type == "cpu" else GPU_EAGER_MAX_SEQ.get(kind, {})
    name = "CPU_EAGER_MAX_SEQ" if device.type == "cpu" else f"GPU_EAGER_MAX_SEQ[{kind!r}]"
    for p in done if not args.dry_run else ():   # tests/test_attention_rule.py holds the tables to the artifacts
        same = found[p] == table_now.get(p)
        notes.append(f"the rule's {name}[{p!r}] = {table_now.get(p)}: "
                     + ("matches this run" if same else f"differs from this run's {found[p]}; update it"))
    if args.dry_run:
        notes.append("dry run: the GPU settings' code path on a CPU, tiny; not a measurement of the rule")
    for n in notes:
        print(n)
    out = args.out or (str(Path(__file__).resolve().parents[1] / "runs" / "bench_attn_rule_dryrun")
                       if args.dry_run else None)
    write_artifact("bench_attn_rule", table, extra={
        "settings": {**vars(args), **st}, "device": device.type, "gpu_kind": None if device.type == "cpu" else kind,
        "dry_run": args.dry_run, "measurements": rows, "eager_max_seq": found, "skipped": skipped,
        "columns": ["precision", "seq", "batch", "padding", "eager_step_s", "sdpa_step_s", "sdpa_over_eager",
                    "faster"],
        "headers": ["precision", "seq", "batch", "padding", "eager s/step", "sdpa s/step", "sdpa / eager", "faster"],
        "notes": notes}, results_dir=out)


if __name__ == "__main__":
    sys.exit(main())
