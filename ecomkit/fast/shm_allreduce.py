"""DDP's gradient all-reduce through shared memory, for ranks on one CPU host (``--ddp-allreduce shm``).

Gloo sends every byte through loopback TCP on the training cores; DeepSpeed's CPU shared-memory all-reduce, called
from a DDP comm hook, skips the sockets and sums bit-identically. Needs every rank on this host, on the CPU, and no
``--max-restarts`` (the op has no timeout; a restarted worker could map a dead one's segment).
"""

# No ``from __future__ import annotations``: DDP checks the hook's ``bucket`` annotation, and a string fails.

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ecomkit.dist import DistEnv, log, max_restarts
from ecomkit.errors import ConfigError
from ecomkit.parallel.zero.env import build_error_summary, ensure_deepspeed_env

# What the op names its segments (deepspeed/ops/csrc/cpu/comm/shm.cpp: SHM_BUFFER_NAME, getuid, address, port, rank).
SEGMENT_PREFIX = "deepspeed_allreduce_buffer"
# The op's reduce kernels: fp32 needs AVX2 (level 1), bf16/fp16 AVX-512BW (level 2); below that they fault.
KERNEL_LEVEL = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 2}


def check_shm_allreduce(env: DistEnv) -> None:
    """Refuse ``--ddp-allreduce shm`` where this job cannot run it correctly, naming what to change."""
    if env.device.type != "cpu":
        raise ConfigError(f"--ddp-allreduce shm is for CPU ranks; this run is on {env.device.type}, where the "
                          "backend's own all-reduce (nccl) is the fast path. Drop --ddp-allreduce shm.")
    if env.local_world_size != env.world_size:
        raise ConfigError(f"--ddp-allreduce shm needs every rank on one host ({env.local_world_size} of "
                          f"{env.world_size} processes are on this one). Drop --ddp-allreduce shm.")
    if max_restarts() > 0:
        raise ConfigError(f"--ddp-allreduce shm with torchrun --max-restarts {max_restarts()}: the shared-memory "
                          "all-reduce has no timeout and a restarted worker could map a segment the killed one "
                          "left. Drop --ddp-allreduce shm for restartable jobs.")


def load_shm_op(env: DistEnv) -> Any:
    """Build (once per environment) or load DeepSpeed's shared-memory all-reduce and join this job to it.
    Rank 0 builds first while the others wait, so they load its build instead of compiling the same sources."""
    os.environ["LOCAL_SIZE"] = str(env.local_world_size)  # the op runs only when every rank is local
    try:
        if env.rank != 0:
            dist.barrier()
        try:
            module = _build_op()
        finally:
            if env.rank == 0:
                dist.barrier()
    except Exception as exc:  # no DeepSpeed, no compiler, a failed build: all mean the op is not there
        raise ConfigError(f"--ddp-allreduce shm needs DeepSpeed's shared-memory op, which did not build "
                          f"({build_error_summary(exc)}). pip install deepspeed, or drop --ddp-allreduce shm."
                          ) from exc
    module.initialize(env.world_size, env.rank)
    return module


def prebuild_shm_op() -> str:
    """Build the op now (``make install``) so the first shm run skips the JIT build; returns what happened."""
    try:
        _build_op()
    except Exception as exc:  # no DeepSpeed, no compiler, a failed build
        return f"DeepSpeed shared-memory all-reduce: not built ({build_error_summary(exc)})"
    return f"DeepSpeed shared-memory all-reduce: built (or already there) in {os.environ['TORCH_EXTENSIONS_DIR']}"


def _build_op() -> Any:
    ensure_deepspeed_env()
    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder  # lazy: heavy optional dependency

    return ShareMemCommBuilder().load(verbose=False)


def register_shm_allreduce(model: DistributedDataParallel, env: DistEnv) -> str:
    """Make ``model``'s gradient all-reduce go through shared memory; returns this rank's segment name.
    The caller releases the segment; if registering fails here, it is released here."""
    check_shm_allreduce(env)
    module = load_shm_op(env)
    name = segment_name(env.rank)
    try:
        level = int(module.vector_kernel_level())
        if level < 1:
            raise ConfigError("--ddp-allreduce shm: this CPU has no AVX2, which the op's reduce kernels need. "
                              "Drop --ddp-allreduce shm.")
        model.register_comm_hook(ShmHookState(env.world_size, level), shm_allreduce_hook)
    except Exception:
        release_shm_segment(name)
        raise
    log.info("ddp: gradients all-reduced through shared memory (--ddp-allreduce shm, kernel level %d)", level)
    return name


class ShmHookState:

    def __init__(self, world_size: int, level: int):
        self.world_size, self.level = world_size, level


def shm_allreduce_hook(state: ShmHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average the bucket in place through the shared-memory op.
    A dtype the CPU's kernels cannot reduce (bf16 without AVX-512BW) goes through the process group instead."""
    buf = bucket.buffer()
    buf.div_(state.world_size)
    if KERNEL_LEVEL.get(buf.dtype, 99) <= state.level:
        torch.ops.deepspeed.inference_all_reduce_(buf)
    else:
        dist.all_reduce(buf)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def segment_name(rank: int) -> str:
    """The ``/dev/shm`` name of ``rank``'s segment in this job (the op's own naming)."""
    return (f"{SEGMENT_PREFIX}_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
            f"{os.environ.get('MASTER_PORT', '')}_{rank}")


def release_shm_segment(name: str | None) -> None:
    """Remove this rank's segment name (about 66 MiB of ``/dev/shm`` each); mappings still open stay valid."""
    if name:
        Path("/dev/shm", name).unlink(missing_ok=True)


class ShmAllReduce:
    """``--ddp-allreduce shm`` for one DDP model: registered once it is wrapped, its segment released at the end."""

    def __init__(self) -> None:
        self.segment: str | None = None

    def register(self, model: DistributedDataParallel, env: DistEnv) -> None:
        self.segment = register_shm_allreduce(model, env)

    def release(self) -> None:
        release_shm_segment(self.segment)
        self.segment = None
