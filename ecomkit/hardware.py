"""The one hardware table: GPU peak FLOP/s per dtype, memory, HBM bandwidth, and interconnect presets.

MFU, the planner and the time model must agree on what a GPU is. Names match exactly; an unknown GPU or dtype gets
no peak, never another board's. Peaks are dense; ``fp32`` is the non-tensor rate (TF32 off).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import sys
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


@dataclass(frozen=True)
class LinkSpec:
    """A GPU interconnect for the α-β model of ring collectives."""

    key: str
    name: str
    bus_bytes_per_s: float      # achievable all-reduce bus bandwidth per GPU (nccl-tests "busbw")
    latency_s: float            # α: per-hop latency of one ring step
    peak_note: str              # the marketing peak, and where the achievable figure comes from


# Achievable bus bandwidths (what nccl-tests report as busbw on such systems), not the raw peaks in peak_note.
LINKS: dict[str, LinkSpec] = {lk.key: lk for lk in (
    LinkSpec("pcie4-x16", "PCIe 4.0 x16 (through the host)", 20e9, 10e-6,
             "32 GB/s per direction raw; GeForce cards (RTX 4090) have no peer-to-peer, so NCCL stages through host "
             "memory"),
    LinkSpec("nvlink-a100", "NVLink 3 + NVSwitch (A100 SXM)", 230e9, 5e-6,
             "600 GB/s total per GPU (300 per direction); DGX A100 all-reduce busbw ≈ 230 GB/s"),
    LinkSpec("nvlink-h100", "NVLink 4 + NVSwitch (H100 SXM)", 370e9, 5e-6,
             "900 GB/s total per GPU (450 per direction); DGX H100 busbw ≈ 350-450 GB/s"),
    LinkSpec("ib-200g", "InfiniBand HDR 200 Gb/s per GPU", 23e9, 8e-6, "25 GB/s raw per NIC"),
    LinkSpec("ib-400g", "InfiniBand NDR 400 Gb/s per GPU", 46e9, 8e-6, "50 GB/s raw per NIC"),
    LinkSpec("pcie5-x16", "PCIe 5.0 x16 (host link)", 40e9, 10e-6,
             "64 GB/s per direction raw; the achievable figure assumes the same ~62 % of raw as the PCIe 4 preset"),
    # No measured busbw to cite below: each assumes ~41 % of total NVLink bandwidth, as the A100 and H100 presets reach.
    LinkSpec("nvlink-v100", "NVLink 2 (V100 SXM2, DGX-1 hybrid cube mesh)", 123e9, 5e-6,
             "300 GB/s total per GPU (6 links × 25 GB/s per direction); achievable assumed at ~41 % of that"),
    LinkSpec("nvlink-h800", "NVLink 4 at 400 GB/s + NVSwitch (H800 SXM)", 164e9, 5e-6,
             "400 GB/s total per GPU (the H100's NVLink cut for export); achievable assumed at ~41 % of that"),
    LinkSpec("nvlink-b200", "NVLink 5 + NVSwitch (HGX B200)", 740e9, 5e-6,
             "1,800 GB/s total per GPU (900 per direction); achievable assumed at ~41 % of that"),
)}


def default_link(gpu: str | GpuSpec) -> str:
    """The link a plan assumes for ``gpu`` without ``--link``: the board's own (:data:`GPUS`, ``default_link``)."""
    return gpu_spec(gpu).default_link


def link_spec(name: str | LinkSpec) -> LinkSpec:
    """Look up a link preset by key (``--link``); a ConfigError names the known ones."""
    if isinstance(name, LinkSpec):
        return name
    key = str(name).strip().lower()
    if key in LINKS:
        return LINKS[key]
    close = difflib.get_close_matches(key, list(LINKS), n=1)
    raise ConfigError(f"Unknown link '{name}' (--link).{' Did you mean ' + repr(close[0]) + '?' if close else ''} "
                      f"Known links: {', '.join(LINKS)}; or pass a LinkSpec.")


