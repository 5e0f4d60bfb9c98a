"""Chapter 06 experiments: what activation checkpointing, offloading, precision, sequence length, batching and the
EcomGPT guide's "memory pool" really do to memory and time, each measured next to the planner's prediction.

Every function builds a small BLOOM (long sequences are what make activations
matter), runs real forward/backward passes on this machine and returns plain
rows (lists of dicts) that the notebook plots and the script writes as JSON.
Nothing here is a stored result. Rows carry their setting as fields (``mode``,
``attn``, ``seq_len``, ...), and the verdicts a chapter shows are computed here
(:func:`saved_bytes_by_mode`, ``saves_memory``, ``peak_saving``), not in cells.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Sequence

import datasets
import torch
from torch import nn
from transformers import BloomConfig

from ecomkit.config import StrategyName, plan_strategy_name
from ecomkit.data import DistributedBatchSampler, compare_padding, generate_catalog, tokenize_records
from ecomkit.fast.attention import install_attention
from ecomkit.models.bloom import build_model, preset_config
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.planner.activations import activation_bytes, activation_dtypes, checkpointing_factor
from ecomkit.planner.memory import PlanInput, plan_memory
from ecomkit.planner.shapes import model_shape
from ecomkit.train.loop import tokenizer_cache_dir
from ecomlab.measure.activations import (causal_lm_loss, disable_checkpointing, enable_checkpointing,
                                         measure_step_memory, time_step)


def long_context_config(hidden: int = 128, n_layer: int = 2, n_head: int = 4, vocab_size: int = 1024) -> BloomConfig:
    """A BLOOM small enough for seconds-long steps on a CPU at sequence lengths up to ~1k."""
    return preset_config("tiny", vocab_size=vocab_size, hidden_size=hidden, n_layer=n_layer, n_head=n_head)


def build_probe_model(config: BloomConfig, dtype: torch.dtype = torch.float32, device: str = "cpu",
                      attn: str = "eager") -> nn.Module:
    """The model every experiment measures, in training mode, with the requested attention path."""
    model = build_model(config, device=device, dtype=dtype).train()
    if attn != "eager":
        install_attention(model, attn)
    return model


def random_batch(vocab: int, batch: int, seq: int, device: str = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, seq), generator=g).to(device)
    return ids, torch.ones_like(ids)


_DDP, _ZERO2 = plan_strategy_name(StrategyName.DDP), plan_strategy_name(StrategyName.ZERO, 2)
MODES = {  # name -> (planner strategy, precision, module dtype, autocast dtype)
    "fp32": (_DDP, "fp32", torch.float32, None),
    "bf16 autocast (torch DDP)": (_DDP, "bf16", torch.float32, torch.bfloat16),
    "bf16 weights (DeepSpeed)": (_ZERO2, "bf16", torch.bfloat16, None),
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


def saved_bytes_by_mode(rows: Sequence[dict[str, Any]], seq_len: int, relative_to: str | None = None,
                        attn: str = "eager") -> dict[str, float]:
    """Measured saved bytes per precision mode at one sequence length (of :func:`activation_sweep` rows).

    With ``relative_to`` (e.g. ``"fp32"``) each value is divided by that
    mode's: the ratio mixed precision really buys, selected by field.
    """
    picked = {r["mode"]: r["measured_saved"] for r in rows if r["seq_len"] == seq_len and r["attn"] == attn}
    if relative_to is None:
        return {k: float(v) for k, v in picked.items()}
    return {k: v / picked[relative_to] for k, v in picked.items()}


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
        row["peak_saving"] = 1 - row["peak_on"] / row["peak_off"]
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
    already in host memory, so the CPU row only shows
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
    out["saves_memory"] = out["peak_ratio"] < 0.99       # within 1 %: the cache's own rows, nothing saved
    out["time_ratio"] = out["step_s_memory pool"] / out["step_s_nn.Embedding"]
    model.transformer.word_embeddings = original
    return out


# ---------------------------------------------------------------------- length-bucketed batching
def bucketing_experiment(lengths: Sequence[int], config, micro_batch: int = 8, n_batches: int = 12,
                         seed: int = 0) -> list[dict[str, Any]]:
    """Padding rate over an epoch and real tokens/s of forward + backward, random vs length-bucketed batches."""
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


def catalog_token_lengths(n_rows: int, max_length: int = 256) -> tuple[list[int], int]:
    """Token lengths of the synthetic catalog's records (local tokenizer, causal-LM task), and the vocabulary size."""
    datasets.disable_progress_bars()
    tok = get_tokenizer("local", tokenizer_cache_dir())
    lengths = tokenize_records(generate_catalog(n_rows, seed=0), tok, "lm", max_length)["length"]
    return [int(n) for n in lengths], len(tok)


def bucketing_rows(n_rows: int, micro_batch: int = 8, n_batches: int = 12) -> list[dict[str, Any]]:
    """Random vs length-bucketed batches of the synthetic catalog's real token lengths (chapter 06, section 7)."""
    lengths, vocab = catalog_token_lengths(n_rows)
    return bucketing_experiment(lengths, long_context_config(vocab_size=vocab), micro_batch=micro_batch,
                                n_batches=n_batches)


def activation_report(quick: bool = False) -> dict[str, Any]:
    """Every one-process experiment of chapter 06 on the long-context BLOOM (``06_memory_tuning.py activations``).

    Sweep (modes × eager/SDPA × batches 1, 2), checkpointing, ``save_on_cpu``,
    the memory pool and length bucketing; on a GPU also ``save_on_cpu`` with
    ``max_memory_allocated`` and the planner's peak check. ``quick`` uses
    shorter sequences and fewer catalog rows (tests, notebooks).
    """
    cfg = long_context_config()
    seqs = [128, 256, 512] if quick else [256, 512, 1024, 2048]
    out: dict[str, Any] = {
        "model": cfg.to_dict(),
        "sweep": activation_sweep(cfg, seqs, batches=[1, 2], modes=list(MODES), attns=["eager", "sdpa"],
                                  track_live=False),
        "checkpointing": checkpointing_experiment(cfg, 2, seqs[-2:]),
        "save_on_cpu_cpu": save_on_cpu_experiment(cfg, 2, seqs[-1], device="cpu"),
        "memory_pool": memory_pool_experiment(cfg, 2, 64),
        "bucketing": bucketing_rows(1500 if quick else 6000),
    }
    if torch.cuda.is_available():
        out["save_on_cpu_gpu"] = save_on_cpu_experiment(cfg, 2, seqs[-1], device="cuda")
        out["gpu_peak"] = gpu_peak_check(cfg, 2, seqs)
    return out


__all__ = ["long_context_config", "build_probe_model", "random_batch", "MODES", "predicted_saved_bytes",
           "activation_sweep", "checkpointing_experiment", "save_on_cpu_experiment", "gpu_peak_check",
           "FrequentTokenEmbeddingCache", "memory_pool_experiment", "bucketing_experiment", "saved_bytes_by_mode",
           "catalog_token_lengths", "bucketing_rows", "activation_report"]
