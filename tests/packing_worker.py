"""2-process worker of tests/test_packing_dist.py: the same rows packed and unpacked under each strategy.

``python -m torch.distributed.run --nproc_per_node 2 tests/packing_worker.py OUT.json ddp fsdp zero3 lora``

For every strategy named, a fresh model (same seed) is built twice, through the strategy's own
``build_model`` and ``setup``: once for each rank's rows packed into sequences, once for the same rows
padded one per row. Each computes the strategy's ``forward_loss_sum`` with the loop's global
normalisation and ``backward``; the loss is summed over ranks and the full gradient of every trainable
parameter is gathered (DDP's averaged grads, FSDP2's DTensor grads made whole, ZeRO-3's partitioned
grads through DeepSpeed's ``safe_get_full_grad``). Rank 0 writes the largest relative differences.
"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, distributed_session
from ecomkit.fast.attention import install_attention
from ecomkit.models.bloom import ModelSource
from ecomkit.models.lora import apply_peft
from ecomkit.models.loss import TokenLoss, count_label_tokens
from ecomkit.parallel import build_strategy
from ecomlab.measure.packing import packed_batch, padded_batch, random_rows

VOCAB, PAD = 400, 3
VARIANTS = {
    "ddp": {"strategy": "ddp"},
    "fsdp": {"strategy": "fsdp"},
    "zero3": {"strategy": "zero"},
    "lora": {"strategy": "ddp", "peft": "lora"},
}


def config(name: str, out: str) -> TrainConfig:
    cfg = TrainConfig(model="tiny", attn="sdpa", output_dir=out, seq_len=96, report_to="none", progress=False,
                      precision="fp32")   # packed vs unpacked compared to 1e-5: fp32
    for key, value in VARIANTS[name].items():
        setattr(cfg, key, value)
    cfg.zero.stage, cfg.zero.param_persistence_threshold = 3, 0
    return cfg


def full_gradients(strategy, name: str) -> dict[str, torch.Tensor]:
    """Every trainable parameter's whole gradient, on every rank (collectives for FSDP2 and ZeRO-3)."""
    out = {}
    for pname, p in strategy.raw_model.named_parameters():
        if not p.requires_grad:
            continue
        if name == "zero3":
            from deepspeed.utils import safe_get_full_grad  # lazy: only the ZeRO variant needs DeepSpeed
            grad = safe_get_full_grad(p)
        elif hasattr(p.grad, "full_tensor"):
            grad = p.grad.full_tensor()
        else:
            grad = p.grad
        out[pname] = grad.detach().float().clone()
    return out


def loss_and_gradients(name: str, batch: dict, env: DistEnv, out: str) -> tuple[float, dict]:
    cfg = config(name, out)
    strategy = build_strategy(cfg, env)
    model = strategy.build_model(ModelSource("tiny", vocab_size=VOCAB, seed=0))
    model = apply_peft(model, cfg)
    install_attention(model, cfg.attn)
    if strategy.supports_chunked_loss:
        strategy.token_loss = TokenLoss("chunked", cfg.loss_chunk_tokens)
    strategy.setup(model, total_steps=1)
    tokens = torch.tensor([float(count_label_tokens(batch["labels"]))], dtype=torch.float64)
    dist.all_reduce(tokens)
    with strategy.micro_step_context(is_last=True):
        loss = strategy.forward_loss_sum(batch)
        strategy.backward(loss * (env.world_size / float(tokens)))
    total = torch.tensor([float(loss.detach())], dtype=torch.float64)
    dist.all_reduce(total)
    grads = full_gradients(strategy, name)
    strategy.close()
    del strategy, model
    gc.collect()
    return float(total), grads


def main(argv: list[str]) -> None:
    path, names = argv[0], argv[1:]
    result = {}
    with distributed_session(seed=0) as env:
        mine = random_rows(16, VOCAB, seed=5, prompted=True)[env.rank::env.world_size]
        for name in names:
            loss_p, grads_p = loss_and_gradients(name, packed_batch(mine, 96, PAD), env, f"{path}.{name}.p")
            loss_u, grads_u = loss_and_gradients(name, padded_batch(mine, PAD), env, f"{path}.{name}.u")
            worst = max(float((grads_p[k] - g).norm() / g.norm().clamp(min=1e-30)) for k, g in grads_u.items())
            result[name] = {"loss_packed": loss_p, "loss_unpacked": loss_u,
                            "loss_rel": abs(loss_p - loss_u) / abs(loss_u), "grad_rel": worst,
                            "n_grads": len(grads_u)}
        if env.is_main:
            with open(path, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
