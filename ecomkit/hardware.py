"""What the hardware can do: the one GPU table (peak FLOP/s per dtype, memory, HBM bandwidth), a CPU's measured one.

MFU, the planner and the time model must agree on what a GPU is. Names match exactly; an unknown GPU or dtype gets
no peak, never another board's. Peaks are dense; ``fp32`` is the non-tensor rate (TF32 off).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ecomkit.config import PRECISIONS
from ecomkit.errors import ConfigError

log = logging.getLogger("ecomkit")
GIB = 1024**3


def _gib(x: float) -> int:
    return int(x * GIB)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU board: what the planner and MFU need. A ``None`` peak means the board lacks that dtype."""

    key: str
    name: str                    # what tables and verdicts print
    memory_bytes: int            # torch's total_memory (approx.)
    hbm_bytes_per_s: float       # memory bandwidth (data sheet), for the optimizer step
    tflops_bf16: float | None    # dense tensor-core peak, TFLOP/s
    tflops_fp16: float | None
    tflops_fp32: float           # non-tensor FP32
    default_link: str            # the interconnect a plan assumes without --link (a LINKS key; see GPUS)

    def supports(self, precision: str) -> bool:
        return self._tflops(precision) is not None

    def _tflops(self, precision: str) -> float | None:
        if precision not in PRECISIONS:
            raise ConfigError(f"Unknown precision '{precision}'. Choose one of: {', '.join(PRECISIONS)}.")
        return {"bf16": self.tflops_bf16, "fp16": self.tflops_fp16, "fp32": self.tflops_fp32}[precision]

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; a ConfigError when the board has no such tensor cores."""
        tflops = self._tflops(precision)
        if tflops is None:
            other = [p for p in PRECISIONS if self._tflops(p) is not None]
            raise ConfigError(f"{self.name} has no {precision} tensor cores, so there is no {precision} peak to plan "
                              f"with. Use --precision {' or '.join(other)}, or another --gpu.")
        return tflops * 1e12


# Sources (dense peaks, half the sparse ones): NVIDIA's data sheets (A100, H100 SXM/PCIe/NVL, H200, HGX B200, L40S,
# A10, V100 SXM2), the H800 product brief, the Ada whitepaper (RTX 4090) and the figures published for AWS G5 (A10G).
# Default links: the board's usual system (NVLink for SXM boards; PCIe for the rest, and the H100 NVL's pair bridges
# do not span a ring of more than two). --link overrides.
GPUS: dict[str, GpuSpec] = {g.key: g for g in (
    GpuSpec("a100-40g", "A100-SXM4-40GB", _gib(39.4), 1.555e12, 312.0, 312.0, 19.5, "nvlink-a100"),
    GpuSpec("a100-80g", "A100-SXM4-80GB", _gib(79.2), 2.039e12, 312.0, 312.0, 19.5, "nvlink-a100"),
    GpuSpec("a100-pcie-40g", "A100-PCIe-40GB", _gib(39.4), 1.555e12, 312.0, 312.0, 19.5, "pcie4-x16"),
    GpuSpec("a100-pcie-80g", "A100-PCIe-80GB", _gib(79.2), 1.935e12, 312.0, 312.0, 19.5, "pcie4-x16"),
    GpuSpec("h100-80g", "H100-SXM5-80GB", _gib(79.1), 3.35e12, 989.0, 989.0, 67.0, "nvlink-h100"),
    GpuSpec("h100-pcie", "H100-PCIe-80GB", _gib(79.1), 2.0e12, 756.0, 756.0, 51.0, "pcie5-x16"),
    GpuSpec("h100-nvl", "H100-NVL-94GB", _gib(93.1), 3.9e12, 835.0, 835.0, 60.0, "pcie5-x16"),
    GpuSpec("h800", "H800-SXM5-80GB", _gib(79.1), 3.35e12, 989.0, 989.0, 67.0, "nvlink-h800"),
    GpuSpec("h200", "H200-SXM-141GB", _gib(139.8), 4.8e12, 989.0, 989.0, 67.0, "nvlink-h100"),
    GpuSpec("b200", "B200-HGX-180GB", _gib(178.4), 8.0e12, 2250.0, 2250.0, 80.0, "nvlink-b200"),
    GpuSpec("l40s", "L40S 48GB", _gib(44.4), 0.864e12, 362.0, 362.0, 91.6, "pcie4-x16"),
    GpuSpec("a10-24g", "A10 24GB", _gib(22.0), 0.6e12, 125.0, 125.0, 31.2, "pcie4-x16"),
    GpuSpec("a10g", "A10G 24GB", _gib(22.0), 0.6e12, 70.0, 70.0, 35.0, "pcie4-x16"),
    GpuSpec("rtx4090", "GeForce RTX 4090 24GB", _gib(23.6), 1.008e12, 165.2, 165.2, 82.6, "pcie4-x16"),
    GpuSpec("v100-32g", "V100-SXM2-32GB", _gib(31.7), 0.9e12, None, 125.0, 15.7, "nvlink-v100"),
    GpuSpec("v100-16g", "V100-SXM2-16GB", _gib(15.8), 0.9e12, None, 125.0, 15.7, "nvlink-v100"),
)}

# Other spellings that name a row: short flags, and torch.cuda.get_device_name()'s strings.
GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80g", "a100-40gb": "a100-40g", "a100-80gb": "a100-80g",
    "nvidia a100-sxm4-40gb": "a100-40g", "nvidia a100-sxm4-80gb": "a100-80g",
    "nvidia a100-pcie-40gb": "a100-pcie-40g", "nvidia a100 80gb pcie": "a100-pcie-80g",
    "h100": "h100-80g", "h100-80gb": "h100-80g", "h100-sxm": "h100-80g", "nvidia h100 80gb hbm3": "h100-80g",
    "nvidia h100 pcie": "h100-pcie", "nvidia h100 nvl": "h100-nvl",
    "nvidia h800": "h800", "h800-sxm": "h800",
    "nvidia h200": "h200", "h200-sxm": "h200",
    "nvidia b200": "b200",
    "nvidia l40s": "l40s",
    "a10": "a10-24g", "nvidia a10": "a10-24g", "nvidia a10g": "a10g",
    "4090": "rtx4090", "rtx-4090": "rtx4090", "rtx4090-24g": "rtx4090", "nvidia geforce rtx 4090": "rtx4090",
    "v100": "v100-32g", "tesla v100-sxm2-32gb": "v100-32g", "tesla v100-sxm2-16gb": "v100-16g",
}


def find_gpu(name: str) -> GpuSpec | None:
    """The row whose key or alias equals ``name`` (case-insensitive, surrounding spaces ignored); else ``None``."""
    key = str(name).strip().lower()
    return GPUS.get(GPU_ALIASES.get(key, key))


def gpu_kind(device_name: str) -> str:
    """The key measurements of one GPU kind are filed under: the table's key (``h200``), else the name lowercased.

    A rule measured on one board applies to every spelling of its kind, and never to another board.
    """
    spec = find_gpu(device_name)
    return spec.key if spec is not None else str(device_name).strip().lower()


def device_kind(device: torch.device) -> str:
    """``"cpu"`` for a CPU, else :func:`gpu_kind` of the CUDA device's name."""
    if device.type != "cuda":
        return device.type
    return gpu_kind(torch.cuda.get_device_name(device))


