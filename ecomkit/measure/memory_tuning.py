"""Chapter 06 experiments: what activation checkpointing, offloading, precision, sequence length, batching and the
EcomGPT guide's "memory pool" really do to memory and time, each measured next to the planner's prediction.

Every function builds a small BLOOM (long sequences are what make activations
matter), runs real forward/backward passes on this machine and returns plain
rows (lists of dicts) that the notebook plots and the script writes as JSON.
Nothing here is a stored result.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Sequence

import torch
from torch import nn

from ecomkit.measure.activations import (causal_lm_loss, disable_checkpointing, enable_checkpointing, measure_step_memory,
                                 time_step)
from ecomkit.planner.memory import activation_bytes, activation_dtypes, checkpointing_factor, model_shape


def long_context_config(hidden: int = 128, n_layer: int = 2, n_head: int = 4, vocab_size: int = 1024):
    """A BLOOM small enough for seconds-long steps on a CPU at sequence lengths up to ~1k."""
    from ecomkit.models.bloom import preset_config

    return preset_config("tiny", vocab_size=vocab_size, hidden_size=hidden, n_layer=n_layer, n_head=n_head)


def build_probe_model(config, dtype: torch.dtype = torch.float32, device: str = "cpu", attn: str = "eager"):
    from ecomkit.models.bloom import build_model

    model = build_model(config, device=device, dtype=dtype).train()
    if attn != "eager":
        from ecomkit.models.attention import install_attention

        install_attention(model, attn)
    return model


def random_batch(vocab: int, batch: int, seq: int, device: str = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, seq), generator=g).to(device)
    return ids, torch.ones_like(ids)


MODES = {  # name -> (planner strategy, precision, module dtype, autocast dtype)
    "fp32": ("ddp", "fp32", torch.float32, None),
    "bf16 autocast (torch DDP)": ("ddp", "bf16", torch.float32, torch.bfloat16),
    "bf16 weights (DeepSpeed)": ("zero2", "bf16", torch.bfloat16, None),
}


def predicted_saved_bytes(config, batch: int, seq: int, mode: str = "fp32", attn: str = "eager",
                          checkpointing: bool = False, device: str = "cpu") -> int:
    """The planner's saved-for-backward bytes for one micro-batch, plus autocast's weight copies (also saved)."""
    strategy, precision, _, _ = MODES[mode]
    shape = model_shape(config)
    acts = activation_bytes(shape, batch, seq, strategy=strategy, precision=precision, attn=attn,
                            checkpointing=checkpointing, device=device)["total"]
    dt = activation_dtypes(strategy, precision)
    return acts + (dt.compute * shape.linear_weight_numel if dt.weight_copies else 0)


# ---------------------------------------------------------------------- sweeps
def activation_sweep(config, seq_lens: Sequence[int], batches: Sequence[int] = (1,), modes: Sequence[str] = ("fp32",),
                     attns: Sequence[str] = ("eager",), track_live: bool = True) -> list[dict[str, Any]]:
    """Measured vs predicted saved-activation bytes (and the live peak) over sequence lengths, batches, modes."""
    rows = []
    for mode in modes:
        _, _, dtype, autocast = MODES[mode]
        for attn in attns:
            model = build_probe_model(config, dtype, attn=attn)
            for batch in batches:
                for seq in seq_lens:
                    ids, mask = random_batch(config.vocab_size, batch, seq)
                    m = measure_step_memory(model, ids, mask, autocast=autocast, track_live=track_live)
                    pred = predicted_saved_bytes(config, batch, seq, mode, attn)
                    rows.append({"mode": mode, "attn": attn, "batch": batch, "seq_len": seq,
                                 "measured_saved": m.saved_bytes, "predicted_saved": pred,
                                 "ratio": pred / m.saved_bytes, "live_after_forward": m.live_after_forward,
                                 "peak": m.peak, "step_s": m.seconds})
            del model
            gc.collect()
    return rows


def checkpointing_experiment(config, batch: int, seq_lens: Sequence[int], repeats: int = 3) -> list[dict[str, Any]]:
    """Saved bytes, live peak and step time without / with activation checkpointing, next to the predicted factor."""
    rows = []
    model = build_probe_model(config)
    for seq in seq_lens:
        ids, mask = random_batch(config.vocab_size, batch, seq)
        row: dict[str, Any] = {"seq_len": seq, "batch": batch}
        for label, on in (("off", False), ("on", True)):
            if on:
                enable_checkpointing(model)
            m = measure_step_memory(model, ids, mask)
            row[f"saved_{label}"], row[f"peak_{label}"] = m.saved_bytes, m.peak
            row[f"live_{label}"] = m.live_after_forward
            row[f"step_s_{label}"] = time_step(model, ids, mask, repeats=repeats)
            if on:
                disable_checkpointing(model)
        row["measured_factor"] = row["saved_off"] / row["saved_on"]
        row["predicted_factor"] = checkpointing_factor(model_shape(config), batch, seq, device="cpu")
        row["time_cost"] = row["step_s_on"] / row["step_s_off"]
        rows.append(row)
    return rows


def save_on_cpu_experiment(config, batch: int, seq: int, device: str | None = None) -> dict[str, Any]:
    """``torch.autograd.graph.save_on_cpu``: saved activations moved to host memory until backward.

    This is the working form of the EcomGPT guide's "activation offloader"
    (which moves a block's *output* to the CPU and returns ``None`` to the
    next block, so the forward cannot continue). On a GPU it lowers
    ``max_memory_allocated`` by the saved activations, at the cost of two
    copies over PCIe per step. On a CPU it changes nothing: the tensors are
    already in host memory (CPU notes, trap 12), so the CPU row only shows
    that the saved bytes and the peak stay the same.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_probe_model(config, device=device)
    ids, mask = random_batch(config.vocab_size, batch, seq, device)
    out: dict[str, Any] = {"device": device, "batch": batch, "seq_len": seq}
    for label, wrap in (("plain", None),
                        ("save_on_cpu", lambda: torch.autograd.graph.save_on_cpu(pin_memory=device == "cuda"))):
        m = measure_step_memory(model, ids, mask, wrap=wrap)
        out[f"peak_{label}"], out[f"live_{label}"] = m.peak, m.live_after_forward
        out[f"step_s_{label}"] = time_step(model, ids, mask, repeats=2, wrap=wrap)
    out["peak_ratio"] = out["peak_save_on_cpu"] / out["peak_plain"]
    out["time_ratio"] = out["step_s_save_on_cpu"] / out["step_s_plain"]
    out["instrument"] = "cuda max_memory_allocated" if device == "cuda" else "cpu live-tensor tracker"
    return out


