"""Distributed set-up that reads torchrun's environment and tears down cleanly.

Why this module exists: the same script must run as one plain ``python``
process in a notebook kernel, as ``torchrun --nproc_per_node 2`` on a laptop
(gloo on CPU) and as ``torchrun --nnodes 2 ...`` on GPU servers (nccl). All of
that is decided here, once, from the environment variables torchrun sets
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``).

Teardown follows the order that avoids gloo's occasional exit crash/hang
(about one run in ten without it): drop references to models and optimizers,
``gc.collect()``, ``barrier()``, then ``destroy_process_group()``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import faulthandler
import gc
import hashlib
import logging
import os
import random
import signal
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

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
    """Return (rank, local_rank, world_size, local_world_size) from torchrun's variables.

    Without torchrun these are absent and we are a single process.
    """
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
            raise EcomkitError(
                f"LOCAL_RANK={local_rank} but this node has only {n} GPU(s). Launch with "
                f"--nproc_per_node {n} (or fewer), or set CUDA_VISIBLE_DEVICES so that "
                "every process gets its own GPU (two ranks on one GPU make NCCL fail "
                "with 'Duplicate GPU detected')."
            )
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def seed_everything(seed: int, rank: int = 0, offset_by_rank: bool = False) -> None:
    """Seed python, numpy and torch.

    Model init must be identical on every rank (DDP also broadcasts it), so the
    default does *not* offset by rank; pass ``offset_by_rank=True`` for things
    such as dropout masks that should differ between ranks.
    """
    s = seed + (rank if offset_by_rank else 0)
    random.seed(s)
    np.random.seed(s % (2**32))
    torch.manual_seed(s)


def setup_distributed(timeout_s: float = 600.0, seed: int | None = 0) -> DistEnv:
    """Initialise the default process group if torchrun started us; return a :class:`DistEnv`.

    ``timeout_s`` is explicit because the default (10 min for nccl, 30 min for
    gloo) turns a stalled rank into a very long silent hang. On nccl we also
    make sure async error handling is on, so a timeout aborts the job instead
    of hanging.
    """
    rank, local_rank, world, local_world = read_torchrun_env()
    if world > 1:
        backend, device = pick_backend_and_device(local_rank)
        if backend == "nccl":
            torch.cuda.set_device(device)
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if not dist.is_initialized():
            dist.init_process_group(
                backend=backend,
                timeout=_dt.timedelta(seconds=timeout_s),
                device_id=device if backend == "nccl" else None,
                **restart_safe_rendezvous(rank, world, timeout_s),
            )
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

    torchrun's c10d rendezvous (``--standalone`` included) hands the workers its
    own TCPStore and, in torch 2.13, keeps it across ``--max-restarts`` restarts,
    while ``init_process_group`` writes the gloo addresses / NCCL unique id under
    fixed keys. A restarted rank can then read the *dead* attempt's address and
    fail with "Gloo connectFullMesh failed ... Connection refused" (pytorch
    issue 135712). Prefixing the keys with the restart count avoids that on one
    node, where one agent counts the restarts for every worker.

    On several nodes that count is per agent: a node that is replaced starts a
    fresh agent at count 0 while the survivors are at 1, so the prefixes would
    differ (135712 again). Worse, a shared store cannot take a replaced node at
    all in torch 2.13: the surviving rank-0 agent keeps the store address it
    published in the first round and does not publish it for the next one, so
    the new agent waits for ``MASTER_ADDR`` and the survivors for its
    ``role_info`` until the store's 60 s read timeout (docs/multinode.md). A
    multi-node job that may restart is therefore refused here, at start-up,
    unless it runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: then rank 0's
    worker hosts a fresh store every round and this function does nothing.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    check_multinode_restarts(world_size)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=False, timeout=_dt.timedelta(seconds=timeout_s))
    attempt = restart_attempt()
    return {"store": dist.PrefixStore(f"ecomkit/attempt_{attempt}", store), "rank": rank, "world_size": world_size}


def restart_attempt() -> int:
    """Which attempt of the launch this worker is: 0 first, then 1, 2, ... after torchrun restarted the workers
    (``--max-restarts``: a rank died). A run resumes from its own checkpoints only on a restart."""
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
    """Collect garbage, synchronise, then destroy the process group (gloo-safe order).

    Callers should drop their own references to models, optimizers and DDP
    wrappers before calling this (``del model, optim``), so that gloo's
    reducer threads are gone before the group is destroyed.
    """
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


@contextlib.contextmanager
def distributed_session(timeout_s: float = 600.0, seed: int | None = 0) -> Iterator[DistEnv]:
    """``with distributed_session() as env:`` — set up, run, always tear down.

    On an exception the barrier is skipped (the other ranks may be gone), and
    the process group is destroyed without waiting.
    """
    env = setup_distributed(timeout_s=timeout_s, seed=seed)
    ok = False
    try:
        yield env
        ok = True
    finally:
        if ok:
            teardown()
        elif dist.is_available() and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()


def _all_reduce_float(value: float, env: DistEnv, op: Any) -> float:
    """All-reduce one Python float with ``op`` (the value itself for a single process)."""
    if not env.distributed:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=env.device if env.backend == "nccl" else "cpu")
    dist.all_reduce(t, op=op)
    return float(t.item())


def collective_device(env: DistEnv) -> torch.device:
    """Where a collective's tensor must live: the GPU for NCCL, the CPU for gloo."""
    return env.device if env.backend == "nccl" else torch.device("cpu")