@dataclass(frozen=True)
class NodeSpec:
    """One server: GPUs per PCIe uplink to the CPUs and CPU cores, the host side of ZeRO-Offload."""

    key: str
    name: str
    gpus: int
    gpus_per_host_link: int     # GPUs behind one PCIe uplink to the CPUs
    host_link: str              # LINKS key of that uplink: achievable copy bandwidth per direction
    cpu_cores: int
    source: str

    @property
    def host_links(self) -> int:
        return self.gpus // self.gpus_per_host_link


# DeepSpeedCPUAdam updates per physical core, fp32 masters: an assumption, not measured here (2e9/s on 128 cores).
CPU_ADAM_PARAMS_PER_S_PER_CORE = 2.0e9 / 128

NODES: dict[str, NodeSpec] = {n.key: n for n in (
    NodeSpec("dgx-a100", "DGX A100 / HGX A100 8-GPU", 8, 2, "pcie4-x16", 128,
             "NVIDIA DGX A100 system architecture: four PCIe Gen4 switches, each connecting two A100s (and two "
             "ConnectX-6 NICs) to the CPUs through one x16 uplink; 2 × AMD EPYC 7742, 64 cores each"),
    NodeSpec("dgx-h100", "DGX H100 / HGX H100 8-GPU", 8, 1, "pcie5-x16", 112,
             "NVIDIA DGX H100: each H100 reaches the CPUs through its own PCIe Gen5 x16 path (the ConnectX-7 "
             "modules' PCIe switches, one GPU each); 2 × Intel Xeon Platinum 8480C, 56 cores each"),
    NodeSpec("pcie-server", "8-GPU PCIe server (assumed layout)", 8, 2, "pcie4-x16", 64,
             "an assumption for boards without a reference system: PCIe switches with two GPUs per x16 uplink, "
             "64 cores"),
)}

# Which reference system a board usually sits in (planning default; --node overrides).
GPU_DEFAULT_NODE: dict[str, str] = {"a100-40g": "dgx-a100", "a100-80g": "dgx-a100", "h100-80g": "dgx-h100",
                                    "h800": "dgx-h100", "h200": "dgx-h100"}


def node_spec(name: str | NodeSpec | None, gpu: str | GpuSpec | None = None) -> NodeSpec:
    """A node preset by key (``--node``); ``None`` picks the usual system of ``gpu``, else the generic PCIe server."""
    if isinstance(name, NodeSpec):
        return name
    if name is None:
        key = gpu.key if isinstance(gpu, GpuSpec) else (find_gpu(gpu).key if gpu and find_gpu(gpu) else "")
        return NODES[GPU_DEFAULT_NODE.get(key, "pcie-server")]
    key = str(name).strip().lower()
    if key in NODES:
        return NODES[key]
    raise ConfigError(f"Unknown node '{name}' (--node). Known nodes: {', '.join(NODES)}; or pass a NodeSpec.")


def node_cpu_adam_params_per_s(node: NodeSpec) -> float:
    """Parameters per second the node's cores update with CPU Adam (all its ranks together)."""
    return node.cpu_cores * CPU_ADAM_PARAMS_PER_S_PER_CORE


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


def extensions_dir() -> Path:
    """Where this Python environment's C++ extensions are built: ``~/.cache/ecomkit/torch_extensions/<env>``.

    A build records its environment's include paths, so two environments sharing a folder rebuild each other's.
    """
    env = f"py{sys.version_info[0]}{sys.version_info[1]}-{hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]}"
    return Path.home() / ".cache" / "ecomkit" / "torch_extensions" / env


__all__ = ["GpuSpec", "GPUS", "GPU_ALIASES", "find_gpu", "gpu_kind", "device_kind", "gpu_spec", "LinkSpec", "LINKS",
           "link_spec", "default_link", "extensions_dir",
           "unknown_gpu_message", "peak_flops_or_reason", "device_peak", "device_peak_flops", "mfu_fields",
           "NodeSpec", "NODES", "GPU_DEFAULT_NODE", "node_spec", "node_cpu_adam_params_per_s",
           "CPU_ADAM_PARAMS_PER_S_PER_CORE", "GIB"]
