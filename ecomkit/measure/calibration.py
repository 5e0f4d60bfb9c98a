"""Calibrate the time model on this machine and check it against a real 2-process DDP run of chapter 02's loop.

What is measured, on every rank at the same time (so the processes compete
for the cores exactly as during DDP training):

- ``matmul_flops``: FLOP/s of one ``[b·T, h] × [h, 4h]`` matrix product (the
  device "peak" for this model's shapes);
- ``fwd_bwd_s``: one forward + backward of a copy of the model, no
  communication; ``efficiency = model FLOPs / fwd_bwd_s / matmul_flops``
  (what the GPU predictions take as an input, ~0.45);
- ``optimizer_s``: gradient clipping + one AdamW step on a copy of the model;
- α and β of gloo's all-reduce: times of all-reduces from 4 KiB to the
  gradient size, fitted to ``t = 2(N-1)·α + 2(N-1)/N · S/B``.

The prediction for one DDP step is then ``compute + DDP's bucketed gradient
all-reduce (exposed) + optimizer + the loop's two small all-reduces``.
``overlap`` is 0 here: with two single-threaded processes on two cores, no
core is free to run gloo's communication thread while backward computes.

:class:`CalibrationCallback` runs the microbenchmarks right before and right
after training (their mean is used, which halves the effect of a machine
whose load changes), inside the same processes that run the chapter-02
training loop (``run_training``, what ``scripts/02_data_parallel.py`` calls),
and adds ``summary["time_model"]``: prediction, measurement and their ratio.
"""

from __future__ import annotations

import copy
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from ecomkit.config import TrainConfig
from ecomkit.dist import timed
from ecomkit.measure.activations import causal_lm_loss
from ecomkit.models.bloom import count_parameters, flops_per_token
from ecomkit.models.optim import build_optimizer
from ecomkit.train import run_training

DDP_FIRST_BUCKET_BYTES = 1024 * 1024       # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)


def measure_matmul_flops(rows: int, hidden: int, repeats: int = 20) -> float:
    a, w = torch.randn(rows, hidden), torch.randn(hidden, 4 * hidden)
    return 2 * rows * hidden * 4 * hidden / timed(lambda: a @ w, repeats)