def gpu_peak_check(config, batch: int, seq_lens: Sequence[int]) -> list[dict[str, Any]]:
    """On a GPU: ``max_memory_allocated`` of one step vs the planner's activations + temporaries (eager, fp32)."""
    from ecomkit.planner.memory import PlanInput, plan_memory

    rows = []
    model = build_probe_model(config, device="cuda")
    for seq in seq_lens:
        ids, mask = random_batch(config.vocab_size, batch, seq, "cuda")
        m = measure_step_memory(model, ids, mask)
        plan = plan_memory(PlanInput(model=config, precision="fp32", micro_batch=batch, seq_len=seq, gpu="h200"))
        rows.append({"seq_len": seq, "measured_saved": m.saved_bytes, "predicted_saved": plan.activation_total,
                     "measured_peak_above_states": m.peak,
                     "predicted_acts_plus_logits": plan.activation_total + plan.temporary["logits_or_backward_layer"],
                     "live_after_forward": m.live_after_forward})
    return rows


# ---------------------------------------------------------------------- the guide's "memory pool"
class FrequentTokenEmbeddingCache(nn.Module):
    """The EcomGPT guide's "e-commerce memory pool" idea, written so that it can be measured.

    The idea: look tokens up one at a time, and serve "frequent e-commerce
    tokens" from a dictionary of cached, detached copies of their embedding
    rows. Two facts decide whether it can save anything:

    - ``nn.Embedding`` saves only the ``[b, T]`` token ids for backward (an
      index, not the rows), and its output is a fresh ``[b, T, h]`` tensor
      either way; a cache cannot make that tensor smaller, it only adds its
      own rows;
    - a detached cached row is a constant: those tokens stop receiving
      gradient through the input side, which changes training.

    (In the guide's own code the frequent tokens are strings and the ids are
    integers, so the membership test never succeeds and the cache stays
    empty; here the ids are converted so the cache really serves rows.)
    """

    def __init__(self, embedding: nn.Embedding, frequent_ids: Sequence[int]):
        super().__init__()
        self.embedding = embedding
        self.frequent = set(int(i) for i in frequent_ids)
        self.cache: dict[int, torch.Tensor] = {}
        self.hits = 0

    @property
    def weight(self) -> torch.Tensor:   # the LM head is tied to this weight
        return self.embedding.weight

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.cache.values())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = []
        for tid in input_ids.flatten().tolist():
            if tid in self.frequent:
                if tid not in self.cache:
                    self.cache[tid] = self.embedding.weight[tid].detach().clone()
                self.hits += 1
                rows.append(self.cache[tid])
            else:
                rows.append(self.embedding.weight[tid])
        return torch.stack(rows).view(*input_ids.shape, -1)


