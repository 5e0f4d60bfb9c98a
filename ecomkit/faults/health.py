"""Health monitoring during training: GPU (NVML) or CPU/RAM samples, stragglers, hung-step stack dumps.

Why a callback that only warns: resetting a hot GPU from the loop (the EcomGPT guide's ``nvidia-smi -r``) kills every
context on it and the job with them; seeing it, checkpointing and draining the node between jobs is what helps.
Stragglers are found from each rank's *forward* time: synchronous step times all wait for the slowest and come out
equal. ``fault.hang_dump_s`` prints a rank's stacks when one step takes longer, before the collective timeout.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import threading
import time
import traceback
from typing import Any, Callable, Sequence

import psutil
import torch

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, gather_objects, install_stack_dump_signal, log
from ecomkit.metrics import MetricsWriter

GPU_TEMP_WARN_C = 85
GPU_MEM_WARN_FRACTION = 0.95
RAM_WARN_PERCENT = 90.0
STRAGGLER_MIN_GAP_S = 0.005   # ignore differences below 5 ms (timer noise on shared CPUs)
MAX_WARNINGS_IN_SUMMARY = 50


_PROCESSES: dict[int, Any] = {}


def read_cpu_health() -> dict[str, Any]:
    """CPU and RAM of this process and machine (psutil).

    One ``Process`` object per pid: ``cpu_percent`` is measured between two calls on the same object (else always 0).
    """
    proc = _PROCESSES.setdefault(os.getpid(), psutil.Process())
    vm = psutil.virtual_memory()
    return {
        "kind": "cpu",
        "process_cpu_percent": proc.cpu_percent(interval=None),  # since the previous call
        "system_cpu_percent": psutil.cpu_percent(interval=None),
        "rss_bytes": proc.memory_info().rss,
        "ram_used_percent": vm.percent,
        "ram_available_bytes": vm.available,
    }


# Throttle bits: nvidia-ml-py >= 12.535 names them nvmlClocksEventReason*, older nvmlClocksThrottleReason*.
_SLOWDOWN_REASONS = {  # bit name without the generation prefix -> what it means
    "SwThermalSlowdown": "thermal (driver)",
    "HwThermalSlowdown": "thermal (hardware)",
    "HwSlowdown": "hardware slowdown (thermal or power brake)",
    "HwPowerBrakeSlowdown": "power brake",
    "SwPowerCap": "power cap",
}
_REASON_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")
_REASON_GETTERS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")


def slowdown_reasons(nvml: Any, bits: int) -> list[str]:
    """The slowdown reasons set in ``bits``, whichever generation of constant names ``nvml`` has."""
    out = []
    for suffix, text in _SLOWDOWN_REASONS.items():
        mask = next((getattr(nvml, p + suffix) for p in _REASON_PREFIXES if hasattr(nvml, p + suffix)), None)
        if mask is not None and bits & mask:
            out.append(text)
    return out


def _read_metric(errors: list[str], name: str, read: Callable[[], Any]) -> Any:
    """``read()``, or None with ``name: error`` appended to ``errors``.

    Why per metric: boards differ in what NVML supports; one refused reading costs its field, never the gather.
    """
    try:
        return read()
    except Exception as exc:  # NVMLError_NotSupported, NVMLError_NoPermission, GPU lost, ...
        errors.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
        return None


def read_gpu_health(nvml: Any, handle: Any) -> dict[str, Any]:
    """One NVML sample of ``handle``'s GPU; never raises: a refused reading is None, named in ``nvml_errors``."""
    errors: list[str] = []
    util = _read_metric(errors, "utilisation", lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    mem = _read_metric(errors, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    power_mw = _read_metric(errors, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    getter = next((getattr(nvml, g) for g in _REASON_GETTERS if hasattr(nvml, g)), None)
    bits = _read_metric(errors, "clock-event reasons", lambda: getter(handle)) if getter else None
    return {
        "kind": "gpu",
        "gpu_util_percent": util,
        "mem_used_bytes": getattr(mem, "used", None), "mem_total_bytes": getattr(mem, "total", None),
        "temperature_c": _read_metric(errors, "temperature",
                                      lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        "sm_clock_mhz": _read_metric(errors, "SM clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        "sm_clock_max_mhz": _read_metric(errors, "SM max clock",
                                         lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
        "power_w": power_mw / 1000.0 if power_mw is not None else None,
        "slowdown_reasons": slowdown_reasons(nvml, bits) if bits is not None else None,
        "nvml_errors": errors,
    }


def health_warnings(sample: dict[str, Any]) -> list[str]:
    """Human-readable warnings for one sample (empty when healthy); a missing (None) reading warns of nothing."""
    out = []
    if sample.get("kind") == "gpu":
        temp, reasons = sample.get("temperature_c"), sample.get("slowdown_reasons")
        used, total = sample.get("mem_used_bytes"), sample.get("mem_total_bytes")
        if temp is not None and temp >= GPU_TEMP_WARN_C:
            out.append(f"GPU at {temp} °C (>= {GPU_TEMP_WARN_C}); expect clock throttling. "
                       "Check cooling/airflow between jobs; do not reset the GPU under a running job.")
        if reasons:
            out.append(f"GPU clocks reduced ({', '.join(reasons)}): SM at "
                       f"{sample.get('sm_clock_mhz')}/{sample.get('sm_clock_max_mhz')} MHz; this rank will straggle.")
        if used is not None and total and used / total > GPU_MEM_WARN_FRACTION:
            out.append(f"GPU memory {used / total:.0%} used: close to OOM "
                       "(smaller micro-batch + accumulation, activation checkpointing, ZeRO/FSDP).")
    elif sample.get("kind") == "cpu" and sample["ram_used_percent"] > RAM_WARN_PERCENT:
        out.append(f"system RAM {sample['ram_used_percent']:.0f}% used: the OOM killer may end a rank "
                   "(fewer dataloader workers, smaller shards, offload less).")
    if sample.get("kind") == "error":
        out.append(f"health sample failed on this rank: {sample.get('error')}")
    return out


def find_stragglers(times: Sequence[float], factor: float = 2.0, min_gap_s: float = STRAGGLER_MIN_GAP_S) -> list[int]:
    """Ranks whose time exceeds ``factor`` × the median of the *other* ranks (and by more than ``min_gap_s``).

    Leave-one-out, so it works for two ranks and a single slow rank cannot drag the reference up.
    """
    out = []
    for i, t in enumerate(times):
        others = [x for j, x in enumerate(times) if j != i]
        if not others:
            continue
        ref = statistics.median(others)
        if t > factor * ref and t - ref > min_gap_s:
            out.append(i)
    return out


class ForwardTimer:
    """Sum of forward-pass seconds of one module (CUDA events on GPU, ``perf_counter`` on CPU)."""

    def __init__(self, module: torch.nn.Module, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[Any, Any]] = []
        self._start: Any = None
        self.total_s, self.count = 0.0, 0
        self._handles = [module.register_forward_pre_hook(self._pre), module.register_forward_hook(self._post)]

    def _pre(self, module, args) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def _post(self, module, args, output) -> None:
        if self._start is None:
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start, end))
        else:
            self.total_s += time.perf_counter() - self._start
            self.count += 1
        self._start = None

    def pop_mean_s(self) -> float | None:
        """Mean forward time since the last call (None if no forward ran)."""
        for start, end in self._pending:
            end.synchronize()
            self.total_s += start.elapsed_time(end) / 1000.0
            self.count += 1
        self._pending.clear()
        mean = self.total_s / self.count if self.count else None
        self.total_s, self.count = 0.0, 0
        return mean

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


class HangWatchdog:
    """Print this rank's Python stacks when a step takes longer than ``seconds`` (re-armed every step).

    A Python thread needs the GIL, which torch releases in collectives; for a process holding it, use ``py-spy dump``.
    """

    def __init__(self, seconds: float, rank: int, stream: Any = None):
        self.seconds, self.rank, self.stream = seconds, rank, stream or sys.stderr
        self._armed_at = time.monotonic()
        self._step = 0
        self._stop = threading.Event()
        self._fired_for = -1
        self._thread = threading.Thread(target=self._run, name="ecomkit-hang-watchdog", daemon=True)
        self._thread.start()

    def arm(self, step: int) -> None:
        self._armed_at, self._step = time.monotonic(), step

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.seconds / 4)):
            waited = time.monotonic() - self._armed_at
            if waited > self.seconds and self._fired_for != self._step:
                self._fired_for = self._step
                self.stream.write(
                    f"\n[rank {self.rank} on {socket.gethostname()}, pid {os.getpid()}] step {self._step + 1} has "
                    f"taken {waited:.0f} s (> fault.hang_dump_s={self.seconds:g}); Python stacks of all threads "
                    f"follow (more: py-spy dump --pid {os.getpid()}):\n")
                self.stream.write(format_all_stacks())
                self.stream.flush()

    def stop(self) -> None:
        self._stop.set()


def format_all_stacks() -> str:
    """Python stacks of every thread but the caller, innermost call last (like a traceback)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident != me:
            parts.append(f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame)))
    return "".join(parts)


def _nvml_handle(nvml: Any, device: torch.device) -> Any:
    """The NVML handle of *this* CUDA device (NVML ignores CUDA_VISIBLE_DEVICES, so map by UUID)."""
    index = device.index or 0
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p for p in visible.split(",") if p.strip()]
    if parts and all(p.strip().isdigit() for p in parts):
        index = int(parts[index])
    return nvml.nvmlDeviceGetHandleByIndex(index)


class HealthMonitor:
    """Training callback: samples health, detects stragglers, arms the hang watchdog. Never acts on a device."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.interval = cfg.fault.health_interval
        self.factor = cfg.fault.straggler_factor
        self.nvml: Any = None
        self.handle: Any = None
        self.timer: ForwardTimer | None = None
        self.watchdog: HangWatchdog | None = None
        self.writer: Any = None
        self.samples = 0
        self.warnings: list[str] = []
        self.straggler_counts: dict[int, int] = {}

    def on_train_start(self, run: Any) -> None:
        env: DistEnv = run.env
        install_stack_dump_signal()
        if self.cfg.fault.hang_dump_s > 0:
            self.watchdog = HangWatchdog(self.cfg.fault.hang_dump_s, env.rank)
            self.watchdog.arm(run.step)
        if self.interval <= 0:
            return
        if env.device.type == "cuda":
            self._init_nvml(env.device)
        else:
            read_cpu_health()  # prime psutil's cpu_percent, whose first call returns 0
        self.timer = ForwardTimer(run.strategy.raw_model, env.device)
        resuming = any(getattr(cb, "resuming", False) for cb in run.callbacks)
        self.writer = MetricsWriter(run.out_dir, env.is_main, filename="health.jsonl", append=resuming)

    def _init_nvml(self, device: torch.device) -> None:
        try:
            import pynvml  # lazy: NVIDIA's library; only on a CUDA device, and it may be missing

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, _nvml_handle(pynvml, device)
        except Exception as exc:  # no driver library, MIG without permissions, ...
            log.warning("health: NVML unavailable (%s); sampling CPU/RAM instead", exc)
            self.nvml = self.handle = None

    def on_step_end(self, run: Any, row: dict[str, Any]) -> None:
        if self.watchdog is not None:
            self.watchdog.arm(run.step)
        if self.interval > 0 and run.step % self.interval == 0:
            self.sample(run)

    def _local_sample(self) -> dict[str, Any]:
        """This rank's reading; any failure becomes an ``error`` sample, so the gather below always happens."""
        try:
            return read_gpu_health(self.nvml, self.handle) if self.handle is not None else read_cpu_health()
        except Exception as exc:  # never skip the collective: the other ranks would wait until the timeout
            return {"kind": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}

    def sample(self, run: Any) -> dict[str, Any] | None:
        """Collective: every rank calls it at the same step. Rank 0 logs and writes ``health.jsonl``."""
        env: DistEnv = run.env
        local = self._local_sample()
        local.update(rank=env.rank, host=socket.gethostname(), forward_s=self.timer.pop_mean_s() if self.timer else None)
        ranks = gather_objects(local, env)
        self.samples += 1
        if not env.is_main:
            return None
        warnings = [f"rank {s['rank']} ({s['host']}): {w}" for s in ranks for w in health_warnings(s)]
        fwd = [s["forward_s"] for s in ranks]
        slow = find_stragglers(fwd, self.factor) if all(t is not None for t in fwd) and len(fwd) > 1 else []
        for r in slow:
            self.straggler_counts[r] = self.straggler_counts.get(r, 0) + 1
            others = statistics.median([t for i, t in enumerate(fwd) if i != r])
            warnings.append(f"straggler: rank {r} ({ranks[r]['host']}) forward {fwd[r] * 1e3:.1f} ms vs "
                            f"{others * 1e3:.1f} ms median of the others ({fwd[r] / others:.1f}×); every step "
                            "waits for it. Check its GPU clocks/temperature, CPU contention, data loading.")
        for w in warnings:
            log.warning("health: %s", w)
        self.warnings.extend(warnings)
        row = {"type": "health", "step": run.step, "ranks": ranks, "stragglers": slow, "warnings": warnings}
        if self.writer is not None:
            self.writer.write(row)
        return row

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.timer is not None:
            self.timer.remove()
        if self.writer is not None:
            self.writer.close()
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
        summary["health"] = {"samples": self.samples, "warnings": self.warnings[:MAX_WARNINGS_IN_SUMMARY],
                             "n_warnings": len(self.warnings),
                             "straggler_counts": {str(k): v for k, v in sorted(self.straggler_counts.items())}}