def measure_allreduce(sizes: list[int], repeats: int = 5) -> list[tuple[int, float]]:
    """(bytes, seconds) of fp32 all-reduces of each size on the default group."""
    out = []
    for nbytes in sizes:
        x = torch.zeros(max(1, nbytes // 4))
        out.append((nbytes, timed(lambda: dist.all_reduce(x), repeats)))
    return out


def fit_alpha_beta(samples: list[tuple[int, float]], n: int) -> tuple[float, float]:
    """Least-squares α (s) and bus bandwidth B (bytes/s) of ``t = 2(n-1)α + 2(n-1)/n · S/B``."""
    xs = [2 * (n - 1) / n * s for s, _ in samples]
    ts = [t for _, t in samples]
    mx, mt = statistics.fmean(xs), statistics.fmean(ts)
    slope = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sum((x - mx) ** 2 for x in xs)
    intercept = max(mt - slope * mx, 0.0)
    return intercept / (2 * (n - 1)), 1.0 / slope if slope > 0 else float("inf")


def _fwd_bwd(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    mask = torch.ones_like(ids)

    def step() -> None:
        causal_lm_loss(model, ids, mask).backward()

    return step


@dataclass
class CpuCalibration:
    """Microbenchmarks of this machine for one model and micro-batch shape."""

    world_size: int
    micro_batch: int
    seq_len: int
    n_params: int
    matmul_flops: float
    fwd_bwd_s: float
    model_flops: float
    optimizer_s: float
    alpha_s: float
    bus_bytes_per_s: float
    allreduce: list[tuple[int, float]] = field(default_factory=list)

    @property
    def efficiency(self) -> float:
        return self.model_flops / self.fwd_bwd_s / self.matmul_flops


def calibrate(model: torch.nn.Module, micro_batch: int, seq_len: int, grad_accum: int = 1,
              repeats: int = 5) -> CpuCalibration:
    """Run every microbenchmark on a copy of ``model`` (all ranks together); returns this rank's numbers.

    Every timing goes through ``ecomkit.dist.timed`` (the one barrier-synchronised
    timer), so all ranks start each run together, as they do in DDP training.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    cfg = model.config
    probe = copy.deepcopy(model).train()
    psi = count_parameters(probe)
    ids = torch.randint(3, cfg.vocab_size, (micro_batch, seq_len))
    matmul = measure_matmul_flops(micro_batch * seq_len, cfg.hidden_size)
    fwd_bwd = timed(_fwd_bwd(probe, ids), repeats) * grad_accum
    flops = grad_accum * micro_batch * seq_len * flops_per_token(psi, cfg.n_layer, cfg.hidden_size, seq_len)
    _fwd_bwd(probe, ids)()
    optimizer = build_optimizer(probe, TrainConfig())

    def opt_step() -> None:
        torch.nn.utils.clip_grad_norm_([p for p in probe.parameters() if p.grad is not None], 1.0)
        optimizer.step()

    optimizer_s = timed(opt_step, repeats)
    sizes = [4096 * 4 ** i for i in range(12) if 4096 * 4 ** i < 4 * psi] + [4 * psi]
    samples = measure_allreduce(sizes, repeats) if world > 1 else []
    alpha, bus = fit_alpha_beta(samples, world) if world > 1 else (0.0, float("inf"))
    del probe, optimizer
    return CpuCalibration(world, micro_batch, seq_len, psi, matmul, fwd_bwd, flops, optimizer_s, alpha, bus, samples)


def mean_calibration(a: CpuCalibration, b: CpuCalibration) -> CpuCalibration:
    """Field-wise mean of two calibrations of the same setup (before and after training)."""
    out = copy.deepcopy(a)
    for name in ("matmul_flops", "fwd_bwd_s", "optimizer_s", "alpha_s"):
        setattr(out, name, (getattr(a, name) + getattr(b, name)) / 2)
    out.bus_bytes_per_s = 2 / (1 / a.bus_bytes_per_s + 1 / b.bus_bytes_per_s)
    return out


def ddp_buckets(grad_bytes: int, bucket_cap_mb: float) -> list[int]:
    """Sizes of DDP's gradient buckets: a 1 MiB first bucket, then ``bucket_cap_mb`` ones."""
    cap = int(bucket_cap_mb * 1024 * 1024)
    buckets, left = [], grad_bytes
    first = min(DDP_FIRST_BUCKET_BYTES, left)
    buckets.append(first)
    left -= first
    while left > 0:
        buckets.append(min(cap, left))
        left -= buckets[-1]
    return buckets


def predict_ddp_step(cal: CpuCalibration, bucket_cap_mb: float = 25.0, overlap: float = 0.0,
                     small_allreduces: int = 2) -> dict[str, float]:
    """The time model for one DDP step on this machine, by part (seconds)."""
    n = cal.world_size
    ring = lambda s: 2 * (n - 1) * cal.alpha_s + 2 * (n - 1) / n * s / cal.bus_bytes_per_s  # noqa: E731
    comm = sum(ring(b) for b in ddp_buckets(4 * cal.n_params, bucket_cap_mb)) if n > 1 else 0.0
    compute = cal.model_flops / (cal.matmul_flops * cal.efficiency)   # = fwd_bwd_s, written as the model does
    backward = compute * 2 / 3
    exposed = max(comm - overlap * backward, 0.0)
    small = small_allreduces * ring(8) if n > 1 else 0.0
    parts = {"compute_s": compute, "comm_s": comm, "comm_exposed_s": exposed, "optimizer_s": cal.optimizer_s,
             "small_collectives_s": small}
    parts["total_s"] = compute + exposed + cal.optimizer_s + small
    return parts


class CalibrationCallback:
    """Calibrate before and after training, predict the DDP step, compare with the loop's measured steps."""

    def __init__(self, out_path: str | None = None, repeats: int = 5, overlap: float = 0.0):
        self.out_path, self.repeats, self.overlap = out_path, repeats, overlap
        self.before: CpuCalibration | None = None
        self.report: dict[str, Any] = {}

    def _calibrate(self, run) -> CpuCalibration:
        return calibrate(run.strategy.raw_model, run.cfg.micro_batch_size, run.cfg.seq_len, run.grad_accum,
                         self.repeats)

    def on_train_start(self, run) -> None:
        self.before = self._calibrate(run)

    def on_train_end(self, run, summary: dict[str, Any]) -> None:
        after = self._calibrate(run)
        cal = mean_calibration(self.before, after) if self.before else after
        predicted = predict_ddp_step(cal, run.cfg.bucket_cap_mb, self.overlap)
        steps = [r["step_time_s"] for r in run.history if r.get("type") == "train"][1:]
        measured = statistics.median(steps) if steps else float("nan")
        expected_tokens = run.cfg.micro_batch_size * run.cfg.seq_len * run.grad_accum * run.env.world_size
        tokens = [r["tokens"] for r in run.history if r.get("type") == "train"]
        self.report = {
            "calibration": {**asdict(cal), "efficiency": cal.efficiency},
            "calibration_before_after_fwd_bwd_s": [self.before.fwd_bwd_s if self.before else None, after.fwd_bwd_s],
            "predicted": predicted, "measured_step_s": measured, "measured_steps": steps,
            "ratio_predicted_over_measured": predicted["total_s"] / measured,
            "padding_free": all(t == expected_tokens for t in tokens),
        }
        summary["time_model"] = self.report
        if run.env.is_main and self.out_path:
            Path(self.out_path).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out_path).write_text(json.dumps(self.report, indent=2))


def calibration_defaults() -> TrainConfig:
    """Chapter 06's calibration run: small BLOOM, seq 32, micro-batch 4, six steps.

    These shapes keep every batch free of padding, so the prediction and the
    measurement describe the same work (the report's ``padding_free`` checks it).
    """
    return TrainConfig(model="small", seq_len=32, micro_batch_size=4, max_steps=6, eval_interval=0, eval_batches=1,
                       n_rows=300, save_model=False, progress=False, lr=1e-3, output_dir="runs/06/calibrate")


def run_calibration(cfg: TrainConfig, repeats: int = 3) -> dict[str, Any]:
    """Train ``cfg`` with chapter 02's loop, calibrating before and after; returns (and writes) the time-model report.

    The report lands in ``<output_dir>/time_model.json`` (rank 0) and in the
    run summary under ``time_model``; every rank returns it.
    """
    callback = CalibrationCallback(str(Path(cfg.output_dir) / "time_model.json"), repeats=repeats)
    run_training(cfg, [callback])
    return callback.report


__all__ = ["CpuCalibration", "calibrate", "fit_alpha_beta", "measure_allreduce", "measure_matmul_flops",
           "predict_ddp_step", "ddp_buckets", "CalibrationCallback", "mean_calibration", "calibration_defaults",
           "run_calibration"]
