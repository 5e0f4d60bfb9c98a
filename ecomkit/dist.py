"""The process group: set up from torchrun's environment (one process, gloo on CPUs, nccl on GPUs), collectives.

Decided here once, so the same script runs everywhere; teardown collects and barriers first, or gloo crashes at exit.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import faulthandler
import functools
import gc
import hashlib
import logging
import os
import random
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ecomkit.errors import EcomkitError

log = logging.getLogger("ecomkit")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job. ``world_size == 1`` means no process group."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: str = "none"
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Only rank 0 logs, draws progress bars and writes summary files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def read_torchrun_env() -> tuple[int, int, int, int]:
    """Return (rank, local_rank, world_size, local_world_size) from torchrun's variables (one process without them)."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return rank, local_rank, world, local_world


def pick_backend_and_device(local_rank: int) -> tuple[str, torch.device]:
    """nccl + ``cuda:LOCAL_RANK`` when GPUs exist, gloo + cpu otherwise."""
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        if local_rank >= n:
            raise EcomkitError(f"LOCAL_RANK={local_rank} but this node has only {n} GPU(s). Launch with "
                               f"--nproc_per_node {n} (or fewer), or set CUDA_VISIBLE_DEVICES so that every process "
                               "gets its own GPU (two ranks on one GPU make NCCL fail with 'Duplicate GPU detected').")
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def seed_everything(seed: int, rank: int = 0, offset_by_rank: bool = False) -> None:
    """Seed python, numpy and torch; no rank offset unless ``offset_by_rank`` (model init must match on every rank)."""
    s = seed + (rank if offset_by_rank else 0)
    random.seed(s)
    np.random.seed(s % (2**32))
    torch.manual_seed(s)


def setup_distributed(timeout_s: float = 600.0, seed: int | None = 0) -> DistEnv:
    """The default process group if torchrun started us, and this process's :class:`DistEnv`.
    Why ``timeout_s``: the defaults (10-30 min) turn a stalled rank into a long silent hang."""
    rank, local_rank, world, local_world = read_torchrun_env()
    if world > 1:
        backend, device = pick_backend_and_device(local_rank)
        if backend == "nccl":
            torch.cuda.set_device(device)
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=_dt.timedelta(seconds=timeout_s),
                                    device_id=device if backend == "nccl" else None,
                                    **restart_safe_rendezvous(rank, world, timeout_s))
    else:
        backend = "none"
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
    configure_logging(rank)
    install_stack_dump_signal()  # `kill -USR1 <pid>` prints a rank's stacks instead of killing it (chapter 07)
    if seed is not None:
        seed_everything(seed, rank)
    return DistEnv(rank, local_rank, world, local_world, backend, device)


SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # "1": a fresh store per rendezvous round


def restart_safe_rendezvous(rank: int, world_size: int, timeout_s: float) -> dict:
    """A per-restart namespace for the rendezvous keys, when torchrun shares its store with the workers.
    Why: torch keeps it across ``--max-restarts``; a restarted rank could read the dead attempt's keys."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    check_multinode_restarts(world_size)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=False, timeout=_dt.timedelta(seconds=timeout_s))
    attempt = restart_attempt()
    return {"store": dist.PrefixStore(f"ecomkit/attempt_{attempt}", store), "rank": rank, "world_size": world_size}


def restart_attempt() -> int:
    """Which attempt of the launch this worker is: 0 first, then 1, 2, ... after torchrun restarted the workers."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def max_restarts() -> int:
    """torchrun's ``--max-restarts``, which it exports to the workers (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)


def check_multinode_restarts(world_size: int) -> None:
    """Refuse ``--max-restarts > 0`` on several nodes with torchrun's shared store (see restart_safe_rendezvous)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    restarts = max_restarts()
    if world_size > local_world and restarts > 0:
        raise EcomkitError(
            f"this job runs on several nodes ({world_size} processes, {local_world} on this node) with "
            f"--max-restarts {restarts}, and torchrun shares its rendezvous store with the workers (torch's "
            "default). A node that dies and is started again could not rejoin: the rendezvous would wait for "
            "MASTER_ADDR / role_info keys until a 60 s timeout and the job would fail. Start every node's torchrun "
            f"with {SHARED_STORE_ENV}=1 in its environment (scripts/slurm_2nodes.sbatch does; see "
            "docs/multinode.md), or with --max-restarts 0 and restart the whole job from its last checkpoint.")


