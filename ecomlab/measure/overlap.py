"""How much gradient communication DDP hides behind backward, and what the guide's stream trick gets wrong.

DDP groups gradients into buckets of ``bucket_cap_mb``. The last layers'
gradients are ready first, so their bucket's all-reduce starts while autograd
is still computing the earlier layers: communication overlaps computation.
Before ``backward()`` returns, DDP waits for every bucket, so
``optimizer.step()`` always sees averaged gradients. Small buckets start
communicating earlier but pay a per-collective latency more often; one huge
bucket cannot start until the whole backward is done. :func:`sweep_bucket_cap`
measures this trade-off with three timings per bucket size:

- ``step_s``: forward + backward with DDP's bucketed, overlapped all-reduce;
- ``compute_s``: the same forward + backward under ``no_sync()`` (no communication);
- ``comm_s``: all-reducing the same gradients in the same-sized buckets, alone.

``exposed_s = step_s − compute_s`` is the communication the step actually
waited for; ``hidden_frac = 1 − exposed_s / comm_s`` is the share that
overlapped. On a GPU, NCCL runs on its own stream; on CPU, gloo's threads
compete with the compute thread for the same cores, so expect less overlap.

The EcomGPT guide's version launches ``all_reduce(grad, async_op=True)`` on a
side stream after ``backward()`` and calls ``optimizer.step()`` without waiting
on the returned work handles. :func:`naive_async_allreduce` runs that recipe
(and the corrected one that waits) and measures what the optimizer read: with
no wait the step uses gradients whose all-reduce has not finished, each rank
updates with different numbers, and the replicas drift apart. Ranks never
reach a collective at the same instant; the demo makes that explicit by
letting the last rank start its all-reduces ``late_s`` later (a straggler),
so the un-waited outcome is not left to chance: rank 0's optimizer reads its
own, un-averaged gradients. :func:`async_allreduce_verdict` states the
expected outcome of both variants.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ecomkit.config import TrainConfig
from ecomkit.config.recipe import mechanics_value
from ecomkit.dist import DistEnv, distributed_session, log
from ecomkit.errors import ConfigError, EcomkitError
from ecomkit.models.bloom import load_model
from ecomlab.timing import timed

SYNTHETIC_VOCAB = 4096  # random token ids: timing and divergence do not need real text


def synthetic_batch(micro_batch: int, seq_len: int, seed: int, vocab: int = SYNTHETIC_VOCAB) -> dict[str, torch.Tensor]:
    """Random token ids with labels = inputs (causal LM loss), reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=g)
    return {"input_ids": ids, "labels": ids}


def bucket_chunks(model: torch.nn.Module, cap_mb: float) -> list[torch.Tensor]:
    """Flat copies of the gradients, grouped like DDP's buckets (reverse parameter order, <= cap bytes each)."""
    cap = cap_mb * 1024 * 1024
    chunks, current, size = [], [], 0
    for p in reversed([p for p in model.parameters() if p.grad is not None]):
        nbytes = p.grad.numel() * p.grad.element_size()
        if current and size + nbytes > cap:
            chunks.append(torch.cat(current))
            current, size = [], 0
        current.append(p.grad.detach().reshape(-1))
        size += nbytes
    if current:
        chunks.append(torch.cat(current))
    return chunks


