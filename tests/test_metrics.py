"""Throughput accounting: totals over the steady phase, never a mean of per-step rates."""

from __future__ import annotations

import pytest
import torch

from ecomkit.metrics import (attention_length, data_line, print_run_summary, throughput_lines, throughput_summary,
                             time_split)
from ecomkit.models.bloom import flops_per_token
from ecomlab.rates import concurrent_ceiling, paired_ratios, pooled_rate, replicated_work_bound


def _rows(step_times, samples=16, tokens_per_sample=100):
    return [{"step_time_s": t, "samples": samples, "tokens": samples * tokens_per_sample} for t in step_times]


def test_uneven_steps_are_divided_as_totals():
    # warm-up 5 s, then one slow bucket (0.4 s) and three fast ones (0.1 s): 64 samples in 0.7 s
    s = throughput_summary(_rows([5.0, 0.4, 0.1, 0.1, 0.1]), warmup_steps=1)
    assert s["steady_steps"] == 4
    assert s["samples_per_s"] == pytest.approx(64 / 0.7)
    assert s["tokens_per_s"] == pytest.approx(6400 / 0.7)
    mean_of_rates = sum(16 / t for t in (0.4, 0.1, 0.1, 0.1)) / 4
    assert mean_of_rates > 1.4 * s["samples_per_s"]       # the old accounting overstated it
    assert s["step_time_s"] == pytest.approx(0.7 / 4)
    assert s["step_time_median_s"] == pytest.approx(0.1)
    assert s["step_time_p90_s"] == pytest.approx(0.4 - 0.3 * 0.3)   # between the two largest of 4 values


def test_slowest_rank_sets_the_pace():
    rows = _rows([1.0, 0.5, 0.5])
    own = throughput_summary(rows)
    slow = throughput_summary(rows, slowest_rank_steady_s=2.0)
    assert own["samples_per_s"] == pytest.approx(32 / 1.0)
    assert slow["samples_per_s"] == pytest.approx(32 / 2.0)
    # a faster "slowest" figure than our own cannot speed us up
    assert throughput_summary(rows, slowest_rank_steady_s=0.1)["samples_per_s"] == pytest.approx(32 / 1.0)


def test_short_runs_keep_their_rows():
    s = throughput_summary(_rows([0.2]), warmup_steps=1)
    assert s["steady_steps"] == 1 and s["samples_per_s"] == pytest.approx(80.0)
    assert throughput_summary([], warmup_steps=1)["steady_steps"] == 0


def test_padding_rate_over_the_steady_steps():
    rows = [{"step_time_s": 1.0, "samples": 2, "tokens": 10, "padded_tokens": 40},   # warm-up, left out
            {"step_time_s": 1.0, "samples": 2, "tokens": 30, "padded_tokens": 40},
            {"step_time_s": 1.0, "samples": 2, "tokens": 50, "padded_tokens": 60}]
    assert throughput_summary(rows)["padding_rate"] == pytest.approx(1 - 80 / 100)
    assert throughput_summary(_rows([0.1, 0.1]))["padding_rate"] is None   # rows without padded positions


def test_time_split_is_shares_of_totals():
    rows = [{"step_time_s": 9.0, "data_s": 9.0, "fwd_bwd_s": 0.0, "optim_s": 0.0},   # warm-up, left out
            {"step_time_s": 1.0, "data_s": 0.5, "fwd_bwd_s": 0.5, "optim_s": 0.0},
            {"step_time_s": 3.0, "data_s": 0.0, "fwd_bwd_s": 2.0, "optim_s": 0.5}]
    split = time_split(rows, warmup_steps=1)
    assert split == pytest.approx({"data": 0.5 / 4, "fwd_bwd": 2.5 / 4, "optim": 0.5 / 4, "other": 0.5 / 4})
    assert time_split([], 1) == {}


