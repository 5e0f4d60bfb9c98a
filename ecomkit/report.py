"""Short human-readable summaries printed at the end of a run (rank 0 only)."""

from __future__ import annotations

import os
from typing import Any


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def print_run_summary(summary: dict[str, Any]) -> None:
    if int(os.environ.get("RANK", 0)) != 0:
        return
    acc = "  ".join(f"{k}={v:.3f}" for k, v in summary.items() if k.startswith("acc_"))
    print(
        "\n=== run summary ===\n"
        f"strategy        {summary['strategy']} × {summary['world_size']} process(es), global batch {summary['global_batch']}\n"
        f"loss            {summary['first_loss']:.4f} → {summary['final_loss']:.4f} (train), eval {summary['eval_loss']:.4f}\n"
        + (f"eval accuracy   {acc}\n" if acc else "")
        + f"throughput      {summary['samples_per_s']:.1f} samples/s, {summary['tokens_per_s']:.0f} tokens/s "
        f"({summary['step_time_s'] * 1000:.0f} ms/step)\n"
        f"peak memory     {format_bytes(summary['peak_mem_bytes'])} per rank\n"
        f"outputs         {summary['output_dir']} (metrics.jsonl, summary.json"
        + (f", model in {summary['model_dir']}" if summary.get("model_dir") else "") + ")\n",
        flush=True,
    )
