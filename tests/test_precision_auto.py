"""``--precision auto`` and the roofline every run reports (envcheck/matmul.py, train/autoprec.py).

- On a CPU that advertises AVX-512 BF16 or AMX, auto picks bf16 (the measured GEMM decides, and on such a core
  it is several times the fp32 rate); with a probe saying bf16 is not faster (mocked rates), fp32; on a CPU
  whose flags show no bf16 units, fp32 without timing anything; an explicit bf16 there is kept, with a warning.
- A one-process run with ``precision="auto"`` trains with what was picked, and its rows and summary carry model
  FLOP/s and the share of the measured CPU matmul peak, labelled as such (``peak_share``, not ``mfu``).
"""

from __future__ import annotations

import json

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.envcheck.matmul import (AUTO_BF16_MIN_SPEEDUP, choose_precision, cpu_bf16_units, matmul_flops,
                                     roofline_fields, roofline_summary)
from ecomkit.errors import ConfigError
from ecomkit.metrics import roofline_line
from ecomkit.train.autoprec import resolve_precision
from ecomkit.train.loop import run_training

CPU = torch.device("cpu")


@pytest.mark.skipif(not cpu_bf16_units(), reason="this CPU has no bf16 matmul units")
def test_auto_picks_bf16_on_a_cpu_that_multiplies_in_bf16():
    picked, why = choose_precision(CPU)
    assert picked == "bf16", why
    assert "GFLOP/s" in why and "thread" in why


@pytest.mark.skipif(cpu_bf16_units() is not False, reason="this CPU has bf16 matmul units, or no cpuinfo")
def test_auto_picks_fp32_untimed_on_a_cpu_without_bf16_units(monkeypatch):
    def no_timing(*_):
        raise AssertionError("the probe timed a GEMM although the flags had decided")
    monkeypatch.setattr("ecomkit.envcheck.matmul.measured_cpu_peak", no_timing)
    picked, why = choose_precision(CPU)
    assert picked == "fp32" and "no bf16 matmul units" in why


def test_cpu_bf16_units_reads_x86_flags_and_arm_features():
    assert cpu_bf16_units("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n") is True
    assert cpu_bf16_units("flags\t\t: fpu sse avx2 amx_bf16 amx_tile\n") is True
    assert cpu_bf16_units("flags : fpu sse avx2 fma\nvmx flags : avx512_bf16\n") is False   # only the flags line
    assert cpu_bf16_units("Features : fp asimd sve bf16 i8mm\n") is True
    assert cpu_bf16_units("Features : fp asimd\n") is False
    assert cpu_bf16_units("model name : something\n") is None


def test_explicit_bf16_on_a_cpu_without_bf16_units_is_kept_and_warned(monkeypatch, caplog):
    monkeypatch.setattr("ecomkit.envcheck.matmul.cpu_bf16_units", lambda: False)
    with caplog.at_level("WARNING"):
        assert resolve_precision(TrainConfig(precision="bf16"), DistEnv()) == "bf16"
    assert "without bf16 matmul units" in caplog.text
    monkeypatch.setattr("ecomkit.envcheck.matmul.cpu_bf16_units", lambda: True)
    caplog.clear()
    with caplog.at_level("WARNING"):
        resolve_precision(TrainConfig(precision="bf16"), DistEnv())
    assert "bf16 matmul units" not in caplog.text


def test_auto_picks_fp32_when_the_probe_says_bf16_is_not_faster():
    picked, why = choose_precision(CPU, rates={"fp32": 100e9, "bf16": 90e9})
    assert picked == "fp32" and "does not multiply faster in bf16" in why
    slightly = {"fp32": 100e9, "bf16": 100e9 * (AUTO_BF16_MIN_SPEEDUP - 0.01)}
    assert choose_precision(CPU, rates=slightly)[0] == "fp32"   # "clearly faster", not marginally
    assert choose_precision(CPU, rates={"fp32": 100e9, "bf16": 300e9})[0] == "bf16"


def test_resolve_replaces_auto_and_leaves_explicit_precisions(monkeypatch):
    cfg = TrainConfig(precision="auto")
    cfg.validate(1)                      # auto is a valid choice
    monkeypatch.setattr("ecomkit.envcheck.matmul.choose_precision", lambda device: ("fp32", "mocked"))
    assert resolve_precision(cfg, DistEnv()) == "fp32" and cfg.precision == "fp32"
    cfg = TrainConfig(precision="bf16")
    assert resolve_precision(cfg, DistEnv()) == "bf16"
    with pytest.raises(ConfigError, match="precision"):
        TrainConfig(precision="bf17").validate(1)


