#!/usr/bin/env python
"""Peak RSS of a ZeRO-3 run with BLOOM's real 250,880-token vocabulary on a small body: chunked loss against full logits.

  python benchmarks/bench_zero_loss.py [--pairs 3] [--hidden 256] [--layers 2] [--seq-len 128] [--micro-batch-size 4]

One local checkpoint, saved once: BLOOM with the vocabulary of SeqGPT-560M and EcomGPT-7B (250,880 tokens) and a
small body (``--hidden``, ``--layers``), so the LM head's logits are the large tensors of a step, as they are in
the real models. Each pair trains it with ``scripts/03_zero3.py`` under torchrun (2 processes, ZeRO-3, fp32, its
own fresh processes) twice: ``--loss-kernel chunked`` and ``--loss-kernel full``, the order alternating from pair
to pair, on two jobs:

- ``nlu``: the catalog's SeqGPT-style instructions, the loss on the answers only (the chunked loss keeps only
  the labeled positions; the full logits cover every position);
- ``lm``: causal text, every position labeled, ``--loss-chunk-tokens 128`` (micro-batch × seq-len positions in
  several chunks: the chunked loss's own saving).

The figure is each run's peak RSS (rank 0's ``ru_maxrss``, the summary's ``peak_mem_bytes``, the process's whole
life up to its last training step, model load included); the ratio chunked / full is taken pair by pair.
Goal (not moved when missed): the chunked loss's median peak below the full logits' in both jobs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import print_table, rotating_rounds, verdict, write_artifact

from ecomkit.models.bloom import build_model, preset_config
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.train.loop import tokenizer_cache_dir

REAL_VOCAB = 250_880
JOBS = {"nlu": ["--task", "nlu"], "lm": ["--task", "lm", "--loss-chunk-tokens", "128"]}
KERNELS = ("chunked", "full")
MIB = 2**20


def save_checkpoint(folder: Path, hidden: int, layers: int) -> Path:
    """A small BLOOM with the real vocabulary and the catalog's tokenizer, saved as the loop loads a local model."""
    tok = get_tokenizer("local", tokenizer_cache_dir())
    cfg = preset_config("tiny", REAL_VOCAB)
    cfg.hidden_size, cfg.n_layer, cfg.n_head = hidden, layers, max(1, hidden // 64)
    model = build_model(cfg, seed=0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="runs of each kernel per job (fresh processes each)")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size of the small body")
    ap.add_argument("--layers", type=int, default=2, help="blocks of the small body")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    folder = save_checkpoint(Path(tempfile.mkdtemp(prefix="ecomkit-zero-loss-")) / "model", args.hidden, args.layers)
    common = ["--model", str(folder), "--tokenizer", str(folder), "--zero-stage", "3", "--precision", "fp32",
              "--seq-len", str(args.seq_len), "--micro-batch-size", str(args.micro_batch_size), "--grad-accum", "1",
              "--max-steps", str(args.steps), "--warmup-steps", "1", "--n-rows", "400", "--eval-interval", "0",
              "--eval-batches", "1", "--no-save-model", "--report-to", "none"]
    jobs = {f"{job} {kernel}": ("03_zero3.py", common + flags + ["--loss-kernel", kernel], 2)
            for job, flags in JOBS.items() for kernel in KERNELS}
    runs = rotating_rounds(jobs, args.pairs, describe=lambda s: (
        f"peak RSS {s['peak_mem_bytes'] / MIB:,.0f} MiB, loss {s['final_loss']:.4f}, "
        f"loss kernel {s['config']['loss_kernel']}"))
    rows, notes, ok = [], [], True
    for job in JOBS:
        chunked, full = runs[f"{job} chunked"], runs[f"{job} full"]
        assert all(r["config"]["loss_kernel"] == k for k, rs in (("chunked", chunked), ("full", full)) for r in rs)
        ratios = [c["peak_mem_bytes"] / f["peak_mem_bytes"] for c, f in zip(chunked, full)]
        for kernel, rs in (("chunked", chunked), ("full", full)):
            peaks = [r["peak_mem_bytes"] / MIB for r in rs]
            rows.append({"job": job, "loss kernel": kernel, "runs": len(rs), "peak RSS MiB (median)":
                         statistics.median(peaks), "min": min(peaks), "max": max(peaks),
                         "final loss (first run)": rs[0]["final_loss"]})
        median = statistics.median(ratios)
        ok &= median < 1.0
        notes.append(f"{job}: chunked / full peak RSS {median:.2f}× (median of {len(ratios)} pairs; "
                     f"{min(ratios):.2f}–{max(ratios):.2f})")
        verdict(f"{job}: chunked / full peak RSS", median, "< 1.0", median < 1.0)
    columns = list(rows[0])
    print_table(rows, columns)
    for line in notes:
        print(line)
    shape = (f"BLOOM with vocabulary {REAL_VOCAB:,}, hidden {args.hidden}, {args.layers} blocks; ZeRO-3 on 2 "
             f"processes, fp32, micro-batch {args.micro_batch_size} × {args.seq_len}, {args.steps} steps")
    write_artifact("bench_zero_loss", rows, {"columns": columns, "notes": [shape, *notes], "goal_met": ok,
                                             "pairs": [[c["peak_mem_bytes"], f["peak_mem_bytes"]]
                                                       for job in JOBS for c, f in zip(runs[f"{job} chunked"],
                                                                                       runs[f"{job} full"])]})


if __name__ == "__main__":
    main()