def test_printed_summary_shows_the_accounting(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    s = throughput_summary(_rows([5.0, 0.4, 0.1, 0.1, 0.1]), slowest_rank_steady_s=0.8)
    summary = {"strategy": "ddp", "world_size": 2, "global_batch": 16, "first_loss": 9.0, "final_loss": 5.0,
               "eval_loss": 5.5, "peak_mem_bytes": 2**20, "output_dir": "runs/x", **s}
    print_run_summary(summary)
    out = capsys.readouterr().out
    assert "80.0 samples/s" in out and "(totals over 4 steady steps / 0.80 s, slowest of 2 ranks)" in out
    assert "200 ms mean, 100 ms median, 310 ms p90" in throughput_lines(summary)


def test_data_line_counts_an_eval_file_apart_from_the_training_rows():
    """With --eval-data the eval records are not among the training file's rows: no "1,700 of 1,500 rows"."""
    facts = {"rows_read": 1500, "rows_valid": 1500, "max_rows": None, "records_used": 1700, "train_records": 1500,
             "eval_records": 200, "eval_rows_read": 200, "examples_per_kind": {"extract": 1700}}
    assert "1,500 of 1,500 training rows used, 200 of 200 eval-file rows;" in data_line({"data": facts})
    capped = {**facts, "max_rows": 1000, "train_records": 1000, "records_used": 1200}
    assert "1,000 of 1,500 training rows used, capped by max_rows=1,000," in data_line({"data": capped})
    split = {**facts, "eval_rows_read": None, "train_records": 1425, "eval_records": 75, "records_used": 1500}
    assert "1,500 of 1,500 rows used (1,425 train / 75 eval)" in data_line({"data": split})


def test_mfu_attention_term_uses_the_real_lengths_not_the_truncation_length():
    """Two sequences of 10 and 30 real tokens (padded to 30, truncation 128): the FLOPs of each counted exactly."""
    n_params, n_layer, hidden = 1_000_000, 4, 64
    lengths = [10, 30]
    exact = sum(L * flops_per_token(n_params, n_layer, hidden, L) for L in lengths)  # each sequence on its own
    mask = torch.tensor([[1] * 10 + [0] * 20, [1] * 30])
    tokens, squared = float(mask.sum()), float((mask.sum(dim=1) ** 2).sum())  # what the loop reduces
    assert attention_length(tokens, squared) == pytest.approx(25.0)  # (100 + 900) / 40, not 20 (mean) or 128
    assert tokens * flops_per_token(n_params, n_layer, hidden, attention_length(tokens, squared)) == pytest.approx(exact)
    assert tokens * flops_per_token(n_params, n_layer, hidden, 128) > 1.01 * exact  # what cfg.seq_len overstated
    assert attention_length(0.0, 0.0) == 0.0


def test_replicated_work_bound_is_amdahl():
    assert replicated_work_bound(2, 0.0) == pytest.approx(2.0)
    assert replicated_work_bound(8, 1.0) == pytest.approx(1.0)
    assert replicated_work_bound(2, 0.05) == pytest.approx(1 / 0.525)       # 1.905: AdamW at 5 % of the step
    bounds = [replicated_work_bound(n, 0.1) for n in (1, 2, 4, 8, 64)]
    assert bounds[0] == pytest.approx(1.0) and bounds == sorted(bounds) and bounds[-1] < 10.0   # never past 1/f
    with pytest.raises(ValueError):
        replicated_work_bound(0, 0.1)
    with pytest.raises(ValueError):
        replicated_work_bound(2, 1.5)


def test_concurrent_ceiling_sums_the_copies():
    assert concurrent_ceiling(10.0, [9.0, 9.5]) == pytest.approx(1.85)
    assert concurrent_ceiling(10.0, [10.0, 10.0, 10.0, 10.0]) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        concurrent_ceiling(0.0, [1.0])
    with pytest.raises(ValueError):
        concurrent_ceiling(1.0, [])


def test_pooled_rate_divides_totals_not_a_mean_of_rates():
    fast = {"samples_per_s": 20.0, "steady_wall_s": 10.0}     # 200 samples
    slow = {"samples_per_s": 10.0, "steady_wall_s": 30.0}     # 300 samples
    assert pooled_rate([fast, slow]) == pytest.approx(500 / 40)   # 12.5, not the mean 15
    assert pooled_rate([fast]) == pytest.approx(20.0)
    with pytest.raises(ValueError):
        pooled_rate([])


def test_paired_ratios_pair_run_i_with_run_i():
    r = paired_ratios([20.0, 18.0, 22.0], [10.0, 10.0, 11.0])
    assert r.ratios == pytest.approx((2.0, 1.8, 2.0))
    assert r.median == pytest.approx(2.0) and r.spread == pytest.approx((1.8, 2.0))
    assert "median 2.00 of 3 pairs (range 1.80-2.00)" == r.describe()
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        paired_ratios([1.0], [0.0])
