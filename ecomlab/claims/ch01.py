"""Chapter 01 (environment): the guides' NCCL variables and version pin.

The NCCL rows run ecomkit's environment lint (:func:`ecomkit.envcheck.lint.lint_env`)
on the guide's exported variables and the guide's own cluster (section 5:
8-GPU A100 nodes with NVLink and InfiniBand).
"""

from __future__ import annotations

import re
from importlib.metadata import requires

from ecomkit.envcheck.lint import lint_env
from ecomlab.artifacts import REPO
from ecomlab.claims.claim import Claim
from ecomlab.claims.evidence import Evidence
from ecomlab.claims.verdicts import Finding, wrong_recipe

# EcomGPT guide, section 3.1: the exported variables; section 5: the cluster they were used on.
GUIDE_ENV = {"NCCL_SOCKET_TIMEOUT": "1800", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0",
             "NCCL_ASYNC_ERROR_HANDLING": "1"}
GUIDE_CLUSTER = {"n_cpus": 128, "n_gpus": 8, "local_world_size": 8, "has_infiniband": True, "has_nvlink": True}
LINT = "ecomkit.envcheck.lint.lint_env (guide's variables, 8× A100 NVLink nodes with InfiniBand)"


def lint_problems(variable: str, env: dict[str, str] = GUIDE_ENV, **facts: object) -> list[str]:
    """The first two sentences of each lint finding about ``variable`` for ``env`` on the guide's cluster."""
    found = lint_env(env, **{**GUIDE_CLUSTER, **facts})
    return [f"{f.severity}: {'. '.join(f.message.split('. ')[:2]).rstrip('.')}"
            for f in found if f.variable == variable]


def _ib(ev: Evidence) -> Finding:
    problems = lint_problems("NCCL_IB_DISABLE")
    return wrong_recipe(problems, evidence=f"{len(problems)} lint finding(s) for NCCL_IB_DISABLE=1", source=LINT,
                        why_ok="the lint finds nothing wrong with it")


def _socket_timeout(ev: Evidence) -> Finding:
    problems = lint_problems("NCCL_SOCKET_TIMEOUT")
    return wrong_recipe(problems, evidence=f"{len(problems)} lint finding(s) for NCCL_SOCKET_TIMEOUT=1800",
                        source=LINT, why_ok="the lint finds nothing wrong with it")


def _p2p(ev: Evidence) -> Finding:
    problems = lint_problems("NCCL_P2P_DISABLE")
    return wrong_recipe(problems, evidence=f"{len(problems)} lint finding(s) for NCCL_P2P_DISABLE=1", source=LINT,
                        why_ok="the lint finds nothing wrong with it")


def transformers_requirement(pyproject: str | None = None) -> str:
    """The transformers requirement ecomkit installs with (pyproject.toml; an installed package's metadata)."""
    if pyproject is None:
        source = REPO / "pyproject.toml"
        pyproject = source.read_text() if source.is_file() else "\n".join(f'"{r}"' for r in requires("ecomkit") or [])
    return re.search(r'"transformers([^"]*)"', pyproject).group(1)


def _pin(ev: Evidence) -> Finding:
    spec = transformers_requirement()
    newer = not spec.startswith("==4.35")
    problems = [f"ecomkit runs on transformers{spec}, where tests/test_train_ddp.py holds 2-process DDP to 1 process "
                "within 1e-4 relative at every step, so newer versions do not break gradient sync"] if newer else []
    return wrong_recipe(problems, evidence=f"ecomkit requires transformers{spec}", source="pyproject.toml, "
                        "tests/test_train_ddp.py", why_ok="ecomkit itself pins 4.35")


CLAIMS = [
    Claim("S0-10", "3.1", 1, "NCCL_IB_DISABLE=1——禁用InfiniBand而启用共享内存（SHM）通信。实测表明……SHM通信延迟比IB低40%",
          "Disable InfiniBand and use shared memory: SHM latency is 40 % below IB.",
          "8 nodes × 8 A100-40G, NVLink, 400 Gb/s network (section 5)", _ib),
    Claim("S0-11", "3.1", 1, "NCCL_SOCKET_TIMEOUT延长至30分钟，则防止了长尾batch……触发的误判超时",
          "A 30-minute NCCL_SOCKET_TIMEOUT prevents false timeouts on long-tail batches.",
          "same cluster", _socket_timeout),
    Claim("S0-33", "3.1", 1, "export NCCL_P2P_DISABLE=1",
          "Disable NCCL peer-to-peer (listed among the tuning variables).",
          "same cluster", _p2p),
    Claim("S1-17", "2.2", 1, "transformers版本锁定在4.35.0很重要。新版本对BLOOMZ系模型的并行支持有小bug，会导致梯度同步异常",
          "Pin transformers 4.35.0: newer versions have a BLOOMZ parallelism bug that breaks gradient sync.",
          "4× RTX 4090 / 8× A100 / 2× RTX 3090", _pin),
]
