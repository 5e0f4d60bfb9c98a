"""This machine's own matmul peak, measured: chapter 01's roofline, the benchmarks' CPU peak, ``--precision auto``.

Why: a CPU has no data-sheet peak that torch reaches, and bf16 is faster only on cores with bf16 units. The peak is
the fastest of :data:`PEAK_SIZES`, each at its best of :data:`GEMM_REPS` repetitions (load only slows a repetition).
``--precision auto`` picks bf16 on a CUDA device that supports it, and on CPU when bf16 is at least
:data:`AUTO_BF16_MIN_SPEEDUP` × fp32; a CPU without bf16 units gets fp32 untimed (its bf16 GEMM is emulated).
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import torch

from ecomkit.hardware import device_peak_flops

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GEMM_SIZE = 1024            # n × n × n, ~20 ms in fp32 at one thread
GEMM_REPS = 5               # timed repetitions after one warm-up
PEAK_SIZES = (256, 512, GEMM_SIZE)  # the peak is the fastest of these: smaller ones can stay in cache and run faster
AUTO_BF16_MIN_SPEEDUP = 1.5  # "clearly faster": autocast adds casts, so a marginal GEMM gain would not pay
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of x86 units that multiply in bf16
# What cpu_bf16_units() looked for, for every message that reports its answer (the log, benchmarks' warnings).
NO_BF16_UNITS = "no bf16 matmul units (x86: no avx512_bf16 or amx_bf16 flag; Arm: no bf16 feature)"


def matmul_flops(precision: str, device: torch.device | str = "cpu", n: int = GEMM_SIZE,
                 reps: int = GEMM_REPS, best: bool = False) -> float:
    """Median (``best``: fastest) FLOP/s of an ``n × n`` matmul in ``precision`` on ``device`` (2·n³ FLOPs each)."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device).to(DTYPES[precision])
    b = torch.randn(n, n, device=device).to(DTYPES[precision])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / (min(times) if best else statistics.median(times))


def matmul_peak(precision: str, sizes: tuple[int, ...] = PEAK_SIZES, reps: int = GEMM_REPS) -> tuple[float, int]:
    """(the fastest FLOP/s, the size that reached it): each size's best repetition, over ``sizes``, on the CPU."""
    rates = {n: matmul_flops(precision, "cpu", n=n, reps=reps, best=True) for n in sizes}
    size = max(rates, key=rates.get)
    return rates[size], size


@functools.lru_cache(maxsize=None)
def _cpu_peak(precision: str, threads: int) -> tuple[float, int]:
    return matmul_peak(precision)


def measured_cpu_peak(precision: str) -> float:
    """The CPU GEMM peak for ``precision`` at this process's thread count (:func:`matmul_peak`, once per process)."""
    return _cpu_peak(precision, torch.get_num_threads())[0]


def peak_table(device: torch.device | str = "cpu", precisions: tuple[str, ...] = ("fp32", "bf16")) -> list[dict]:
    """Chapter 01: per precision, the measured GEMM rate on ``device`` and (GPU) the hardware table's peak."""
    device = torch.device(device)
    rows = []
    for p in precisions:
        table = device_peak_flops(device, p) if device.type == "cuda" else None
        measured = measured_cpu_peak(p) if device.type == "cpu" else matmul_flops(p, device, n=4 * GEMM_SIZE)
        gemm = f"fastest of {'/'.join(map(str, PEAK_SIZES))}²" if device.type == "cpu" else f"{4 * GEMM_SIZE}²"
        rows.append({"precision": p, "measured_flops_per_s": measured, "table_flops_per_s": table,
                     "threads": torch.get_num_threads(), "gemm": gemm})
    return rows


@functools.lru_cache(maxsize=1)
def _proc_cpuinfo() -> str | None:
    """``/proc/cpuinfo``, read once per process (the launch, the run and a benchmark's facts all ask)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def cpu_bf16_units(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU advertises bf16 matmul units; None when ``/proc/cpuinfo`` cannot tell (not Linux).

    x86: the ``avx512_bf16`` or ``amx_bf16`` flag. Arm: the ``bf16`` feature. ``cpuinfo`` replaces the file (tests).
    """
    cpuinfo = _proc_cpuinfo() if cpuinfo is None else cpuinfo
    if cpuinfo is None:
        return None
    fields = {k.strip().lower(): v.split() for k, _, v in (line.partition(":") for line in cpuinfo.splitlines())}
    if "flags" in fields:
        return any(f in fields["flags"] for f in X86_BF16_FLAGS)
    if "features" in fields:
        return "bf16" in fields["features"]
    return None


def choose_precision(device: torch.device, rates: dict[str, float] | None = None) -> tuple[str, str]:
    """``--precision auto``: (``"bf16"`` or ``"fp32"``, why). ``rates`` replaces the CPU probe (tests)."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} supports bf16"
        return "fp32", f"{torch.cuda.get_device_name(device)} has no bf16 support"
    if device.type != "cpu":
        return "fp32", f"no bf16 probe for device type '{device.type}'"
    if rates is None and cpu_bf16_units() is False:
        return "fp32", (f"this CPU has {NO_BF16_UNITS} in /proc/cpuinfo: a bf16 GEMM would run converted, "
                        "many times slower than fp32 (not timed)")
    rates = rates or {p: measured_cpu_peak(p) for p in ("fp32", "bf16")}
    speedup = rates["bf16"] / rates["fp32"]
    measured = (f"bf16 GEMM {rates['bf16'] / 1e9:.3g} GFLOP/s vs fp32 {rates['fp32'] / 1e9:.3g} GFLOP/s "
                f"({speedup:.2f}x, {torch.get_num_threads()} thread(s))")
    if speedup >= AUTO_BF16_MIN_SPEEDUP:
        return "bf16", f"{measured} >= {AUTO_BF16_MIN_SPEEDUP}x"
    return "fp32", f"{measured} < {AUTO_BF16_MIN_SPEEDUP}x: this CPU does not multiply faster in bf16"


__all__ = ["AUTO_BF16_MIN_SPEEDUP", "GEMM_SIZE", "NO_BF16_UNITS", "PEAK_SIZES", "X86_BF16_FLAGS", "choose_precision",
           "cpu_bf16_units", "matmul_flops", "matmul_peak", "measured_cpu_peak", "peak_table"]