def gpu_spec(name: str | GpuSpec) -> GpuSpec:
    """Look up a GPU by key, alias or device name; a ConfigError names the known ones (``--gpu``)."""
    if isinstance(name, GpuSpec):
        return name
    spec = find_gpu(name)
    if spec is not None:
        return spec
    close = difflib.get_close_matches(str(name).lower(), list(GPUS) + list(GPU_ALIASES), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"Unknown GPU '{name}' (--gpu).{hint} Known GPUs: {', '.join(GPUS)}. To plan for another "
                      "board, add it to ecomkit/hardware.py or pass a GpuSpec from Python.")


_REPORTED: set[str] = set()


def unknown_gpu_message(device_name: str) -> str:
    return f"MFU not reported: unknown GPU '{device_name}'; add it to ecomkit/hardware.py"


def peak_flops_or_reason(device_name: str, precision: str) -> tuple[float | None, str | None]:
    """(peak FLOP/s, None) for a known board and dtype, else (None, why MFU cannot be reported)."""
    spec = find_gpu(device_name)
    if spec is None:
        return None, unknown_gpu_message(device_name)
    if not spec.supports(precision):
        return None, f"MFU not reported: {spec.name} has no {precision} peak (no {precision} tensor cores)"
    return spec.peak_flops(precision), None


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one device for ``precision`` (:func:`device_peak`'s peak)."""
    return device_peak(device, precision)[0]


def device_peak(device: torch.device, precision: str) -> tuple[float | None, str | None]:
    """(peak FLOP/s of one device, why MFU is not reported): looked up once per run, never per step."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None, None
    peak, reason = peak_flops_or_reason(torch.cuda.get_device_name(device), precision)
    if reason is not None and reason not in _REPORTED:
        _REPORTED.add(reason)
        log.warning(reason)
    return peak, reason


def mfu_fields(achieved_flops_per_s: float, peak_per_device: float | None, n_devices: int,
               note: str | None = None) -> dict[str, float | str | None]:
    """``{"mfu": fraction}`` over ``n_devices`` peaks, or ``{"mfu": None}`` with ``note`` (why) where one is given."""
    if peak_per_device:
        return {"mfu": achieved_flops_per_s / (peak_per_device * n_devices)}
    return {"mfu": None, "mfu_note": note} if note else {"mfu": None}


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GEMM_SIZE = 1024            # n × n × n, ~20 ms in fp32 at one thread
GEMM_REPS = 5               # timed repetitions after one warm-up
PEAK_SIZES = (256, 512, GEMM_SIZE)  # the peak is the fastest of these: smaller ones can stay in cache and run faster
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of x86 units that multiply in bf16
# What cpu_bf16_units() looked for, for every message that reports its answer (the log, benchmarks' warnings).
NO_BF16_UNITS = "no bf16 matmul units (x86: no avx512_bf16 or amx_bf16 flag; Arm: no bf16 feature)"


def matmul_flops(precision: str, device: torch.device | str = "cpu", n: int = GEMM_SIZE,
                 reps: int = GEMM_REPS, best: bool = False) -> float:
    """Median (``best``: fastest) FLOP/s of an ``n × n`` matmul in ``precision`` on ``device`` (2·n³ FLOPs each).

    Why measured: a CPU has no data-sheet peak that torch reaches.
    """
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
    """(the fastest FLOP/s, the size that reached it) on the CPU: each size at its best repetition (load only slows)."""
    rates = {n: matmul_flops(precision, "cpu", n=n, reps=reps, best=True) for n in sizes}
    size = max(rates, key=rates.get)
    return rates[size], size


@functools.lru_cache(maxsize=None)
def _cpu_peak(precision: str, threads: int) -> tuple[float, int]:
    return matmul_peak(precision)


def measured_cpu_peak(precision: str) -> float:
    """The CPU GEMM peak for ``precision`` at this process's thread count (:func:`matmul_peak`, once per process)."""
    return _cpu_peak(precision, torch.get_num_threads())[0]


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


def extensions_dir() -> Path:
    """Where this Python environment's C++ extensions are built: ``~/.cache/ecomkit/torch_extensions/<env>``.

    A build records its environment's include paths, so two environments sharing a folder rebuild each other's.
    """
    env = f"py{sys.version_info[0]}{sys.version_info[1]}-{hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]}"
    return Path.home() / ".cache" / "ecomkit" / "torch_extensions" / env


__all__ = ["GpuSpec", "GPUS", "GPU_ALIASES", "find_gpu", "gpu_kind", "device_kind", "gpu_spec", "extensions_dir",
           "unknown_gpu_message", "peak_flops_or_reason", "device_peak", "device_peak_flops", "mfu_fields", "GIB",
           "DTYPES", "GEMM_SIZE", "NO_BF16_UNITS", "PEAK_SIZES", "cpu_bf16_units", "matmul_flops", "matmul_peak",
           "measured_cpu_peak"]