class BucketCapProbe:
    """One DDP wrapper at one ``bucket_cap_mb``, with the three timed callables of the sweep."""

    def __init__(self, cfg: TrainConfig, cap_mb: float, env: DistEnv):
        self.cap_mb, self.env = cap_mb, env
        self.model = load_model(cfg.model, vocab_size=SYNTHETIC_VOCAB, device=env.device, seed=cfg.seed)
        self.ddp = DDP(self.model, bucket_cap_mb=cap_mb, gradient_as_bucket_view=True)
        self.batch = {k: v.to(env.device) for k, v in synthetic_batch(cfg.micro_batch_size, cfg.seq_len,
                                                                        cfg.seed + env.rank).items()}
        for _ in range(2):  # DDP rebuilds its buckets after the first backward
            self.step()
        self.chunks = bucket_chunks(self.model, cap_mb)
        self.times: dict[str, list[float]] = {"step_s": [], "compute_s": [], "comm_s": []}

    def step(self) -> None:
        """Forward + backward with DDP's overlapped all-reduce (backward returns after DDP has waited)."""
        self.ddp.zero_grad(set_to_none=False)
        self.ddp(**self.batch).loss.backward()

    def compute(self) -> None:
        with self.ddp.no_sync():
            self.step()

    def comm(self) -> None:
        for c in self.chunks:
            dist.all_reduce(c)

    def measure_once(self) -> None:
        for key, fn in (("step_s", self.step), ("compute_s", self.compute), ("comm_s", self.comm)):
            # one call per repeat: the sweep interleaves bucket sizes between repeats (see sweep_bucket_cap)
            self.times[key].append(timed(fn, repeats=1, warmup=0, device=self.env.device))

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"bucket_cap_mb": self.cap_mb, "n_buckets": len(self.chunks),
                               "grad_bytes": sum(c.numel() * c.element_size() for c in self.chunks)}
        row.update({k: statistics.median(v) for k, v in self.times.items()})
        row["exposed_s"] = max(0.0, row["step_s"] - row["compute_s"])
        row["hidden_frac"] = min(1.0, max(0.0, 1 - row["exposed_s"] / row["comm_s"])) if row["comm_s"] > 0 else None
        return row


def sweep_bucket_cap(cfg: TrainConfig, caps_mb: list[float], env: DistEnv, repeats: int = 5) -> list[dict[str, Any]]:
    """One row per bucket size (see the module docstring for the columns).

    All bucket sizes are measured round-robin within each repeat, so a busy
    moment on a shared machine slows every bucket size alike instead of one.
    Values are medians over ``repeats``.
    """
    if not env.distributed:
        raise EcomkitError("the --bucket-cap-mb sweep measures communication: launch it with torchrun "
                           "--nproc_per_node 2 (or more).")
    probes = [BucketCapProbe(cfg, cap, env) for cap in caps_mb]
    for _ in range(repeats):
        for probe in probes:
            probe.measure_once()
    rows = [p.row() for p in probes]
    if env.is_main:
        for r in rows:
            log.info("bucket sweep: %s", {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()})
    del probes
    return rows


# ---------------------------------------------------------------------- the guide's async all-reduce
def _params_spread_across_ranks(model: torch.nn.Module, env: DistEnv) -> float:
    """max |θ_rank − θ_rank0| over all parameters: 0.0 means the replicas are identical.

    A NaN or infinite weight on any rank counts as an infinite spread: an
    optimizer that read gradients while gloo was still writing them can mix
    a half-reduced value into Adam's moments and blow a weight up, and
    ``nan > 0`` would otherwise read as "no difference".
    """
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(env.world_size)]
    dist.all_gather(gathered, flat)
    diffs = [(g - gathered[0]).abs().max() for g in gathered]
    finite = all(bool(torch.isfinite(g).all()) for g in gathered)
    return max(float(d) for d in diffs) if finite else float("inf")


def naive_async_allreduce(cfg: TrainConfig, env: DistEnv, steps: int, wait: bool,
                          late_s: float = 0.5) -> dict[str, Any]:
    """Train ``steps`` steps with per-tensor async all-reduce; ``wait=False`` is the guide's recipe.

    Each rank sees different data, as in real data parallelism. All ranks
    finish backward (a barrier), then the last rank starts its all-reduces
    ``late_s`` seconds after the others (a straggler; both variants alike), so
    no all-reduce can finish before then: rank 0's ``optimizer.step()`` reads
    its own un-reduced gradient whenever it takes less than ``late_s``, which
    makes the un-waited variant's drift a certainty rather than a race that
    backward-time noise on a busy machine could decide either way. Per step we
    record the share of gradient tensors whose value when ``optimizer.step()``
    started differs from their final all-reduced value: the gradients the
    optimizer read before communication had finished.
    """
    model = load_model(cfg.model, vocab_size=SYNTHETIC_VOCAB, device=env.device, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=mechanics_value("lr", cfg.lr))
    stale_shares = []
    for step in range(steps):
        batch = synthetic_batch(cfg.micro_batch_size, cfg.seq_len, cfg.seed + 1000 * step + env.rank)
        model(**{k: v.to(env.device) for k, v in batch.items()}).loss.backward()
        grads = [p.grad for p in model.parameters()]
        for g in grads:
            g.div_(env.world_size)  # gloo has no ReduceOp.AVG: pre-divide, then SUM
        dist.barrier()  # every rank is done with backward; only the straggler's delay below decides the order
        if env.rank == env.world_size - 1 and late_s > 0:
            time.sleep(late_s)  # the straggler: its peers' all-reduces cannot complete before it joins
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        if wait:
            for w in works:
                w.wait()
        seen = [g.clone() for g in grads]  # what optimizer.step() starts reading now
        opt.step()
        for w in works:  # the guide never waits; we must, before the gradients are touched again
            w.wait()
        stale_shares.append(sum(not torch.equal(s, g) for s, g in zip(seen, grads)) / len(grads))
        opt.zero_grad(set_to_none=True)
    spread = _params_spread_across_ranks(model, env)
    del model, opt
    return {"wait": wait, "steps": steps, "late_s": late_s, "stale_grad_share_mean": statistics.mean(stale_shares),
            "stale_grad_share_per_step": stale_shares, "replica_max_abs_diff": spread,
            "replicas_identical": spread == 0.0}


