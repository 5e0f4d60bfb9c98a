"""All-reduce correctness and bandwidth, measured the way nccl-tests reports them.

A job can be wrong (known sums catch it) or slow (the sweep catches it). nccl-tests' definitions:
``algbw = bytes / time``; for all-reduce ``busbw = algbw * 2(n-1)/n``, comparable across world sizes.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from ecomkit.errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20,
          "MIB": 2**20, "G": 2**30, "GB": 2**30, "GIB": 2**30}


def parse_size(text: str) -> int:
    """``"64M"`` → 67108864. Binary units (K = 1024), as nccl-tests' ``-b/-e`` flags use."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise ConfigError(f"--sizes: cannot read {text!r} as a message size. Write a number with an "
                          "optional unit K, M or G (binary), e.g. 1K or 64M.")
    return int(m.group(1)) * _UNITS[unit]


def size_range(spec: str, factor: int = 4) -> list[int]:
    """``"1K:64M"`` with factor 4 → 1K, 4K, 16K, ... up to and including 64M when it is on the grid."""
    parts = spec.split(":")
    if len(parts) != 2:
        raise ConfigError(f"--sizes {spec!r}: expected MIN:MAX, e.g. --sizes 1K:64M.")
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    if lo < 4 or hi < lo or factor < 2:
        raise ConfigError(f"--sizes {spec!r} --factor {factor}: need 4 B <= MIN <= MAX and factor >= 2.")
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def bus_bandwidth(algbw: float, world_size: int, collective: str = "all_reduce") -> float:
    """nccl-tests' bus bandwidth for ``collective`` from algorithm bandwidth."""
    return algbw * BUS_FACTORS[collective](world_size)


@dataclass
class AllReduceCheck:
    """Outcome of the correctness check; ``cases`` maps a case name to pass/fail."""

    passed: bool
    skipped: bool
    cases: dict[str, bool]
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_all_reduce(rank: int, world_size: int, device: torch.device,
                     all_reduce: Callable[[torch.Tensor], Any] | None = None) -> AllReduceCheck:
    """Sum known per-rank values (int64, an exact float32 ramp, a 4 MiB message) and compare with the closed form.

    ``all_reduce`` is injectable so a broken transport can be simulated in tests.
    """
    reduce = all_reduce or dist.all_reduce
    expected = world_size * (world_size + 1) // 2
    cases = {}
    t = torch.full((8,), rank + 1, dtype=torch.int64, device=device)
    reduce(t)
    cases["int64 sum of rank+1"] = bool((t == expected).all())
    ramp = torch.arange(1024, dtype=torch.float32, device=device) * 0.5
    f = ramp * (rank + 1)
    reduce(f)
    cases["float32 ramp"] = bool(torch.equal(f, ramp * expected))
    big = torch.full((1 << 20,), float(rank + 1), dtype=torch.float32, device=device)
    reduce(big)
    cases["float32 4 MiB"] = bool((big == float(expected)).all())
    return AllReduceCheck(passed=all(cases.values()), skipped=False, cases=cases)


def all_ranks_passed(passed: bool, device: torch.device) -> bool:
    """True only if every rank passed (MIN over ranks), so all ranks exit with the same status."""
    flag = torch.tensor([1 if passed else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


@dataclass
class BandwidthRow:
    """One message size: mean time per operation and the two bandwidths (GB/s = 1e9 B/s)."""

    size_bytes: int
    iters: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def iters_for_size(size_bytes: int, iters: int, byte_budget: int = 256 * 2**20) -> int:
    """Fewer iterations for big messages so the sweep stays fast on CPU (at least 2)."""
    return max(2, min(iters, byte_budget // max(1, size_bytes)))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_op(op: Callable[[], Any], iters: int, device: torch.device, barrier: bool) -> float:
    """Seconds per call of ``op``: one warm-up call, barrier, timed loop, device sync."""
    op()
    _synchronize(device)
    if barrier:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        op()
    _synchronize(device)
    return (time.perf_counter() - start) / iters


def _slowest_rank(seconds: float, device: torch.device) -> float:
    """A collective is as slow as its slowest rank: take the max over ranks."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure_all_reduce_bandwidth(sizes: list[int], iters: int, world_size: int,
                                 device: torch.device) -> list[BandwidthRow]:
    """All-reduce (sum, float32) over each size; every rank must call this with the same arguments."""
    rows = []
    for size in sizes:
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        n = iters_for_size(size, iters)
        sec = _slowest_rank(_time_op(lambda: dist.all_reduce(buf), n, device, barrier=True), device)
        algbw = buf.numel() * 4 / sec / 1e9
        rows.append(BandwidthRow(buf.numel() * 4, n, sec * 1e6, algbw, bus_bandwidth(algbw, world_size)))
    return rows


def measure_local_copy_bandwidth(sizes: list[int], iters: int, device: torch.device) -> list[BandwidthRow]:
    """Single process: bytes copied per second by ``dst.copy_(src)``: memory bandwidth, no bus bandwidth."""
    rows = []
    for size in sizes:
        src = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        n = iters_for_size(size, iters)
        sec = _time_op(lambda: dst.copy_(src), n, device, barrier=False)
        rows.append(BandwidthRow(src.numel() * 4, n, sec * 1e6, src.numel() * 4 / sec / 1e9, None))
    return rows


def format_size(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def format_bandwidth(rows: list[BandwidthRow], kind: str) -> str:
    """A table in nccl-tests' spirit: size, iterations, time, algbw, busbw."""
    title = ("all-reduce (sum, float32), time = slowest rank" if kind == "all_reduce"
             else "LOCAL MEMORY COPY, single process: no peer, so NOT an interconnect measurement")
    lines = [f"bandwidth: {title}",
             f"  {'size':>6s} {'iters':>6s} {'time(us)':>10s} {'algbw(GB/s)':>12s} {'busbw(GB/s)':>12s}"]
    for r in rows:
        bus = f"{r.busbw_gbps:12.3f}" if r.busbw_gbps is not None else f"{'n/a':>12s}"
        lines.append(f"  {format_size(r.size_bytes):>6s} {r.iters:6d} {r.time_us:10.1f} {r.algbw_gbps:12.3f} {bus}")
    return "\n".join(lines)
