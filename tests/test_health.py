"""Health monitor: samples, warnings, straggler rule, forward timer, hang watchdog; a 2-process run with a failing NVML."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, free_port
from ecomkit.faults.health import (
    ForwardTimer,
    HangWatchdog,
    HealthMonitor,
    find_stragglers,
    health_warnings,
    read_cpu_health,
    read_gpu_health,
    slowdown_reasons,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("times, expected", [
    ([0.010, 0.010], []),
    ([0.010, 0.031], [1]),                 # two ranks: compared with each other
    ([0.030, 0.010], [0]),
    ([0.010, 0.011, 0.009, 0.050], [3]),    # one slow rank cannot drag the reference up
    ([0.010, 0.019, 0.010, 0.011], []),     # below the factor
    ([0.0010, 0.0030], []),                 # 3x but only 2 ms apart: timer noise
    ([0.5], []),
])
def test_find_stragglers(times, expected):
    assert find_stragglers(times, factor=2.0) == expected


def test_cpu_sample_has_the_fields_the_monitor_logs():
    s = read_cpu_health()
    assert s["kind"] == "cpu" and s["rss_bytes"] > 0 and 0 <= s["ram_used_percent"] <= 100
    assert health_warnings({**s, "ram_used_percent": 97.0})[0].startswith("system RAM 97%")
    assert health_warnings({**s, "ram_used_percent": 10.0}) == []


class FakeNvml:
    """Stands in for pynvml: the same function names and constants, fixed readings."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwSlowdown = 0x08
    nvmlClocksEventReasonSwPowerCap = 0x04

    def __init__(self, temp: int, reasons: int, used: int):
        self.temp, self.reasons, self.used = temp, reasons, used

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.used, total=80 * 2**30)

    def nvmlDeviceGetTemperature(self, h, kind):
        return self.temp

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1100

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return 350_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons


def test_gpu_sample_and_warnings_from_nvml_readings():
    hot = read_gpu_health(FakeNvml(temp=91, reasons=0x20 | 0x04, used=79 * 2**30), handle=None)
    assert hot["power_w"] == 350.0 and hot["sm_clock_max_mhz"] == 1980
    assert hot["slowdown_reasons"] == ["thermal (driver)", "power cap"]
    text = " | ".join(health_warnings(hot))
    assert "91 °C" in text and "clocks reduced" in text and "memory 99% used" in text
    assert "do not reset" in text
    cool = read_gpu_health(FakeNvml(temp=60, reasons=0, used=10 * 2**30), handle=None)
    assert health_warnings(cool) == []


def test_forward_timer_measures_only_the_forward():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model[0].register_forward_hook(lambda *_: time.sleep(0.02))
    timer = ForwardTimer(model, torch.device("cpu"))
    for _ in range(3):
        model(torch.randn(2, 4))
    time.sleep(0.05)  # not a forward: must not count
    mean = timer.pop_mean_s()
    assert 0.02 <= mean < 0.045
    assert timer.pop_mean_s() is None
    timer.remove()


def test_hang_watchdog_prints_stacks_naming_the_rank():
    out = io.StringIO()
    dog = HangWatchdog(0.2, rank=3, stream=out)
    dog.arm(step=6)
    time.sleep(0.8)
    dog.stop()
    text = out.getvalue()
    assert "[rank 3 on" in text and "step 7 has taken" in text and "py-spy dump --pid" in text
    assert "test_hang_watchdog_prints_stacks_naming_the_rank" in text  # the main thread's stack
    assert text.count("step 7 has taken") == 1  # once per step, not every poll


def test_monitor_writes_health_rows_and_summary(tmp_path):
    cfg = TrainConfig(output_dir=str(tmp_path))
    cfg.fault.health_interval = 2
    model = torch.nn.Linear(4, 4)
    run = SimpleNamespace(env=DistEnv(), strategy=SimpleNamespace(raw_model=model), callbacks=[], out_dir=tmp_path,
                          step=0)
    mon = HealthMonitor(cfg)
    mon.on_train_start(run)
    for step in range(1, 5):
        model(torch.randn(2, 4))
        run.step = step
        mon.on_step_end(run, {})
    summary: dict = {}
    mon.on_train_end(run, summary)
    rows = [line for line in (tmp_path / "health.jsonl").read_text().splitlines() if line]
    assert len(rows) == 2 and summary["health"]["samples"] == 2
    assert '"forward_s"' in rows[0] and '"kind": "cpu"' in rows[0]


class NVMLError_NotSupported(Exception):  # noqa: N801 (pynvml's own spelling)
    """What pynvml raises for a reading the board does not offer."""