def configure_logging(rank: int) -> None:
    """INFO on rank 0, WARNING elsewhere: one readable log instead of N interleaved ones."""
    level = logging.INFO if rank == 0 else logging.WARNING
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s ecomkit r" + str(rank) + "] %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(level)


def teardown() -> None:
    """Collect garbage, barrier, destroy the process group (gloo-safe); drop models and optimizers before calling."""
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


@contextlib.contextmanager
def distributed_session(timeout_s: float = 600.0, seed: int | None = 0) -> Iterator[DistEnv]:
    """``with distributed_session() as env:`` — set up, run, always tear down (no barrier after an exception)."""
    env = setup_distributed(timeout_s=timeout_s, seed=seed)
    try:
        yield env
    except BaseException:
        if dist.is_available() and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()
        raise
    teardown()


def _all_reduce_float(value: float, env: DistEnv, op: Any) -> float:
    """All-reduce one Python float with ``op`` (the value itself for a single process)."""
    if not env.distributed:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=collective_device(env))
    dist.all_reduce(t, op=op)
    return float(t.item())


def collective_device(env: DistEnv) -> torch.device:
    """Where a collective's tensor must live: the GPU for NCCL, the CPU for gloo."""
    return env.device if env.backend == "nccl" else torch.device("cpu")


def all_reduce_sum_tensor(values: Sequence[torch.Tensor | float], env: DistEnv) -> torch.Tensor:
    """Element-wise sums over ranks: a float64 tensor on :func:`collective_device`, never read here (no host sync)."""
    device = collective_device(env)
    host = to_device(torch.tensor([0.0 if isinstance(v, torch.Tensor) else float(v) for v in values],
                                  dtype=torch.float64), device)
    t = torch.stack([v.detach().reshape(()).to(device, torch.float64) if isinstance(v, torch.Tensor) else host[i]
                     for i, v in enumerate(values)])
    if env.distributed:
        dist.all_reduce(t)
    return t


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without making the host wait: pinned and copied asynchronously to a GPU."""
    if device.type != "cuda" or t.device.type == "cuda":
        return t.to(device)
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)


def all_reduce_mean(value: float, env: DistEnv) -> float:
    """Average a Python float over ranks (a no-op for a single process)."""
    return _all_reduce_float(value, env, dist.ReduceOp.SUM) / env.world_size


def all_reduce_max(value: float, env: DistEnv) -> float:
    """The largest of every rank's float (``all_reduce(MAX)``; a collective every rank must call)."""
    return _all_reduce_float(value, env, dist.ReduceOp.MAX)


def gather_objects(obj: Any, env: DistEnv) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` without a process group.
    A collective: callers catch their local errors first and gather the error, never skip the call."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def replica_checksums(model: torch.nn.Module, env: DistEnv) -> list[str]:
    """SHA-256 of every rank's parameters, gathered: replicas must be bit-identical after DDP."""
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())  # any dtype, bf16 too
    return gather_objects(h.hexdigest()[:16], env)


@functools.cache
def install_stack_dump_signal(signum: int = signal.SIGUSR1) -> bool:
    """``kill -USR1 <pid>`` prints this process's Python stacks (all threads) to stderr and continues, once installed.
    Why: by default SIGUSR1 kills Python. False where the signal does not exist (Windows)."""
    if not hasattr(faulthandler, "register"):
        return False
    faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