def memory_pool_experiment(config, batch: int, seq: int, n_frequent: int = 64) -> dict[str, Any]:
    """nn.Embedding vs the per-token cached lookup: saved bytes, live peak, step time, cache size, lost gradient."""
    model = build_probe_model(config)
    ids, mask = random_batch(config.vocab_size, batch, seq)
    frequent = torch.bincount(ids.flatten(), minlength=config.vocab_size).argsort(descending=True)[:n_frequent]
    out: dict[str, Any] = {"batch": batch, "seq_len": seq, "n_frequent": n_frequent,
                           "guide_membership_test_ever_true": any(int(t) in ["¥", "元", "GB"] for t in ids.flatten())}
    original = model.transformer.word_embeddings
    for label in ("nn.Embedding", "memory pool"):
        if label == "memory pool":
            model.transformer.word_embeddings = FrequentTokenEmbeddingCache(original, frequent.tolist())
        m = measure_step_memory(model, ids, mask)
        out[f"saved_{label}"], out[f"peak_{label}"], out[f"step_s_{label}"] = m.saved_bytes, m.peak, m.seconds
        causal_lm_loss(model, ids, mask).backward()
        grad = original.weight.grad
        out[f"grad_norm_frequent_rows_{label}"] = float(grad[frequent].norm())
        model.zero_grad(set_to_none=True)
    pool = model.transformer.word_embeddings
    out["cache_bytes"] = pool.cache_bytes()
    out["cache_hits_per_step"] = pool.hits // 2
    out["peak_ratio"] = out["peak_memory pool"] / out["peak_nn.Embedding"]
    out["time_ratio"] = out["step_s_memory pool"] / out["step_s_nn.Embedding"]
    model.transformer.word_embeddings = original
    return out


# ---------------------------------------------------------------------- length-bucketed batching
def bucketing_experiment(lengths: Sequence[int], config, micro_batch: int = 8, n_batches: int = 12,
                         seed: int = 0) -> list[dict[str, Any]]:
    """Padding rate over an epoch and real tokens/s of forward + backward, random vs length-bucketed batches."""
    from ecomkit.data import DistributedBatchSampler, compare_padding

    rates = compare_padding(lengths, micro_batch_size=micro_batch, seed=seed)
    model = build_probe_model(config)
    rows = []
    for bucketed in (False, True):
        sampler = DistributedBatchSampler(lengths, micro_batch, 1, 1, 0, seed, bucketed=bucketed)
        batches = list(sampler)[:n_batches]
        real = padded = 0
        start = time.perf_counter()
        for idx in batches:
            lens = [int(lengths[i]) for i in idx]
            width = max(lens)
            ids, _ = random_batch(config.vocab_size, len(idx), width, seed=len(rows))
            mask = torch.zeros_like(ids)
            for row, n in enumerate(lens):
                mask[row, :n] = 1
            causal_lm_loss(model, ids, mask).backward()
            model.zero_grad(set_to_none=True)
            real, padded = real + sum(lens), padded + width * len(lens)
        seconds = time.perf_counter() - start
        rows.append({"batching": "bucketed" if bucketed else "random",
                     "padding_rate_epoch": rates.bucketed if bucketed else rates.random,
                     "padding_rate_measured_batches": 1 - real / padded, "real_tokens": real,
                     "seconds": seconds, "tokens_per_s": real / seconds})
    return rows