def test_roofline_fields_are_labelled_by_device():
    cpu = roofline_fields(50e9, 100e9, "measured bf16 GEMM, 1 thread(s)", 2, CPU)
    assert cpu["peak_share"] == pytest.approx(0.25) and "mfu" not in cpu
    gpu = roofline_fields(50e12, 100e12, "hardware table", 1, torch.device("cuda"))
    assert gpu["mfu"] == pytest.approx(0.5) and "peak_share" not in gpu
    rows = [{"model_flops_per_s": 10e9, "step_time_s": 1.0}, {"model_flops_per_s": 30e9, "step_time_s": 1.0}]
    summary = roofline_summary(rows, 2.0, 100e9, "measured", 1, CPU)   # totals: 40e9 FLOPs / 2 s
    assert summary["model_flops_per_s"] == pytest.approx(20e9)
    assert "20.0% of the measured matmul peak" in roofline_line(summary)
    assert matmul_flops("fp32", n=64, reps=1) > 0


def test_the_peak_is_the_fastest_gemm_size_at_its_best_repetition(monkeypatch):
    """Issue #43 item 6: a 512² GEMM can beat 1024² (it stays in cache: 101 against 89 GFLOP/s on a 2-core EPYC),
    and a model multiplies such shapes. On main the peak was one 1024² GEMM's median, so a run's share of it
    reached 100.9 %; the peak is now the fastest size, each at its fastest repetition."""
    import ecomkit.envcheck.matmul as matmul

    calls = []

    def fake(precision, device="cpu", n=1024, reps=5, best=False):
        calls.append((n, best))
        return {256: 80e9, 512: 101e9, 1024: 89e9}[n] * (1.0 if best else 0.97)

    monkeypatch.setattr(matmul, "matmul_flops", fake)
    matmul._cpu_peak.cache_clear()
    try:
        peak, source = matmul.run_peak(CPU, "fp32")
    finally:
        matmul._cpu_peak.cache_clear()
    assert peak == 101e9 and "(512²)" in source and source.startswith("measured fp32 GEMM")
    assert {n for n, best in calls if best} == {256, 512, 1024}


def test_model_flops_count_the_lm_head_only_where_the_loss_reads_it():
    """Issue #43 item 6: the chunked loss computes the head on labelled positions only; 6Ψ per token counted it
    on every prompt token too (12 % of a small nlu step's FLOPs that were never computed)."""
    from ecomkit.metrics import step_model_flops

    per_token = lambda t: 1000.0 + t   # noqa: E731  (6Ψ + attention at length t)
    # 100 real tokens in two rows of 50 (ΣL² = 5000), 10 positions predict a label, head 300 FLOPs per position
    assert step_model_flops(100, 5000, 10, per_token, 300.0) == 100 * 1050.0 - 90 * 300.0
    assert step_model_flops(100, 5000, 100, per_token, 300.0) == 100 * 1050.0   # every position read (lm)


def test_a_share_above_the_peak_is_never_printed_without_a_word():
    line = roofline_line({"model_flops_per_s": 101e9, "peak_flops": 100e9, "peak_share": 1.01, "peak_source": "m"})
    assert "101.0% of the measured matmul peak" in line and "above 100 %" in line
    assert "above 100 %" not in roofline_line({"model_flops_per_s": 50e9, "peak_flops": 100e9, "peak_share": 0.5,
                                               "peak_source": "m"})


def test_an_auto_run_reports_its_share_of_the_measured_peak(tmp_path):
    cfg = TrainConfig(precision="auto", max_steps=4, eval_interval=0, eval_batches=1, save_model=False,
                      progress=False, output_dir=str(tmp_path))
    summary = run_training(cfg)
    expected, _ = choose_precision(CPU)
    assert summary["config"]["precision"] == expected
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["type"] == "train"]
    assert all(r["model_flops_per_s"] > 0 and 0 < r["peak_share"] for r in train)
    assert summary["peak_source"].startswith(f"measured {expected} GEMM")
    assert 0 < summary["peak_share"] and summary["model_flops_per_s"] > 0
