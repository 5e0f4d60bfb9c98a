"""The environment DeepSpeed reads when it is imported, set by the ZeRO package itself.

Why: DeepSpeed picks its accelerator at import and fails without a GPU unless ``DS_ACCELERATOR=cpu``; every import of
deepspeed in ecomkit calls :func:`ensure_deepspeed_env` on the line before, so no caller has to know.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

from ecomkit.dist import DistEnv, free_port
from ecomkit.hardware import extensions_dir


def ensure_deepspeed_env() -> None:
    """Set what DeepSpeed reads at import time; call right before importing deepspeed (idempotent).

    ``DS_ACCELERATOR=cpu`` without a GPU, ``TORCH_EXTENSIONS_DIR`` per environment (the JIT-built CPU Adam is reused),
    and on CPU the shared-memory all-reduce op marked unavailable. Values already set win (``setdefault``).
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        skip_cpu_inference_comm_op()


def skip_cpu_inference_comm_op() -> None:
    """Keep DeepSpeed from JIT-building its CPU shared-memory all-reduce (``deepspeed_shm_comm``) on start-up.

    Why: only ``inference_all_reduce`` uses it (training collectives are gloo), yet it costs a build; it then falls back
    to ``torch.distributed.all_reduce``.
    """
    import deepspeed.ops  # lazy: heavy optional dependency, imported only where DeepSpeed is about to be used
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def prebuild_cpu_adam() -> str:
    """Build DeepSpeed's CPU Adam op into this environment's extensions folder now; returns what happened.

    Why: ``make install`` pays the build once instead of the first offload run's start-up; a failure is not fatal
    (offload then falls back to torch AdamW with a warning).
    """
    ensure_deepspeed_env()
    folder = os.environ["TORCH_EXTENSIONS_DIR"]
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder  # lazy: heavy optional dependency (and the build)

        CPUAdamBuilder().load(verbose=False)
    except Exception as exc:  # a compiler missing, a failed build, an unsupported CPU: all mean "cannot build"
        return f"DeepSpeed CPU Adam: not built ({build_error_summary(exc)})"
    return f"DeepSpeed CPU Adam: built (or already there) in {folder}"


def build_error_summary(exc: BaseException) -> str:
    """``"<type>: <first line>"`` of why a JIT op build failed (its cause when DeepSpeed wraps one)."""
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"


def ensure_process_group(env: DistEnv) -> None:
    """DeepSpeed needs a process group even for one process; reuse ecomkit's when it exists."""
    ensure_deepspeed_env()
    import deepspeed  # lazy: heavy optional dependency

    if not dist.is_initialized():  # plain `python script.py`: a world of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed(dist_backend="nccl" if env.device.type == "cuda" else "gloo",
                               auto_mpi_discovery=False, verbose=False)


def quiet_deprecations() -> None:
    """DeepSpeed calls torch collectives that torch 2.13 renamed; one FutureWarning per call floods the log."""
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated")