# ---------------------------------------------------------------------- model states under every strategy
def measure_strategy_states(env, strategies: Sequence[str] = ("ddp", "zero1", "zero2", "zero3", "fsdp2"),
                            precision: str = "fp32", vocab_size: int = 1024, steps: int = 2,
                            output_dir: str = "runs/06_states") -> list[dict[str, Any]]:
    """Inside torchrun: build the tiny BLOOM under each strategy of chapters 02-04, take two optimizer steps,
    and count each rank's parameter, gradient and optimizer bytes just before the last step.

    Reuses the strategies' own ``memory_report`` (chapter 03's DeepSpeed-aware
    counter for ZeRO, ``ecomkit.parallel.state_bytes.model_state_bytes`` for the
    others), so the numbers are what chapter 03/04 runs report in their
    ``memory.json`` / ``parallel_layout.json``. Returns one row per strategy
    and rank, gathered on every rank.
    """
    import torch.distributed as dist

    from ecomkit.config import TrainConfig
    from ecomkit.models.bloom import build_model, count_parameters, preset_config
    from ecomkit.parallel import build_strategy
    from ecomkit.models.loss import count_label_tokens

    rows: list[dict[str, Any]] = []
    for name in strategies:
        cfg = TrainConfig(model="tiny", precision=precision, output_dir=f"{output_dir}/{name}", progress=False,
                          save_model=False, max_steps=steps, warmup_steps=1)
        if name.startswith("zero"):
            cfg.strategy, cfg.zero.stage = "zero", int(name[-1])
        else:
            cfg.strategy = "fsdp" if name == "fsdp2" else "ddp"
        model = build_model(preset_config("tiny", vocab_size=vocab_size), seed=0)
        psi = count_parameters(model)
        strategy = build_strategy(cfg, env)
        strategy.setup(model, steps)
        gen = torch.Generator().manual_seed(env.rank)
        report: dict[str, Any] = {}
        for step in range(steps):
            ids = torch.randint(3, vocab_size, (2, 32), generator=gen).to(env.device)
            with strategy.micro_step_context(True):
                loss = strategy.forward_loss_sum({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                                  "labels": ids})
                strategy.backward(loss / count_label_tokens(ids))
            if step == steps - 1:
                report = strategy.memory_report()
            strategy.clip_and_step(1.0)
        strategy.close()
        del strategy, model
        gc.collect()
        mine = {"strategy": name, "rank": env.rank, "world_size": env.world_size, "precision": precision,
                "psi": psi, **{k: int(report.get(k, 0)) for k in ("params", "grads", "optimizer")}}
        gathered: list[Any] = [None] * env.world_size
        if env.distributed:
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        rows.extend(gathered)
    return rows


def compare_states_with_plan(rows: Sequence[dict[str, Any]], vocab_size: int = 1024) -> list[dict[str, Any]]:
    """Add the planner's per-rank bytes (same model, strategy, world size, rank) to measured rows."""
    from ecomkit.planner.memory import PlanInput, model_state_bytes_per_rank

    out = []
    for r in rows:
        plan = model_state_bytes_per_rank(PlanInput(model="tiny", vocab_size=vocab_size, world_size=r["world_size"],
                                                    strategy=r["strategy"], precision=r["precision"], device="cpu"))
        mine = plan[r["rank"]]
        row = dict(r)
        for k in ("params", "grads", "optimizer"):
            row[f"planned_{k}"] = mine[k]
        row["measured_total"] = r["params"] + r["grads"] + r["optimizer"]
        row["planned_total"] = mine["params"] + mine["grads"] + mine["optimizer"]
        row["difference_bytes"] = row["measured_total"] - row["planned_total"]
        out.append(row)
    return out


__all__ = ["long_context_config", "build_probe_model", "random_batch", "MODES", "predicted_saved_bytes",
           "activation_sweep", "checkpointing_experiment", "save_on_cpu_experiment", "gpu_peak_check",
           "FrequentTokenEmbeddingCache", "memory_pool_experiment", "bucketing_experiment",
           "measure_strategy_states", "compare_states_with_plan"]
