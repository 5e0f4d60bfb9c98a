"""Chapter 05 acceptance: compression hooks, byte counting, error feedback, bad input.

Unit tests run without a process group; the ``dist`` tests launch two gloo
processes and train several methods per launch (one process group). The overlap study (the bucket-size sweep,
the waited and un-waited async all-reduce) is launched and asserted by notebook 05, run by make test.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from conftest import main_in_process, run_script
from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.errors import ConfigError
from ecomkit.parallel.compression.hooks import InactiveCompression, register_compression
from ecomkit.parallel.compression.specs import parse_method_spec, parse_methods
from ecomkit.parallel.compression.topk import (densify, error_feedback_step, pack_message, select_topk,
                                               topk_count, unpack_message)
from ecomlab.measure.compression import byte_ratio_checks, error_feedback_effect, expected_byte_ratio
from ecomlab.measure.overlap import async_allreduce_verdict, bucket_sweep_summary

COMMON = ["--precision", "fp32", "--model", "tiny", "--n-rows", "300", "--seq-len", "32", "--eval-interval", "0", "--eval-batches", "1",
          "--warmup-steps", "1", "--no-progress", "--no-save-model", "--bucket-cap-mb", "0.25"]


# ---------------------------------------------------------------------- error feedback (unit)
def test_residual_plus_sent_equals_accumulated_gradient_exactly():
    g = torch.Generator().manual_seed(0)
    grad, residual = torch.randn(1000, generator=g), torch.randn(1000, generator=g) * 0.1
    values, indices, new_residual = error_feedback_step(grad, residual, ratio=0.05)
    assert values.numel() == 50
    sent = densify(values, indices, grad.numel())
    assert torch.equal(new_residual + sent, grad + residual)
    assert torch.count_nonzero(new_residual[indices]) == 0      # what was sent is not kept
    kept_max = new_residual.abs().max()
    assert values.abs().min() >= kept_max                      # the largest entries were sent


def test_error_feedback_delays_gradient_mass_but_never_loses_it():
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(500, dtype=torch.float64, generator=g) for _ in range(20)]
    residual, sent_total = None, torch.zeros(500, dtype=torch.float64)
    for grad in grads:
        values, indices, residual = error_feedback_step(grad, residual, ratio=0.02)
        sent_total += densify(values, indices, 500)
    torch.testing.assert_close(sent_total + residual, torch.stack(grads).sum(0))
    # without error feedback the dropped mass is gone for good
    dropped = sum(select_topk(grad, 10)[2] for grad in grads)
    assert dropped.abs().sum() > 0.5 * torch.stack(grads).sum(0).abs().sum()


def test_topk_count_and_message_round_trip_are_exact():
    assert topk_count(356_416, 0.01) == 3565 and topk_count(10, 1.0) == 10 and topk_count(3, 0.01) == 1
    values = torch.randn(4)
    indices = torch.tensor([0, 7, 2**24 + 1, 2**31 - 1])   # not representable as float32 values
    v, i = unpack_message(pack_message(values, indices), 4)
    assert torch.equal(v, values) and torch.equal(i, indices)


def test_world_size_one_compression_is_a_noop_and_says_so(caplog):
    cfg = TrainConfig()
    cfg.compression.method = "topk"
    with caplog.at_level(logging.WARNING, logger="ecomkit"):
        handle = register_compression(torch.nn.Linear(2, 2), cfg.compression, DistEnv())
    assert isinstance(handle, InactiveCompression)
    assert handle.pop_step_stats()["comm_bytes"] == 0
    assert "does nothing with world size 1" in caplog.text


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("setting, match", [
    ({"topk_ratio": 0.0}, "must be in (0, 1]"),
    ({"topk_ratio": -0.5}, "must be in (0, 1]"),
    ({"topk_ratio": 1.5}, "must be in (0, 1]"),
    ({"powersgd_rank": 0}, "powersgd_rank=0"),
    ({"method": "powersgd", "powersgd_start_iter": 1}, "must be >= 2"),
])
def test_bad_compression_values_raise_config_error(setting, match):
    cfg = TrainConfig()
    for key, value in setting.items():
        setattr(cfg.compression, key, value)
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        cfg.validate()


@pytest.mark.parametrize("strategy", ["zero", "fsdp"])
def test_compression_with_a_strategy_without_ddp_hooks_is_rejected(strategy):
    cfg = TrainConfig(strategy=strategy)
    cfg.compression.method = "powersgd"
    with pytest.raises(ConfigError, match="needs DDP communication hooks"):
        cfg.validate()


@pytest.mark.parametrize("args, match", [
    (["--compression-method", "topk", "--compression-topk-ratio", "0"], "must be in (0, 1]"),
    (["--compression-method", "topk", "--strategy", "zero"], "needs DDP communication hooks"),
])
def test_script_rejects_bad_input_before_any_process_group(args, match, tmp_path, monkeypatch, capsys):
    code, err = main_in_process("05_grad_compression.py", args + ["--output-dir", str(tmp_path)], monkeypatch, capsys)
    assert code == 2, err
    assert match in err and "Traceback" not in err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_method_specs_parse_and_bad_ones_fail():
    spec = parse_method_spec("topk:0.01:noef")
    assert (spec.method, spec.ratio, spec.error_feedback, spec.label) == ("topk", 0.01, False, "topk-0.01-noef")
    assert parse_method_spec("powersgd:4").rank == 4 and parse_method_spec("topk:0.1").error_feedback is True
    assert parse_method_spec("plain").count_bytes is False
    for bad in ("topk:x", "fp16:2", "topk_naive:0.25:noef", "gzip"):
        with pytest.raises(ConfigError):
            parse_method_spec(bad)
    with pytest.raises(ConfigError, match="no method twice"):
        parse_methods("none,none")


def test_error_feedback_effect_pairs_each_ratio_and_names_the_lower_loss():
    summaries = {"topk:0.01": {"final_loss": 3.0}, "topk:0.01:noef": {"final_loss": 3.5},
                 "topk:0.1": {"final_loss": 2.9}, "topk:0.1:noef": {"final_loss": 2.8}, "topk:0.25": {"final_loss": 1.0}}
    rows = error_feedback_effect(summaries)
    assert [(r["ratio"], r["ef_lower"]) for r in rows] == [(0.01, True), (0.1, False)]  # 0.25 has no pair: skipped


def test_bucket_sweep_summary_picks_the_fastest_step_and_measures_noise():
    sweep = [{"bucket_cap_mb": 1, "step_s": 0.30, "compute_s": 0.20, "comm_s": 0.2, "hidden_frac": 0.5},
             {"bucket_cap_mb": 4, "step_s": 0.25, "compute_s": 0.22, "comm_s": 0.1, "hidden_frac": 0.7}]
    b = bucket_sweep_summary(sweep)
    assert b["fastest_bucket_cap_mb"] == 4 and b["hidden_frac"] == 0.7
    assert b["compute_noise"] == pytest.approx(0.1)


# ---------------------------------------------------------------------- two processes
def _train_rows(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("type") == "train"]


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.dist
def test_topk_at_full_ratio_with_error_feedback_equals_plain_ddp_exactly(tmp_path):
    """Two buckets (0.25 MB cap), accumulation over 2 micro-steps: every loss and every parameter bit-equal."""
    run_script("05_grad_compression.py", COMMON + ["--max-steps", "3", "--micro-batch-size", "4", "--grad-accum", "2",
                                                   "--methods", "plain,topk:1.0", "--output-dir", str(tmp_path)],
               nproc=2, timeout=120)
    plain, topk = tmp_path / "plain", tmp_path / "topk-1.0"
    assert [r["loss"] for r in _train_rows(topk)] == [r["loss"] for r in _train_rows(plain)]
    assert _summary(topk)["replica_checksums"] == _summary(plain)["replica_checksums"]
    n_params = _summary(topk)["params"]
    for row in _train_rows(topk):
        # DDP communicates once per optimizer step (not per micro-step): one dense gradient's worth;
        # Top-K at 100 % sends every value plus an int32 index: twice that.
        assert row["comm_bytes_dense"] == 4 * n_params
        assert row["comm_bytes"] == 2 * row["comm_bytes_dense"]


@pytest.mark.dist
def test_bytes_counted_per_method_and_powersgd_runs_on_gloo(tmp_path):
    run_script("05_grad_compression.py", COMMON + ["--max-steps", "3", "--micro-batch-size", "4",
                                                   "--compression-powersgd-start-iter", "2",
                                                   "--methods", "none,fp16,powersgd:4,topk:0.01,topk_naive:0.25",
                                                   "--output-dir", str(tmp_path)], nproc=2, timeout=150)
    dense = 4 * _summary(tmp_path / "none")["params"]
    for row in _train_rows(tmp_path / "none"):
        assert row["comm_bytes"] == row["comm_bytes_dense"] == dense     # the counter sees DDP's whole gradient
    for row in _train_rows(tmp_path / "fp16"):
        assert row["comm_bytes"] * 2 == dense
    for row in _train_rows(tmp_path / "topk-0.01"):                     # values + int32 indices
        assert 0 < row["comm_bytes"] <= dense / 20
    for row in _train_rows(tmp_path / "topk_naive-0.25"):               # the guide's recipe saves nothing
        assert row["comm_bytes"] == dense
    psgd = _train_rows(tmp_path / "powersgd-4")
    assert [r["comm_bytes"] == dense for r in psgd] == [True, True, False]  # 2 plain warm-up steps
    assert all(r["compression_ratio"] > 5 for r in psgd[2:])
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in psgd)
    checks = _summary(tmp_path / "powersgd-4")["replica_checksums"]
    assert checks[0] == checks[1]


# ---------------------------------------------------------------------- verdicts (unit)
def test_expected_byte_ratios_follow_what_goes_on_the_wire():
    assert [expected_byte_ratio(s) for s in ("none", "fp16", "bf16", "topk_naive:0.25", "topk:0.25", "topk:0.01:noef",
                                             "powersgd:4")] == [1.0, 2.0, 2.0, 1.0, 2.0, 50.0, None]


def test_byte_ratio_checks_flag_a_method_that_sends_too_much():
    dense = 4_000_000
    summaries = {"fp16": {"comm_bytes_dense_last": dense, "comm_bytes_last": dense // 2},
                 "topk:0.01": {"comm_bytes_dense_last": dense, "comm_bytes_last": 80_400},   # rounding up per bucket
                 "topk:0.25": {"comm_bytes_dense_last": dense, "comm_bytes_last": dense // 4},  # values only: wrong
                 "powersgd:4": {"comm_bytes_dense_last": dense, "comm_bytes_last": dense},     # no saving: wrong
                 "topk_naive:0.25": {"comm_bytes_dense_last": dense, "comm_bytes_last": dense}}
    rows = {r["spec"]: r for r in byte_ratio_checks(summaries)}
    assert {k: r["ok"] for k, r in rows.items()} == {"fp16": True, "topk:0.01": True, "topk:0.25": False,
                                                     "powersgd:4": False, "topk_naive:0.25": True}
    assert rows["topk_naive:0.25"]["comm_cut"] == 0.0 and rows["fp16"]["comm_cut"] == 0.5


def test_async_allreduce_verdict_needs_identical_waited_and_diverged_unwaited_replicas():
    good = [{"wait": False, "stale_grad_share_mean": 0.9, "replica_max_abs_diff": 1e-4},
            {"wait": True, "stale_grad_share_mean": 0.0, "replica_max_abs_diff": 0.0}]
    assert async_allreduce_verdict(good)["ok"]
    waited_drifts = [good[0], {**good[1], "replica_max_abs_diff": 1e-9}]
    assert async_allreduce_verdict(waited_drifts)["failed"] == ["waited: replicas identical"]
    lucky = [{**good[0], "stale_grad_share_mean": 0.0, "replica_max_abs_diff": 0.0}, good[1]]
    assert not async_allreduce_verdict(lucky)["ok"] and len(async_allreduce_verdict(lucky)["failed"]) == 2
    blown_up = [{**good[0], "replica_max_abs_diff": float("inf")}, good[1]]  # a non-finite weight: they differ
    assert async_allreduce_verdict(blown_up)["ok"]
    with pytest.raises(ValueError):
        async_allreduce_verdict(good[:1])
