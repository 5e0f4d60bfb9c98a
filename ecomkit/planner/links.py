"""Interconnect and server presets: the links and nodes the planner prices collectives and CPU offload on.

Why apart from the GPU table: a training run needs a GPU's peak for MFU, never a link; only a plan does.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ecomkit.errors import ConfigError
from ecomkit.hardware import GpuSpec, find_gpu, gpu_spec


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
