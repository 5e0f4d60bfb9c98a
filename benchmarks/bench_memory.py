"""Chapter 06 benchmark: length bucketing (padding rate, tokens/s) and the step-time cost of checkpointing.

Both variants of each comparison run side by side in this process, on this machine:

- random vs length-bucketed micro-batches of the synthetic catalog (real token
  lengths): padding rate over a whole epoch, and real (non-pad) tokens/s of
  forward + backward on a small BLOOM. Goal: bucketed padding <= 5 %.
- activation checkpointing off vs on at a long sequence: step time ratio
  (one extra forward per block) and the saved-activation
  factor, measured next to the planner's prediction.

    python benchmarks/bench_memory.py [--rows 6000] [--batches 30] [--seq-len 1024]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from common import print_table, verdict, write_artifact  # noqa: E402

PADDING_GOAL = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--batches", type=int, default=30, help="timed micro-batches per batching mode")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024, help="sequence length of the checkpointing run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    import datasets

    from ecomkit.data import generate_catalog, tokenize_records
    from ecomkit.models.tokenizer import get_tokenizer
    from ecomkit.planner.activations import checkpointing_factor
    from ecomkit.planner.shapes import model_shape
    from ecomkit.train.loop import tokenizer_cache_dir
    from ecomlab.measure import memory_tuning as mt
    from ecomlab.measure.activations import disable_checkpointing, enable_checkpointing, measure_step_memory, time_step

    datasets.disable_progress_bars()
    tok = get_tokenizer("local", tokenizer_cache_dir())
    lengths = tokenize_records(generate_catalog(args.rows, seed=0), tok, "lm", 256)["length"]
    cfg = mt.long_context_config(hidden=256, n_layer=4, n_head=8, vocab_size=len(tok))

    print(f"== length bucketing: {len(lengths):,} samples, micro-batch {args.micro_batch}, {args.batches} timed batches each")
    rows = mt.bucketing_experiment(lengths, cfg, micro_batch=args.micro_batch, n_batches=args.batches)
    print_table(rows, ["batching", "padding_rate_epoch", "padding_rate_measured_batches", "real_tokens", "seconds",
                       "tokens_per_s"])
    by = {r["batching"]: r for r in rows}
    speed = by["bucketed"]["tokens_per_s"] / by["random"]["tokens_per_s"]
    print(f"bucketed / random tokens/s: {speed:.2f}x")
    padding_line = verdict("bucketed padding rate", by["bucketed"]["padding_rate_epoch"], f"<= {PADDING_GOAL:.0%}",
                           by["bucketed"]["padding_rate_epoch"] <= PADDING_GOAL)

    print(f"\n== activation checkpointing: hidden 256, 4 blocks, batch 2, T={args.seq_len}, {args.repeats} timed steps each")
    model = mt.build_probe_model(cfg)
    ids, mask = mt.random_batch(cfg.vocab_size, 2, args.seq_len)
    off_t = time_step(model, ids, mask, repeats=args.repeats)
    off_m = measure_step_memory(model, ids, mask)
    enable_checkpointing(model)
    on_t = time_step(model, ids, mask, repeats=args.repeats)
    on_m = measure_step_memory(model, ids, mask)
    disable_checkpointing(model)
    ratio = on_t / off_t
    table = [{"checkpointing": "off", "step_s": off_t, "saved_MiB": off_m.saved_bytes / 2**20, "peak_MiB": off_m.peak / 2**20},
             {"checkpointing": "on", "step_s": on_t, "saved_MiB": on_m.saved_bytes / 2**20, "peak_MiB": on_m.peak / 2**20}]
    print_table(table, ["checkpointing", "step_s", "saved_MiB", "peak_MiB"])
    predicted = checkpointing_factor(model_shape(cfg), 2, args.seq_len, device="cpu")
    print(f"saved-activation factor: measured {off_m.saved_bytes / on_m.saved_bytes:.2f}, planner {predicted:.2f}")
    print(f"step-time cost of checkpointing: {ratio:.2f}x (one extra forward per block; 4/3 if backward took twice "
          "the forward, more when attention's softmax/elementwise work makes backward relatively cheaper)")
    artifact_rows = [{"part": "batching", **r} for r in rows] + [{"part": "checkpointing", **r} for r in table]
    write_artifact("bench_memory", artifact_rows, extra={
        "settings": vars(args),
        "columns": ["part", "batching", "padding_rate_epoch", "tokens_per_s", "checkpointing", "step_s", "saved_MiB",
                    "peak_MiB"],
        "notes": [padding_line, f"bucketed / random real tokens/s: {speed:.2f}×",
                  f"activation checkpointing: step time {ratio:.2f}×, saved activations "
                  f"{off_m.saved_bytes / on_m.saved_bytes:.2f}× smaller (planner: {predicted:.2f}×)"]})


if __name__ == "__main__":
    main()
