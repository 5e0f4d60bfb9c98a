"""What this process runs on: versions, devices and CPU threads.

Many "distributed is slow/broken" reports are a CPU-only build, a CUDA/NCCL mismatch or oversubscribed threads.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from typing import Any

import torch

NOT_AVAILABLE = "not available"
NOT_INSTALLED = "not installed"
LIBRARIES = ("transformers", "datasets", "accelerate", "deepspeed")


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str]:
    """Installed versions from package metadata, without importing (deepspeed's import is slow and noisy)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = NOT_INSTALLED
    return out


def nccl_version() -> str:
    """NCCL version linked into torch, or "not available" on CPU builds."""
    if not torch.cuda.is_available():
        return NOT_AVAILABLE
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # built without NCCL
        return NOT_AVAILABLE
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def stack_versions() -> dict[str, str]:
    """Python, torch, CUDA and NCCL versions."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or NOT_AVAILABLE,
        "cuda_available": str(torch.cuda.is_available()),
        "nccl": nccl_version(),
        "gloo_available": str(torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    }


def device_list() -> list[dict[str, Any]]:
    """Every visible GPU with name, memory and compute capability; the CPU when there is none."""
    if not torch.cuda.is_available():
        return [{"index": None, "type": "cpu", "name": platform.processor() or platform.machine()}]
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({
            "index": i,
            "type": "cuda",
            "name": p.name,
            "memory_gib": round(p.total_memory / 2**30, 1),
            "capability": f"{p.major}.{p.minor}",
        })
    return devices


def usable_cpu_count() -> int:
    """Cores this process may run on (taskset / cgroup affinity), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_threads() -> dict[str, Any]:
    """torch's intra-op threads next to the core count and OMP_NUM_THREADS, to spot oversubscription."""
    return {
        "torch_num_threads": torch.get_num_threads(),
        "os_cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpu_count(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
    }


def system_report() -> dict[str, Any]:
    """All of the above for this process, as a JSON-ready dict."""
    return {
        "host": socket.gethostname(),
        "versions": stack_versions(),
        "libraries": library_versions(),
        "devices": device_list(),
        "cpu": cpu_threads(),
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as aligned text lines for a terminal or a notebook cell."""
    lines = [f"host: {report['host']}"]
    lines += [f"  {k:18s} {v}" for k, v in report["versions"].items()]
    lines.append("libraries:")
    lines += [f"  {k:18s} {v}" for k, v in report["libraries"].items()]
    lines.append("devices:")
    for d in report["devices"]:
        if d["type"] == "cuda":
            lines.append(f"  cuda:{d['index']}  {d['name']}  {d['memory_gib']} GiB  sm_{d['capability']}")
        else:
            lines.append(f"  cpu  {d['name']}  (no CUDA device visible)")
    lines.append("cpu threads:")
    lines += [f"  {k:18s} {v}" for k, v in report["cpu"].items()]
    return "\n".join(lines)
