"""2-process worker of tests/test_zero_loss.py: ZeRO-1/2/3 losses and gradients through each LM-head loss.

``python -m torch.distributed.run --nproc_per_node 2 tests/zero_loss_worker.py OUT.json``

For every ZeRO stage and loss (``full`` logits, ``chunked`` with several chunks, and ``liger`` through a CPU
stand-in that, like liger-kernel's fused linear cross-entropy, computes the head's gradients in its forward), a
fresh model (same seed) is built through the strategy's own ``build_model`` and ``setup`` and trained three
optimizer steps on the same rows with the loop's loss normalisation. Rank 0 writes each run's losses and the
largest relative difference of a parameter's whole first-step gradient from the full logits' (gathered by
DeepSpeed; compared directly, since Adam's update hides a wrong gradient scale).
"""

from __future__ import annotations

import gc
import json
import sys
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, distributed_session
from ecomkit.models.bloom import ModelSource
from ecomkit.models.loss import TokenLoss, count_label_tokens
from ecomkit.parallel import build_strategy
from ecomlab.measure.packing import padded_batch, random_rows

VOCAB, PAD, STEPS = 400, 3, 3
STAGES, KERNELS = (1, 2, 3), ("full", "chunked", "liger")


class _EagerGradLinearCrossEntropy(torch.autograd.Function):
    """Σ cross-entropy of ``x @ w.T (+ b)``, its gradients computed in forward and scaled in backward (liger's way)."""

    @staticmethod
    def forward(ctx, w, x, y, b):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (w, x)] + ([b.detach().requires_grad_()] if b is not None
                                                                      else [])
            loss = F.cross_entropy(F.linear(leaves[1], leaves[0], leaves[2] if b is not None else None).float(), y,
                                   ignore_index=-100, reduction="sum")
            grads = torch.autograd.grad(loss, leaves)
        ctx.save_for_backward(*grads)
        ctx.has_bias = b is not None
        return loss.detach()

    @staticmethod
    def backward(ctx, grad):
        gw, gx, *gb = ctx.saved_tensors
        return gw * grad, gx * grad, None, (gb[0] * grad if ctx.has_bias else None)


class CpuLiger(torch.nn.Module):
    """liger-kernel's ``LigerFusedLinearCrossEntropyLoss`` call, on a CPU (the real one is Triton, CUDA only)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", **_):
        super().__init__()
        assert ignore_index == -100 and reduction == "sum"

    def forward(self, lin_weight, _input, target, bias=None):
        assert lin_weight.shape[0] == VOCAB, "the weight reached the kernel partitioned"
        return _EagerGradLinearCrossEntropy.apply(lin_weight, _input, target, bias)


def install_cpu_liger() -> None:
    flce = types.ModuleType("liger_kernel.transformers.fused_linear_cross_entropy")
    flce.LigerFusedLinearCrossEntropyLoss = CpuLiger
    for name in ("liger_kernel", "liger_kernel.transformers"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules[flce.__name__] = flce


def train(stage: int, kernel: str, batches: list[dict], env: DistEnv, out: str
          ) -> tuple[list[float], dict[str, torch.Tensor]]:
    from deepspeed.utils import safe_get_full_grad  # lazy: DeepSpeed's environment is set by the strategy first

    cfg = TrainConfig(model="tiny", strategy="zero", attn="eager", output_dir=out, seq_len=96, report_to="none",
                      progress=False, precision="fp32", max_steps=STEPS, warmup_steps=0, lr=1e-2)
    cfg.zero.stage, cfg.zero.param_persistence_threshold = stage, 0
    strategy = build_strategy(cfg, env)
    model = strategy.build_model(ModelSource("tiny", vocab_size=VOCAB, seed=0))
    strategy.token_loss = TokenLoss(kernel, 16)   # chunked: several chunks of 16 labeled positions
    strategy.setup(model, total_steps=STEPS)
    losses, grads = [], {}
    for batch in batches:
        tokens = torch.tensor([float(count_label_tokens(batch["labels"]))], dtype=torch.float64)
        dist.all_reduce(tokens)
        with strategy.micro_step_context(is_last=True):
            loss = strategy.forward_loss_sum(batch)
            strategy.backward(loss * (env.world_size / float(tokens)))
        grads = grads or {n: safe_get_full_grad(p).detach().double().clone() for n, p in model.named_parameters()}
        strategy.clip_and_step(0.0)
        total = torch.tensor([float(loss.detach())], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(float(total))
    strategy.close()
    del strategy, model
    gc.collect()
    return losses, grads


def main(argv: list[str]) -> None:
    install_cpu_liger()
    result = {}
    with distributed_session(seed=0) as env:
        rows = random_rows(8, VOCAB, seed=3, prompted=True)   # each rank its rows, the same every step: loss falls
        mine = [padded_batch(rows[env.rank::env.world_size], PAD)] * STEPS
        for stage in STAGES:
            reference = None
            for kernel in KERNELS:   # the full logits first: the reference of the others
                losses, grads = train(stage, kernel, mine, env, f"{argv[0]}.{stage}.{kernel}")
                reference = reference or grads
                worst = max(float((grads[n] - g).norm() / g.norm().clamp(min=1e-30)) for n, g in reference.items())
                result[f"{stage}/{kernel}"] = {"losses": losses, "grad_rel": worst, "n_grads": len(grads)}
        if env.is_main:
            with open(argv[0], "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
