"""The environment DeepSpeed reads when it is imported, set by the ZeRO package itself.

DeepSpeed picks its accelerator once, at import time: without a GPU and
without ``DS_ACCELERATOR=cpu`` it probes for CUDA and fails. Every place in
ecomkit that imports deepspeed (the ZeRO strategy, config checks, checkpoint
consolidation, DeepSpeed's estimators, HF Trainer with a DeepSpeed dict) calls
:func:`ensure_deepspeed_env` on the line before, so no script, notebook or
test has to know about it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def ensure_deepspeed_env() -> None:
    """Set what DeepSpeed reads at import time; call right before importing deepspeed (idempotent).

    - ``DS_ACCELERATOR=cpu`` without a GPU: otherwise DeepSpeed probes for CUDA
      and fails; with it, its communication falls back to gloo when oneCCL is absent.
    - ``TORCH_EXTENSIONS_DIR``: where the JIT-built CPU Adam is cached (the
      first build takes ~50 s; every later run reuses it).

    Values already in the environment win (``setdefault``), so a user's own
    ``DS_ACCELERATOR`` or cache folder is respected.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # per user, not per checkout: every clone (and CI on this machine) reuses one build
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "ecomkit" / "torch_extensions"))