def async_allreduce_verdict(demo: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the two async variants must show: waited → identical replicas, un-waited → stale reads and drift.

    ``demo`` is :func:`naive_async_allreduce`'s result for ``wait=False`` and
    ``wait=True``. Identical means bit-identical (``max |θ_r − θ_0| == 0``):
    every rank applies the same averaged gradient to the same weights with
    the same optimizer, so nothing may differ. ``ok`` is true when both hold.
    """
    by_wait = {bool(d["wait"]): d for d in demo}
    if set(by_wait) != {True, False}:
        raise ValueError("need both the waited and the un-waited variant")
    waited, unwaited = by_wait[True], by_wait[False]
    checks = {
        "waited: optimizer read only reduced gradients": waited["stale_grad_share_mean"] == 0.0,
        "waited: replicas identical": waited["replica_max_abs_diff"] == 0.0,
        "un-waited: optimizer read gradients still being reduced": unwaited["stale_grad_share_mean"] > 0.0,
        "un-waited: replicas differ": unwaited["replica_max_abs_diff"] > 0.0,
    }
    return {"checks": checks, "ok": all(checks.values()), "failed": [k for k, v in checks.items() if not v],
            "unwaited_max_abs_diff": unwaited["replica_max_abs_diff"],
            "unwaited_stale_share": unwaited["stale_grad_share_mean"]}


def bucket_sweep_summary(sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest bucket size, and how much the compute-only time varies across the sweep.

    The compute-only time (``no_sync``) cannot depend on the bucket size, so
    its spread is this machine's noise: step-time differences smaller than
    ``compute_noise`` are not an effect of the bucket size.
    """
    best = min(sweep, key=lambda r: r["step_s"])
    computes = [r["compute_s"] for r in sweep]
    return {"fastest_bucket_cap_mb": best["bucket_cap_mb"], "step_s": best["step_s"], "comm_s": best["comm_s"],
            "hidden_frac": best["hidden_frac"], "compute_noise": max(computes) / min(computes) - 1}


def parse_bucket_sizes(text: str, flag: str = "--overlap-bucket-mb") -> list[float]:
    """``"0.25,1,4,25"`` → bucket sizes in MB; a ConfigError naming ``flag`` for anything else."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise ConfigError(f"{flag} '{text}': give positive numbers separated by commas, e.g. 0.25,1,4,25.")
    return values


def run_overlap_study(cfg: TrainConfig, caps_mb: list[float], repeats: int, async_steps: int,
                      out_path: str | Path | None = None) -> dict[str, Any]:
    """The bucket sweep and both async variants in one process group; rank 0 writes the result to ``out_path``."""
    with distributed_session(timeout_s=cfg.timeout_s, seed=cfg.seed) as env:
        sweep = sweep_bucket_cap(cfg, caps_mb, env, repeats)
        demo = [naive_async_allreduce(cfg, env, async_steps, wait) for wait in (False, True)] if async_steps else []
        result = {"model": cfg.model, "micro_batch_size": cfg.micro_batch_size, "seq_len": cfg.seq_len,
                  "world_size": env.world_size, "backend": env.backend, "bucket_sweep": sweep, "async_allreduce": demo}
        if env.is_main and out_path is not None:
            Path(out_path).parent.mkdir(parents=True, exist_ok=True)
            Path(out_path).write_text(json.dumps(result, indent=2))
            log.info("overlap study written to %s", out_path)
        return result
