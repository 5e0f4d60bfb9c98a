"""``--precision auto`` (models/precision.py, train/resolve.py) and the model FLOP/s every run reports.

- On a CPU that advertises AVX-512 BF16 or AMX, auto picks bf16 (the measured GEMM decides, and on such a core
  it is several times the fp32 rate); with a probe saying bf16 is not faster (mocked rates), fp32; on a CPU
  whose flags show no bf16 units, fp32 without timing anything; an explicit bf16 there is kept, with a warning.
- A run times no GEMM at start-up unless ``--precision auto`` must decide (issue 55: every CPU run timed
  matrix multiplies only to fill a roofline column); its rows and summary carry model FLOP/s, and MFU where the
  hardware table has the device's peak (a CPU has none: chapter 01 and the benchmarks measure a CPU's GEMM peak).
"""

from __future__ import annotations

import json

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
import ecomkit.hardware as hardware
from ecomkit.hardware import cpu_bf16_units, matmul_flops
from ecomkit.models.precision import AUTO_BF16_MIN_SPEEDUP, choose_precision
from ecomkit.errors import ConfigError
from ecomkit.metrics import flops_line
from ecomkit.train.loop import run_training
from ecomkit.train.resolve import precision_choice

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
    monkeypatch.setattr("ecomkit.models.precision.measured_cpu_peak", no_timing)
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
    monkeypatch.setattr("ecomkit.train.resolve.cpu_bf16_units", lambda: False)
    with caplog.at_level("WARNING"):
        assert precision_choice("bf16", DistEnv()).value == "bf16"
    assert "without bf16 matmul units" in caplog.text
    monkeypatch.setattr("ecomkit.train.resolve.cpu_bf16_units", lambda: True)
    caplog.clear()
    with caplog.at_level("WARNING"):
        precision_choice("bf16", DistEnv())
    assert "bf16 matmul units" not in caplog.text


def test_auto_picks_fp32_when_the_probe_says_bf16_is_not_faster():
    picked, why = choose_precision(CPU, rates={"fp32": 100e9, "bf16": 90e9})
    assert picked == "fp32" and "does not multiply faster in bf16" in why
    slightly = {"fp32": 100e9, "bf16": 100e9 * (AUTO_BF16_MIN_SPEEDUP - 0.01)}
    assert choose_precision(CPU, rates=slightly)[0] == "fp32"   # "clearly faster", not marginally
    assert choose_precision(CPU, rates={"fp32": 100e9, "bf16": 300e9})[0] == "bf16"


def test_auto_is_resolved_with_its_reason_and_explicit_precisions_are_kept(monkeypatch):
    TrainConfig(precision="auto").validate(1)                      # auto is a valid choice
    monkeypatch.setattr("ecomkit.train.resolve.choose_precision", lambda device: ("fp32", "mocked"))
    auto = precision_choice("auto", DistEnv())
    assert (auto.value, auto.given, auto.to_dict()["reason"]) == ("fp32", False, "auto: mocked; --precision sets it")
    given = precision_choice("bf16", DistEnv()).to_dict()
    assert given == {"value": "bf16", "reason": "--precision given", "given": True}
    with pytest.raises(ConfigError, match="precision"):
        TrainConfig(precision="bf17").validate(1)


def test_model_flops_print_with_mfu_only_where_a_table_peak_exists():
    assert flops_line({"model_flops_per_s": 20e9, "mfu": None}) == "model FLOP/s    20.0 GFLOP/s\n"
    gpu = flops_line({"model_flops_per_s": 50e12, "mfu": 0.5, "peak_flops": 100e12})
    assert "50.0% MFU" in gpu and "hardware table" in gpu
    unknown = {"model_flops_per_s": 5e12, "mfu": None, "mfu_note": "MFU not reported: unknown GPU 'x'"}
    assert "unknown GPU" in flops_line(unknown)
    assert matmul_flops("fp32", n=64, reps=1) > 0


def test_the_peak_is_the_fastest_gemm_size_at_its_best_repetition(monkeypatch):
    """Issue #43 item 6: a 512² GEMM can beat 1024² (it stays in cache: 101 against 89 GFLOP/s on a 2-core EPYC),
    and a model multiplies such shapes; the peak is the fastest size, each at its fastest repetition."""
    calls = []

    def fake(precision, device="cpu", n=1024, reps=5, best=False):
        calls.append((n, best))
        return {256: 80e9, 512: 101e9, 1024: 89e9}[n] * (1.0 if best else 0.97)

    monkeypatch.setattr(hardware, "matmul_flops", fake)
    assert hardware.matmul_peak("fp32") == (101e9, 512)
    assert {n for n, best in calls if best} == {256, 512, 1024}


def test_model_flops_count_the_lm_head_only_where_the_loss_reads_it():
    """Issue #43 item 6: the chunked loss computes the head on labelled positions only; 6Ψ per token counted it
    on every prompt token too (12 % of a small nlu step's FLOPs that were never computed)."""
    from ecomkit.metrics import step_model_flops

    per_token = lambda t: 1000.0 + t   # noqa: E731  (6Ψ + attention at length t)
    # 100 real tokens in two rows of 50 (ΣL² = 5000), 10 positions predict a label, head 300 FLOPs per position
    assert step_model_flops(100, 5000, 10, per_token, 300.0) == 100 * 1050.0 - 90 * 300.0
    assert step_model_flops(100, 5000, 100, per_token, 300.0) == 100 * 1050.0   # every position read (lm)


def test_a_run_at_a_given_precision_times_no_gemm_and_reports_model_flops(tmp_path, monkeypatch):
    """Issue 55 item 2: every CPU run timed GEMMs at start-up only to fill a roofline column. At a given
    precision nothing is timed now (a GEMM timing here fails the run); the rows still carry model FLOP/s."""
    def no_timing(*_, **__):
        raise AssertionError("a GEMM was timed at start-up")
    monkeypatch.setattr(hardware, "matmul_flops", no_timing)
    hardware._cpu_peak.cache_clear()   # an earlier test's probe must not answer for this run
    cfg = TrainConfig(precision="fp32", max_steps=3, eval_interval=0, eval_batches=1, save_model=False,
                      progress=False, report_to="none", output_dir=str(tmp_path))
    summary = run_training(cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["type"] == "train"]
    assert all(r["model_flops_per_s"] > 0 and r["mfu"] is None and "peak_share" not in r for r in train)
    assert summary["model_flops_per_s"] > 0 and summary["mfu"] is None and "peak_share" not in summary


def test_an_auto_run_trains_at_the_precision_auto_picks(tmp_path):
    cfg = TrainConfig(precision="auto", max_steps=2, eval_interval=0, eval_batches=1, save_model=False,
                      progress=False, report_to="none", output_dir=str(tmp_path))
    summary = run_training(cfg)
    expected, why = choose_precision(CPU)
    assert summary["config"]["precision"] == expected
    assert summary["recipe"]["precision"] == {"value": expected, "reason": f"auto: {why}; --precision sets it",
                                              "given": False}