def all_reduce_sum_tensor(values: Sequence[torch.Tensor | float], env: DistEnv) -> torch.Tensor:
    """Element-wise sums over all ranks as a float64 tensor on :func:`collective_device`, never read here.

    Why a tensor: the training step needs some sums (its label tokens, for the loss scale) as numbers the
    device computes with, not numbers the host waits for; reading them later, at a log interval, is one
    synchronisation for many steps. ``values`` may mix device tensors (0-d) and host floats.
    """
    device = collective_device(env)
    host = to_device(torch.tensor([0.0 if isinstance(v, torch.Tensor) else float(v) for v in values],
                                  dtype=torch.float64), device)     # one copy for every host number
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
    """The largest of every rank's float (``all_reduce(MAX)``; a collective every rank must call).

    Throughput uses it: with several ranks the job runs at the slowest rank's pace.
    """
    return _all_reduce_float(value, env, dist.ReduceOp.MAX)


def all_gather_floats(value: float, env: DistEnv) -> list[float]:
    """Gather one float from each rank (used for straggler detection and per-rank memory)."""
    if not env.distributed:
        return [float(value)]
    dev = env.device if env.backend == "nccl" else torch.device("cpu")
    t = torch.tensor([float(value)], dtype=torch.float64, device=dev)
    out = [torch.zeros_like(t) for _ in range(env.world_size)]
    dist.all_gather(out, t)
    return [float(x.item()) for x in out]


def gather_objects(obj: Any, env: DistEnv) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` without a process group.

    The one "gather a Python object from every rank" in ecomkit: every rank must
    call it (it is a collective), so callers catch their own local errors
    *before* calling it and gather the error instead, never skip the call.
    """
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


def barrier_if_distributed() -> None:
    """``dist.barrier()`` when a process group exists; nothing for a single process."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1, device: torch.device | None = None,
          average: Callable[[list[float]], float] = statistics.median, slowest: bool = False) -> float:
    """Median (or ``average``) seconds of ``fn`` over ``repeats`` runs, each started together on all ranks.

    The one barrier-synchronised timer: a barrier before every run means no rank
    times its wait for a late peer, and CUDA work is synchronised before the
    clock is read (``device``). ``repeats=1, warmup=0`` times a single call.
    ``average`` and ``slowest`` as in :func:`timed_phases`.
    """
    return timed_phases([fn], repeats, warmup, device, average, slowest)[0]


def timed_phases(fns: Sequence[Callable[[], Any]], repeats: int = 5, warmup: int = 1,
                 device: torch.device | None = None,
                 average: Callable[[list[float]], float] = statistics.median,
                 slowest: bool = False) -> list[float]:
    """Median (or ``average``) seconds of each of ``fns``, run in order ``repeats`` times, all ranks together.

    For work whose phases must alternate, such as a DeepSpeed engine's backward
    and its step: each phase is timed on its own, and every run does them all.
    ``average=statistics.fmean`` keeps the occasional slow run in, as a
    training step's mean (total time / steps) does. ``slowest``: each run
    counts at its slowest rank's time (every rank must pass it), as a
    training step synchronised by its collectives runs at that rank's pace.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, phase_times in zip(fns, times):
            barrier_if_distributed()
            _synchronize(device)
            t0 = time.perf_counter()
            fn()
            _synchronize(device)
            phase_times.append(time.perf_counter() - t0)
    if slowest and dist.is_available() and dist.is_initialized():
        on = device if device is not None and device.type == "cuda" else torch.device("cpu")
        flat = torch.tensor(times, dtype=torch.float64, device=on)
        dist.all_reduce(flat, op=dist.ReduceOp.MAX)
        times = flat.tolist()
    return [average(t) for t in times]


_SIGNAL_REGISTERED = False


def install_stack_dump_signal(signum: int = signal.SIGUSR1) -> bool:
    """``kill -USR1 <pid>`` prints this process's Python stacks (all threads) to stderr and continues.

    Without it, SIGUSR1 *terminates* a Python process, so a reader following a
    debugging guide would kill the rank they wanted to inspect. Returns False
    where the signal does not exist (Windows). :func:`setup_distributed`
    installs it on every rank (chapter 07).
    """
    global _SIGNAL_REGISTERED
    if _SIGNAL_REGISTERED:
        return True
    if not hasattr(faulthandler, "register"):
        return False
    faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
    _SIGNAL_REGISTERED = True
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it).

    For rendezvous of a process group started without torchrun (DeepSpeed on
    one process) and for the reproductions of chapter 07.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
