"""Chapter 07 (troubleshooting): the guides' health check, asynchronous checkpoints and debugging switch."""

from __future__ import annotations

from ecomkit.faults import health
from ecomlab.claims.ch01 import GUIDE_CLUSTER, lint_problems
from ecomlab.claims.claim import Claim
from ecomlab.claims.evidence import Evidence
from ecomlab.claims.verdicts import Finding, wrong_recipe


def _reset(ev: Evidence) -> Finding:
    problems = [f"{health.GPU_RESET_HARM} (ecomkit.faults.health)"]
    return wrong_recipe(problems, evidence="nvidia-smi -r inside the training loop, on the job's own GPUs",
                        source="ecomkit.faults.health (the monitor that only warns)", why_ok="")


def async_save_sees_model(command: str = "import torch; torch.save({...}, 'step.pt')") -> bool:
    """Can the guide's checkpoint subprocess reach the weights? Only what its ``python -c`` text names."""
    return "state_dict" in command or "model" in command


def _async_checkpoint(ev: Evidence) -> Finding:
    problems = [] if async_save_sees_model() else [
        "the child process is a new interpreter: the `{...}` in its command holds no tensors, so it saves nothing of "
        "the model; ecomkit saves asynchronously with torch.distributed.checkpoint.async_save "
        "(ecomkit.faults.checkpoint)"]
    return wrong_recipe(problems, evidence="subprocess.Popen(['python', '-c', \"torch.save({...}, path)\"])",
                        source="ecomlab.claims.ch07.async_save_sees_model", why_ok="")


def _launch_blocking(ev: Evidence) -> Finding:
    problems = lint_problems("CUDA_LAUNCH_BLOCKING", {"CUDA_LAUNCH_BLOCKING": "1"}, **GUIDE_CLUSTER)
    return wrong_recipe(problems, evidence=f"{len(problems)} lint finding(s) for CUDA_LAUNCH_BLOCKING=1",
                        source="ecomkit.envcheck.lint.lint_env", why_ok="")


CLAIMS = [
    Claim("S0-29", "6", 7, "检查各卡GPU温度 … if max(temps) > 85: … os.system(\"nvidia-smi -r\")",
          "Health check: reset a hot GPU with nvidia-smi -r from the training loop.", "EcomGPT-7B, 8× A100", _reset),
    Claim("S0-30", "6", 7, "频繁保存checkpoint会阻塞训练。我们采用异步保存：subprocess.Popen([\"python\", \"-c\", …])",
          "Save checkpoints asynchronously by launching a subprocess.", "EcomGPT-7B, 8× A100", _async_checkpoint),
    Claim("S1-19", "6.2", 7, "在训练脚本开头加：os.environ[\"CUDA_LAUNCH_BLOCKING\"] = \"1\"",
          "Set CUDA_LAUNCH_BLOCKING=1 at the top of the training script.", "SeqGPT-560M, multi-GPU", _launch_blocking),
]
