"""bf16 on CPU plateaus in memory on varied lengths (models/precision.py; docs/perf.md "bf16 on CPU: memory").

One fresh process (its peak RSS is this run's alone) trains the tiny preset
under bf16 autocast for 150 steps on the instruction task, whose
length-bucketed batches change length almost every step. Measured with exact
batch lengths (before the fix): peak RSS 1,080 MiB at step 50 and 1,346 MiB
at step 150 (ratio 1.25, still rising). With lengths rounded to multiples of
16: 658 and 705 MiB (1.07); fp32 with exact lengths: 1.05. 100 steps would
not do: the unfixed run's step-100 / step-50 ratio is 1.14, inside the bound.
On a Xeon with AMX (larger oneDNN primitives), rounded lengths alone gave
1.19 (774 → 915 MiB): the chunked loss's LM head saw a new row count (the
labeled positions) almost every step. With those rows topped up to a
multiple of 16 as well (models/loss.py): 689 → 701 MiB (1.02).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.data import write_jsonl
from ecomkit.data.toy_tasks import instruction_rows
from ecomkit.models.precision import length_multiple

PLATEAU = 1.15   # bucketed: peak RSS at step 150 ≤ 1.15 × at step 50
PACKED_PLATEAU = 1.10   # packed: peak RSS at step 120 ≤ 1.10 × at step 40


def _config(out_dir: str) -> TrainConfig:
    return TrainConfig(model="tiny", task="nlu", n_rows=2000, seq_len=256, micro_batch_size=16, precision="bf16",
                       lr=1e-3, max_steps=150, eval_interval=0, eval_batches=1, eval_nlu_samples=0,
                       final_eval_samples=32, save_model=False, progress=False, output_dir=out_dir, packing="off")


def _packed_config(out_dir: str) -> TrainConfig:
    """Varied-length instruction rows (20 to ~900 tokens), packed into sequences of --seq-len auto."""
    data = write_jsonl(instruction_rows(1500, seed=5), Path(out_dir) / "instructions.jsonl")
    return TrainConfig(model="tiny", task="nlu", data=str(data), micro_batch_size=4, precision="bf16", lr=1e-3,
                       max_steps=120, eval_interval=0, eval_batches=1, eval_nlu_samples=0, gen_eval_samples=0,
                       final_eval_samples=32, save_model=False, progress=False, output_dir=out_dir, packing="on", report_to="none")


def test_length_multiple_only_under_cpu_autocast():
    cpu = torch.device("cpu")
    assert length_multiple("bf16", cpu) == length_multiple("fp16", cpu) == 16
    assert length_multiple("fp32", cpu) is None
    assert length_multiple("bf16", torch.device("cuda")) is None


@pytest.mark.slow
def test_bf16_peak_rss_plateaus_on_varied_lengths(tmp_path: Path):
    subprocess.run([sys.executable, __file__, str(tmp_path)], check=True, timeout=600)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    peak = {r["step"]: r["peak_mem_bytes"] for r in rows if r["type"] == "train"}
    lengths = {r["padded_tokens"] // r["samples"] for r in rows if r["type"] == "train"}
    # rounded to multiples of 16 by the fix; the unfixed run saw a new length almost every step
    assert len(lengths) >= 5, f"the data must vary in length to test this; batch lengths seen: {sorted(lengths)}"
    assert peak[150] <= PLATEAU * peak[50], (
        f"bf16 peak RSS still growing: {peak[50] / 2**20:.0f} MiB at step 50, {peak[150] / 2**20:.0f} MiB at step "
        f"150 (ratio {peak[150] / peak[50]:.2f} > {PLATEAU})")


@pytest.mark.slow
def test_bf16_peak_rss_plateaus_on_packed_varied_length_instructions(tmp_path: Path):
    """Packed, every batch has one shape: the growth that length rounding only bounded does not start."""
    subprocess.run([sys.executable, __file__, str(tmp_path), "packed"], check=True, timeout=600)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["type"] == "train"]
    peak = {r["step"]: r["peak_mem_bytes"] for r in train}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["packing"] and len({r["padded_tokens"] for r in train}) == 1     # one shape, every step
    lengths = summary["data"]["lengths"]["train"]["row"]
    assert lengths["max"] > 8 * lengths["p50"] // 2, lengths     # the rows do vary: a long tail
    assert peak[120] <= PACKED_PLATEAU * peak[40], (
        f"packed bf16 peak RSS still growing: {peak[40] / 2**20:.0f} MiB at step 40, {peak[120] / 2**20:.0f} MiB "
        f"at step 120 (ratio {peak[120] / peak[40]:.2f} > {PACKED_PLATEAU})")


if __name__ == "__main__":  # the worker: one process, no torchrun needed
    from ecomkit.train.loop import run_training

    run_training((_packed_config if sys.argv[2:] == ["packed"] else _config)(sys.argv[1]))