class RefusingNvml(FakeNvml):
    """A board that offers no power reading and no clock-event reasons (both raise, as real pynvml does)."""

    def nvmlDeviceGetPowerUsage(self, h):
        raise NVMLError_NotSupported("Not Supported")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        raise NVMLError_NotSupported("Not Supported")


class OldNvml:
    """An older pynvml: only the ``ClocksThrottleReason`` generation of names exists."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1
    nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
    nvmlClocksThrottleReasonSwPowerCap = 0x04
    nvmlDeviceGetUtilizationRates = FakeNvml.nvmlDeviceGetUtilizationRates
    nvmlDeviceGetMemoryInfo = lambda self, h: SimpleNamespace(used=1, total=2)  # noqa: E731
    nvmlDeviceGetTemperature = lambda self, h, k: 70  # noqa: E731
    nvmlDeviceGetClockInfo = FakeNvml.nvmlDeviceGetClockInfo
    nvmlDeviceGetMaxClockInfo = FakeNvml.nvmlDeviceGetMaxClockInfo
    nvmlDeviceGetPowerUsage = FakeNvml.nvmlDeviceGetPowerUsage

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0x20 | 0x80


def test_an_unsupported_reading_is_none_and_the_rest_of_the_sample_survives():
    s = read_gpu_health(RefusingNvml(temp=90, reasons=0, used=1), handle=None)
    assert s["power_w"] is None and s["slowdown_reasons"] is None
    assert s["temperature_c"] == 90 and s["gpu_util_percent"] == 97 and s["sm_clock_mhz"] == 1100
    assert [e.split(":")[0] for e in s["nvml_errors"]] == ["power", "clock-event reasons"]
    assert "NVMLError_NotSupported" in s["nvml_errors"][0]
    assert health_warnings(s) and "90 °C" in health_warnings(s)[0]  # None readings warn of nothing, the rest still do


def test_both_generations_of_throttle_reason_names():
    old = read_gpu_health(OldNvml(), handle=None)
    assert old["slowdown_reasons"] == ["thermal (driver)", "power brake"] and old["nvml_errors"] == []
    assert slowdown_reasons(FakeNvml(0, 0, 0), 0x20 | 0x08) == ["thermal (driver)",
                                                               "hardware slowdown (thermal or power brake)"]
    assert slowdown_reasons(OldNvml(), 0) == []


_TWO_RANK_SCRIPT = """
import sys, time
from types import SimpleNamespace
import torch
sys.path.insert(0, {tests!r})
from test_health import RefusingNvml
from ecomkit.config import TrainConfig
from ecomkit.dist import distributed_session
from ecomkit.faults.health import HealthMonitor


class BrokenNvml:  # every attribute access fails: nothing of the sample can be read
    def __getattr__(self, name):
        raise RuntimeError("NVML driver/library version mismatch")


with distributed_session(timeout_s=20) as env:
    cfg = TrainConfig(output_dir={out!r})
    cfg.fault.health_interval = 1
    model = torch.nn.Linear(4, 4)
    run = SimpleNamespace(env=env, strategy=SimpleNamespace(raw_model=model), callbacks=[], out_dir={out!r}, step=0)
    mon = HealthMonitor(cfg)
    mon.on_train_start(run)
    mon.nvml = RefusingNvml(temp=60, reasons=0, used=1) if env.rank == 0 else BrokenNvml()
    mon.handle = object()  # as if NVML had initialised on a GPU
    t0 = time.perf_counter()
    for step in (1, 2):
        model(torch.randn(2, 4))
        run.step = step
        mon.on_step_end(run, {{}})
    summary = {{}}
    mon.on_train_end(run, summary)
    if env.rank == 0:
        print("HEALTH", summary["health"]["samples"], round(time.perf_counter() - t0, 2), summary["health"]["warnings"])
"""


@pytest.mark.dist
def test_failing_nvml_on_one_rank_does_not_hang_the_gather(tmp_path):
    """Rank 1's NVML raises on every access, rank 0's refuses two readings: both samples are gathered, no hang."""
    script = tmp_path / "two_ranks.py"
    script.write_text(textwrap.dedent(_TWO_RANK_SCRIPT).format(tests=str(REPO / "tests"), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
           "--rdzv_endpoint", f"127.0.0.1:{free_port()}", str(script)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("HEALTH"))
    samples, seconds = line.split()[1:3]
    assert samples == "2" and float(seconds) < 10  # well inside the 20 s process-group timeout
    assert "rank 1" in line and "health sample failed on this rank: RuntimeError: NVML driver" in line
    rows = (tmp_path / "health.jsonl").read_text()
    assert '"power_w": null' in rows and '"kind": "error"' in rows
