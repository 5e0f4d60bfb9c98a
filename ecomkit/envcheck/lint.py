"""Lint the NCCL / torch.distributed environment variables that are known to hurt.

Most slow or hanging jobs come from one exported variable, harmless on one machine and costly on another, so each
rule weighs it against this machine's facts. :func:`lint_env` is pure, so every rule is unit-tested without hardware.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from ecomkit.envcheck.system import usable_cpu_count

ERROR = "error"
WARNING = "warning"
INFO = "info"
_SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}


@dataclass(frozen=True)
class Finding:
    """One variable that deserves attention; ``severity`` is error, warning or info."""

    variable: str
    severity: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class MachineFacts:
    """What the rules need to know about the machine (``None`` = could not tell)."""

    n_cpus: int
    n_gpus: int
    local_world_size: int
    has_infiniband: bool
    has_nvlink: bool | None
    interfaces: tuple[str, ...] | None = None


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in {"1", "true", "yes", "on"}


def _rule_p2p(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    level = env.get("NCCL_P2P_LEVEL", "").strip().upper()
    disabled_by = "NCCL_P2P_DISABLE" if _truthy(env.get("NCCL_P2P_DISABLE")) else None
    if disabled_by is None and level in {"LOC", "0"}:
        disabled_by = "NCCL_P2P_LEVEL"
    if disabled_by is None:
        return []
    what = (
        f"{disabled_by}={env[disabled_by]} turns off direct GPU-to-GPU copies (NVLink and PCIe P2P), "
        "so intra-node traffic is staged through host memory. It is a debugging switch for broken "
        "P2P drivers, not a speed-up, although some tuning guides recommend it as one."
    )
    if m.has_nvlink:
        return [Finding(disabled_by, ERROR, what + " NVLink is present: expect many times lower intra-node all-reduce bandwidth.")]
    if m.n_gpus > 1:
        return [Finding(disabled_by, WARNING, what + " With several GPUs on this node it slows every intra-node collective.")]
    return [Finding(disabled_by, INFO, what + " With at most one GPU it has no effect, but remove it before moving to a multi-GPU node.")]


def _rule_ib(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    if not _truthy(env.get("NCCL_IB_DISABLE")):
        return []
    what = (
        "NCCL_IB_DISABLE=1 stops NCCL from using InfiniBand/RoCE, so inter-node traffic falls back "
        "to TCP sockets. It does not make intra-node traffic faster (that uses NVLink, P2P or shared memory anyway)."
    )
    if m.has_infiniband:
        return [Finding("NCCL_IB_DISABLE", ERROR, what + " InfiniBand devices are present: inter-node bandwidth typically drops several-fold or more.")]
    return [Finding("NCCL_IB_DISABLE", INFO, what + " Without InfiniBand devices it changes nothing.")]


def _ifname_matches(spec: str, interfaces: Sequence[str]) -> list[str]:
    """Interfaces selected by an NCCL_SOCKET_IFNAME-style spec (prefixes, ``=exact``, ``^exclude``)."""
    exclude = spec.startswith("^")
    items = [s.strip() for s in spec.lstrip("^").split(",") if s.strip()]

    def hit(name: str, item: str) -> bool:
        return name == item[1:] if item.startswith("=") else name.startswith(item)

    if exclude:
        return [i for i in interfaces if not any(hit(i, it) for it in items)]
    return [i for i in interfaces if any(hit(i, it) for it in items)]


def _rule_ifname(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    if m.interfaces is None:
        return []
    out = []
    for var, exact in (("NCCL_SOCKET_IFNAME", False), ("GLOO_SOCKET_IFNAME", True)):
        spec = env.get(var, "").strip()
        if not spec:
            continue
        # gloo takes a comma-separated list of exact names, NCCL takes prefixes.
        chosen = _ifname_matches(",".join("=" + s for s in spec.split(",")) if exact else spec, m.interfaces)
        if not chosen:
            out.append(Finding(var, ERROR, (
                f"{var}={spec} matches none of this machine's network interfaces "
                f"({', '.join(m.interfaces) or 'none'}). Process-group set-up will fail or hang; "
                "set it to an interface that exists on every node (see `ip addr`), or unset it.")))
    return out


def _rule_debug_logging(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    out = []
    level = env.get("NCCL_DEBUG", "").strip().upper()
    if level in {"INFO", "TRACE"}:
        out.append(Finding("NCCL_DEBUG", WARNING, (
            f"NCCL_DEBUG={level} prints several lines per rank for every communicator and, with "
            "TRACE, per operation: useful to diagnose a hang, but it floods production logs. "
            "Use WARN (or unset) once the job runs.")))
    tdd = env.get("TORCH_DISTRIBUTED_DEBUG", "").strip().upper()
    if tdd == "DETAIL":
        out.append(Finding("TORCH_DISTRIBUTED_DEBUG", WARNING, (
            "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective for consistency across ranks "
            "and logs DDP internals: it finds mismatched collectives but slows training. Debug only.")))
    elif tdd == "INFO":
        out.append(Finding("TORCH_DISTRIBUTED_DEBUG", INFO, (
            "TORCH_DISTRIBUTED_DEBUG=INFO adds DDP start-up and unused-parameter logging; cheap, but unset it in production.")))
    return out


def _rule_error_handling(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    out = []
    for var in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        if env.get(var, "").strip() == "0":
            out.append(Finding(var, WARNING, (
                f"{var}=0 switches off NCCL async error handling: when a rank dies or a collective "
                "times out, the other ranks are not aborted and the job hangs instead of failing. "
                "Unset it (torchrun defaults to 1) and pass an explicit timeout to "
                "init_process_group (ecomkit.dist.setup_distributed(timeout_s=...) does).")))
    for old, new in (("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
                     ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT")):
        if old in env and env.get(old, "").strip() != "0":
            out.append(Finding(old, INFO, (
                f"{old} is the deprecated spelling of {new}; PyTorch still reads it with a warning. "
                f"Rename it so it keeps working.")))
    if _truthy(env.get("TORCH_NCCL_BLOCKING_WAIT")) or _truthy(env.get("NCCL_BLOCKING_WAIT")):
        var = "TORCH_NCCL_BLOCKING_WAIT" if "TORCH_NCCL_BLOCKING_WAIT" in env else "NCCL_BLOCKING_WAIT"
        out.append(Finding(var, INFO, (
            f"{var}=1 makes every wait() block the CPU until the collective finishes or times out. "
            "It gives precise timeout errors but removes CPU/GPU overlap; prefer async error handling.")))
    if "NCCL_SOCKET_TIMEOUT" in env:
        out.append(Finding("NCCL_SOCKET_TIMEOUT", INFO, (
            "NCCL_SOCKET_TIMEOUT is not an NCCL variable (NCCL documents no such setting), so it "
            "changes nothing. The collective timeout is init_process_group(timeout=...).")))
    return out


def _rule_launch_blocking(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    if not _truthy(env.get("CUDA_LAUNCH_BLOCKING")):
        return []
    sev = WARNING if m.n_gpus > 0 else INFO
    return [Finding("CUDA_LAUNCH_BLOCKING", sev, (
        "CUDA_LAUNCH_BLOCKING=1 makes every kernel launch synchronous, so the CPU waits for each "
        "kernel and compute cannot overlap communication. It exists to get exact error locations; unset it for training."))]


def _rule_omp(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    raw = env.get("OMP_NUM_THREADS")
    procs = max(1, m.local_world_size)
    if raw is None or not raw.strip():
        if procs > 1:
            return [Finding("OMP_NUM_THREADS", WARNING, (
                f"OMP_NUM_THREADS is unset with {procs} processes on this node: each CPU-side op may start "
                f"{m.n_cpus} threads per process and they fight for {m.n_cpus} cores. Set it to "
                f"cores // processes (here {max(1, m.n_cpus // procs)})."))]
        return [Finding("OMP_NUM_THREADS", INFO, (
            f"OMP_NUM_THREADS is unset: one process uses all {m.n_cpus} cores, which is fine. "
            "torchrun sets it to 1 for multi-process runs."))]
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        return [Finding("OMP_NUM_THREADS", ERROR, f"OMP_NUM_THREADS={raw!r} is not a positive integer; set e.g. OMP_NUM_THREADS=1.")]
    if n * procs > m.n_cpus:
        return [Finding("OMP_NUM_THREADS", WARNING, (
            f"OMP_NUM_THREADS={n} × {procs} process(es) = {n * procs} threads for {m.n_cpus} cores: "
            f"oversubscribed CPU threads slow data loading and CPU ops. Use at most {max(1, m.n_cpus // procs)}."))]
    return []


def _rule_visible_devices(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return []
    ids = [s.strip() for s in raw.split(",") if s.strip()]
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        return [Finding("CUDA_VISIBLE_DEVICES", ERROR, (
            f"CUDA_VISIBLE_DEVICES={raw} lists device(s) {', '.join(dups)} more than once: two ranks would "
            "share one GPU and NCCL aborts with 'Duplicate GPU detected'. List each GPU once."))]
    if not ids or ids[0].startswith("-"):
        return [Finding("CUDA_VISIBLE_DEVICES", WARNING, (
            f"CUDA_VISIBLE_DEVICES={raw!r} hides every GPU, so the job silently runs on CPU with gloo."))]
    return []


def _rule_shm(env: Mapping[str, str], m: MachineFacts) -> list[Finding]:
    if not _truthy(env.get("NCCL_SHM_DISABLE")):
        return []
    sev = WARNING if m.n_gpus > 1 else INFO
    return [Finding("NCCL_SHM_DISABLE", sev, (
        "NCCL_SHM_DISABLE=1 removes the shared-memory path between GPUs that cannot use P2P, "
        "so they talk over the network stack instead. A debugging switch; unset it."))]


RULES: tuple[Callable[[Mapping[str, str], MachineFacts], list[Finding]], ...] = (
    _rule_p2p, _rule_ib, _rule_ifname, _rule_shm, _rule_debug_logging,
    _rule_error_handling, _rule_launch_blocking, _rule_omp, _rule_visible_devices,
)


def lint_env(
    environ: Mapping[str, str],
    *,
    n_cpus: int,
    n_gpus: int,
    local_world_size: int,
    has_infiniband: bool,
    has_nvlink: bool | None,
    interfaces: Sequence[str] | None = None,
) -> list[Finding]:
    """Return the findings for ``environ`` on a machine with the given facts, errors first (``None``: unknown)."""
    facts = MachineFacts(n_cpus, n_gpus, local_world_size, has_infiniband, has_nvlink,
                         None if interfaces is None else tuple(interfaces))
    findings = [f for rule in RULES for f in rule(environ, facts)]
    return sorted(findings, key=lambda f: (_SEVERITY_ORDER[f.severity], f.variable))


def _has_infiniband(sys_dir: Path = Path("/sys/class/infiniband")) -> bool:
    try:
        return sys_dir.is_dir() and any(sys_dir.iterdir())
    except OSError:
        return False


def _has_nvlink(n_gpus: int) -> bool | None:
    """True if any NVLink link of GPU 0 is active (NVML); None when NVML cannot tell."""
    if n_gpus == 0:
        return False
    try:
        import pynvml  # lazy: NVML bindings are only useful (and loadable) on GPU machines

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link):
                        return True
                except pynvml.NVMLError:
                    break
            return False
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library, no driver, or an old GPU: unknown, not an error
        return None


def _interfaces() -> tuple[str, ...] | None:
    try:
        return tuple(name for _, name in socket.if_nameindex())
    except OSError:
        return None


def probe_machine(local_world_size: int | None = None) -> MachineFacts:
    """Gather the machine facts cheaply: CPU affinity, GPU count, /sys/class/infiniband, NVML, interfaces."""
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return MachineFacts(usable_cpu_count(), n_gpus, local_world_size, _has_infiniband(), _has_nvlink(n_gpus), _interfaces())


def lint_current_env(local_world_size: int | None = None) -> list[Finding]:
    """Lint ``os.environ`` against this machine."""
    m = probe_machine(local_world_size)
    return lint_env(os.environ, n_cpus=m.n_cpus, n_gpus=m.n_gpus, local_world_size=m.local_world_size,
                    has_infiniband=m.has_infiniband, has_nvlink=m.has_nvlink, interfaces=m.interfaces)


def format_findings(findings: Sequence[Finding]) -> str:
    """Human-readable lines, one block per finding; says so when there is nothing to report."""
    if not findings:
        return "environment lint: no findings"
    lines = [f"environment lint: {len(findings)} finding(s)"]
    for f in findings:
        lines.append(f"  [{f.severity.upper():7s}] {f.variable}: {f.message}")
    return "\n".join(lines)
