"""Check the time model on this machine: predict DDP, ZeRO-2 and FSDP2 steps from inputs measured apart from them.

The prediction is the planner's own (:func:`ecomkit.planner.step_time.predict_step_time`);
this module only supplies what the planner takes from the hardware table on a
GPU, measured here instead, **before** any of the predicted runs trains:

- **compute**: one process's forward + backward of the model at the training
  micro-batch (no communication), and one AdamW step with gradient clipping on
  all Ψ parameters. The same again for each sharding engine on a data-parallel
  group of this rank alone, where its collectives move nothing:
  FSDP2 on a one-rank mesh (its DTensor dispatch and per-parameter copies),
  and a DeepSpeed ZeRO-2 engine (:func:`ecomkit.parallel.zero.probe.one_rank_engine`:
  its gradient hooks and buckets, the flat fp32 partition and the copies into
  and out of it). Each strategy is priced with its own engine's measurement
  (:meth:`ComputeMeasurement.for_strategy`). They become a "GPU"
  (:func:`measured_device`): a peak of ``model FLOPs / fwd_bwd_s`` at
  efficiency 1 (so the planner's compute term is exactly the measured time,
  times the accumulation), and an "HBM bandwidth" of ``28 bytes × Ψ /
  optimizer_s`` (so its optimizer term on ``Ψ/N`` local parameters is the
  measured step scaled by ``1/N``). The processes measure at the same time,
  each alone with its model, so they share the cores as the training
  processes will; each timed run counts at its slowest rank, and the runs are
  averaged as a mean (:data:`MEAN`), as the measured steps are.
- **network**: chapter 01's all-reduce sweep
  (:func:`ecomkit.envcheck.collectives.measure_all_reduce_bandwidth`, fp32
  sums of 1 KiB to 64 MiB, slowest rank) fitted to the ring model
  ``t = 2(N-1)·α + 2(N-1)/N · S/B`` (:func:`fit_alpha_beta`), and the same
  sweep for all-gather and reduce-scatter, each fitted to its own ring
  formula: gloo's all-gather and reduce-scatter move bytes several times
  slower than its all-reduce (the report prints each fit), so one all-reduce
  fit would price FSDP's collectives far too low. FSDP2's collectives are
  swept as FSDP2 issues them on more than one rank (:func:`_collective`:
  fresh buffers, the copy-in and copy-out, the divisions gloo needs), work
  its one-rank path skips. Each becomes a link (:func:`measured_links`).

``overlap`` is 0 on this CPU, set before any measurement: with one thread per
process and no spare core, gloo's communication thread takes its core from
backward, so nothing hides.

:func:`run_calibration` does all of it in one ``torchrun`` job: the
measurements at the start of the first run, then one chapter-02 training run
per strategy (:func:`ecomkit.train.sweep.run_sweep`), each of whose steady
step time (slowest rank) is compared with the prediction. All inputs are timed again after the last run: how far
the prediction moves with them (:func:`input_drift`) is added to a check's tolerance (:func:`allowed_error`).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.envcheck.alpha_beta import fit_alpha_beta
from ecomkit.envcheck.collectives import measure_all_reduce_bandwidth
from ecomkit.hardware import GpuSpec
from ecomkit.planner.links import LinkSpec
from ecomkit.models.bloom import count_parameters, flops_per_token
from ecomkit.models.loss import TokenLoss, lm_loss_sum
from ecomkit.models.optim import build_optimizer
from ecomkit.parallel.fsdp import apply_fsdp
from ecomkit.parallel.zero.probe import one_rank_engine
from ecomkit.planner.memory import PlanInput
from ecomkit.planner.shapes import model_shape
from ecomkit.planner.step_time import ADAM_BYTES_PER_ELEMENT, StepTime, predict_step_time
from ecomkit.train.sweep import run_sweep
from ecomlab.measure.strategy_states import PlannerStrategy
from ecomlab.timing import timed, timed_phases

ALPHA_BETA_SIZES = [2**10 * 4**i for i in range(9)]     # 1 KiB … 64 MiB, chapter 01's sweep
CPU_OVERLAP = 0.0
# Compute is timed as a mean at the slowest rank, not a median of one rank: the predicted step is compared with
# a training run's mean step (total steady time / steps) at its slowest rank's pace, which keeps the occasional
# slow step (page faults of fresh buffers, the scheduler) and, with collectives syncing every step, the slower
# of the ranks each time; a median of one rank's inputs would leave both out of one side only.
MEAN = statistics.fmean
CALIBRATION_STRATEGIES = ("ddp", "zero2", "fsdp2")


# ---------------------------------------------------------------------- the measured inputs
@dataclass
class ComputeMeasurement:
    """One process's compute for one model and micro-batch: no communication in it."""

    micro_batch: int
    seq_len: int
    n_params: int
    fwd_bwd_s: float          # one micro-batch
    optimizer_s: float        # clip + AdamW on all n_params
    model_flops: float        # of one micro-batch (6Ψ + attention, per token)
    fsdp_fwd_bwd_s: float | None = None    # FSDP2 on a one-rank mesh: its copies and DTensor dispatch, no traffic
    fsdp_optimizer_s: float | None = None  # clip + AdamW on the one-rank FSDP2 model's (DTensor) parameters
    zero_fwd_bwd_s: float | None = None    # a one-rank DeepSpeed ZeRO-2 engine: forward + engine.backward
    zero_optimizer_s: float | None = None  # ... and its engine.step (flat fp32 partition, copies, clip, AdamW)

    def for_strategy(self, strategy: str) -> tuple[float, float]:
        """(forward + backward, optimizer step) that prices ``strategy``: its engine's own where one was measured."""
        engine = {"fsdp2": (self.fsdp_fwd_bwd_s, self.fsdp_optimizer_s),
                  "zero2": (self.zero_fwd_bwd_s, self.zero_optimizer_s)}.get(strategy, (None, None))
        return engine if engine[0] and engine[1] else (self.fwd_bwd_s, self.optimizer_s)


@dataclass
class LinkFit:
    """α (s) and bus bandwidth (bytes/s) of each gloo collective on ``world_size`` processes, and the samples.

    ``fits`` maps ``all_reduce`` / ``all_gather`` / ``reduce_scatter`` to
    ``(alpha_s, bus_bytes_per_s)``; ``samples`` to ``[(bytes, seconds), ...]``.
    """

    world_size: int
    fits: dict[str, tuple[float, float]]
    samples: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


# The collectives as FSDP2 issues them on several ranks, priced for fsdp2 in place of the plain ones.
FSDP_PATHS = {"all_gather": "fsdp_all_gather", "reduce_scatter": "fsdp_reduce_scatter"}


def _collective(kind: str, numel: int, world_size: int) -> Callable[[], None]:
    """One call of ``kind`` on fp32 tensors of ``numel`` elements in all (a multiple of ``world_size``).

    ``fsdp_all_gather`` and ``fsdp_reduce_scatter`` are the collective as
    FSDP2 issues it on more than one rank, beyond what its one-rank path
    (measured in :func:`measure_compute`) already does: the all-gather copies
    the shard into a fresh flat buffer, gathers into a fresh output and copies
    that out into the unsharded parameters; the reduce-scatter divides the
    full gradient buffer by N and reduces into a fresh output: one division
    per reduce-scatter, as a profile of FSDP2 on gloo shows. On one rank
    FSDP2 skips all of it.
    """
    full, shard = torch.zeros(numel), torch.zeros(numel // world_size)
    if kind == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, shard)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(shard, full)

    def fsdp_all_gather() -> None:
        flat, out = torch.empty_like(shard), torch.empty_like(full)
        flat.copy_(shard)
        dist.all_gather_into_tensor(out, flat)
        torch.empty_like(full).copy_(out)

    def fsdp_reduce_scatter() -> None:
        out = torch.empty_like(shard)
        full.div_(world_size)
        dist.reduce_scatter_tensor(out, full)

    return {"fsdp_all_gather": fsdp_all_gather, "fsdp_reduce_scatter": fsdp_reduce_scatter}[kind]


def _sweep(kind: str, sizes: Sequence[int], world_size: int, repeats: int) -> list[tuple[int, float]]:
    """(total bytes, median seconds) of one :func:`_collective` of fp32 tensors of each total size."""
    out = []
    for nbytes in sizes:
        numel = max(world_size, nbytes // 4 // world_size * world_size)
        out.append((numel * 4, timed(_collective(kind, numel, world_size), repeats)))
    return out


def measure_link(world_size: int, sizes: Sequence[int] = ALPHA_BETA_SIZES, iters: int = 10,
                 repeats: int = 3) -> LinkFit:
    """Chapter 01's all-reduce sweep, and the same sizes for the other collectives, each fitted to α-β."""
    rows = measure_all_reduce_bandwidth(list(sizes), iters, world_size, torch.device("cpu"))
    samples = {"all_reduce": [(r.size_bytes, r.time_us * 1e-6) for r in rows]}
    for kind in ("all_gather", "reduce_scatter", *FSDP_PATHS.values()):
        samples[kind] = _sweep(kind, sizes, world_size, repeats)
    return LinkFit(world_size, {k: fit_alpha_beta(v, world_size, k) for k, v in samples.items()}, samples)


def _probe_batch(model_config: Any, cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A random full micro-batch (ids, mask) at the training shape."""
    ids = torch.randint(3, model_config.vocab_size, (cfg.micro_batch_size, cfg.seq_len))
    return ids, torch.ones_like(ids)


def training_loss(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, loss: TokenLoss = TokenLoss(),
                  head: torch.nn.Module | None = None) -> torch.Tensor:
    """The loss as the training loop computes it: ``loss``, the run's (``Strategy.token_loss``).

    Why: the chunked loss recomputes the LM head in backward (it checkpoints
    each chunk), so timing the full-logits loss instead would price a
    different backward from the one the predicted run does.
    """
    return lm_loss_sum(model, loss, ids, mask, ids, head=head)


def _time_train_step(probe: torch.nn.Module, cfg: TrainConfig, repeats: int, loss: TokenLoss
                     ) -> tuple[float, float]:
    """(forward + backward of one micro-batch, clip + AdamW step) of ``probe``, mean seconds each."""
    ids, mask = _probe_batch(probe.config, cfg)

    def fwd_bwd() -> None:
        training_loss(probe, ids, mask, loss).backward()

    fwd_bwd_s = timed(fwd_bwd, repeats, average=MEAN, slowest=True)
    optimizer = build_optimizer(probe, cfg)

    def opt_step() -> None:
        torch.nn.utils.clip_grad_norm_([p for p in probe.parameters() if p.grad is not None], cfg.max_grad_norm)
        optimizer.step()

    return fwd_bwd_s, timed(opt_step, repeats, average=MEAN, slowest=True)


def _time_engine_step(engine: Any, cfg: TrainConfig, repeats: int, loss: TokenLoss) -> tuple[float, float]:
    """(forward + ``engine.backward``, ``engine.step``) of a DeepSpeed engine, mean seconds each.

    Timed in alternation, as training calls them: a ZeRO engine reduces its
    gradient buckets in backward and must step before the next backward. The run's loss, as ZeRO trains it.
    """
    ids, mask = _probe_batch(engine.module.config, cfg)

    def fwd_bwd() -> None:
        engine.backward(training_loss(engine, ids, mask, loss, engine.module.lm_head), scale_wrt_gas=False)

    fwd_bwd_s, step_s = timed_phases([fwd_bwd, engine.step], repeats, average=MEAN, slowest=True)
    return fwd_bwd_s, step_s


def one_rank_mesh() -> DeviceMesh:
    """A mesh of this rank alone (every rank must call it: each group is created by all ranks)."""
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
    return DeviceMesh.from_group(groups[dist.get_rank()], "cpu")


def measure_compute(model: torch.nn.Module, cfg: TrainConfig, repeats: int = 5, one_rank: DeviceMesh | None = None,
                    env: DistEnv | None = None, loss: TokenLoss = TokenLoss()) -> ComputeMeasurement:
    """Forward + backward (through ``loss``, the run's) and one clip + AdamW step of a copy of ``model``, alone.

    With ``one_rank`` (a mesh of this rank alone: :func:`one_rank_mesh`) and
    ``env``, the same for a copy wrapped in FSDP2 on it and for a DeepSpeed
    ZeRO-2 engine on its group: their own CPU work, with collectives that move nothing.
    """
    probe = copy.deepcopy(model).train()
    mc = probe.config
    psi = count_parameters(probe)
    fwd_bwd_s, optimizer_s = _time_train_step(probe, cfg, repeats, loss)
    del probe
    m = ComputeMeasurement(cfg.micro_batch_size, cfg.seq_len, psi, fwd_bwd_s, optimizer_s,
                           cfg.micro_batch_size * cfg.seq_len * flops_per_token(psi, mc.n_layer, mc.hidden_size,
                                                                                 cfg.seq_len))
    if one_rank is not None and env is not None:
        sharded = apply_fsdp(copy.deepcopy(model).train(), one_rank, precision=cfg.precision)
        m.fsdp_fwd_bwd_s, m.fsdp_optimizer_s = _time_train_step(sharded, cfg, repeats, loss)
        del sharded
        with one_rank_engine(model, cfg, env, one_rank.get_group(), stage=2) as engine:
            m.zero_fwd_bwd_s, m.zero_optimizer_s = _time_engine_step(engine, cfg, repeats, loss)
    return m


# ---------------------------------------------------------------------- the planner's inputs, from measurements
def measured_device(m: ComputeMeasurement, strategy: str = "ddp") -> GpuSpec:
    """This CPU as the planner's "GPU": compute at ``model_flops / fwd_bwd_s``, optimizer at the measured step.

    For ``fsdp2`` and ``zero2``, the one-rank measurements of their own engine when there are some.
    """
    fwd_bwd_s, optimizer_s = m.for_strategy(strategy)
    return GpuSpec("cpu-measured", "this CPU (measured)", 2**50, ADAM_BYTES_PER_ELEMENT * m.n_params / optimizer_s,
                   None, None, m.model_flops / fwd_bwd_s / 1e12,
                   default_link="")   # no preset: its links are measured too (measured_links), always given


def measured_links(fit: LinkFit) -> dict[str, LinkSpec]:
    """One link per collective, each fitted to its own sweep (1 KiB-64 MiB)."""
    return {kind: LinkSpec(f"gloo-{kind}", f"gloo {kind}, {fit.world_size} processes (measured)", bus, alpha,
                           "fitted to an α-β sweep of 1 KiB-64 MiB on this machine")
            for kind, (alpha, bus) in fit.fits.items()}


def predict_cpu_step(m: ComputeMeasurement, fit: LinkFit, strategy: str, cfg: TrainConfig, model_config: Any,
                     overlap: float = CPU_OVERLAP) -> StepTime:
    """The planner's step time for ``strategy`` on ``fit.world_size`` processes, from measured inputs only."""
    inp = PlanInput(model=model_config, world_size=fit.world_size, strategy=strategy, precision="fp32",
                    micro_batch=cfg.micro_batch_size, seq_len=cfg.seq_len, grad_accum=cfg.grad_accum,
                    gpu=measured_device(m, strategy), zero_bucket_elements=cfg.zero.bucket_size, device="cpu")
    shape = model_shape(model_config)
    if shape.n_params != m.n_params:
        raise ValueError(f"the measured model has {m.n_params:,} parameters, the planned one {shape.n_params:,}")
    links = measured_links(fit)
    if strategy == "fsdp2":
        links |= {plain: links[path] for plain, path in FSDP_PATHS.items() if path in links}
    return predict_step_time(inp, link=links["all_reduce"], collective_links=links, efficiency=1.0, overlap=overlap,
                             bucket_bytes=cfg.bucket_cap_mb * 2**20, shape=shape)


def calibration_rows(m: ComputeMeasurement, fit: LinkFit, measured_step_s: dict[str, float], cfg: TrainConfig,
                     model_config: Any, overlap: float = CPU_OVERLAP) -> list[dict[str, Any]]:
    """One row per strategy: predicted parts, predicted and measured step time, and their ratio."""
    rows = []
    for strategy, measured in measured_step_s.items():
        st = predict_cpu_step(m, fit, strategy, cfg, model_config, overlap)
        rows.append({"strategy": strategy, "processes": fit.world_size, "predicted_s": st.total_s,
                     "measured_s": measured, "ratio": st.total_s / measured, "compute_s": st.compute_s,
                     "comm_s": st.comm_s, "comm_exposed_s": st.comm_exposed_s, "optimizer_s": st.optimizer_s})
    return rows


def worst_ratio_error(rows: Sequence[dict[str, Any]]) -> float:
    """The largest |predicted / measured − 1| over the rows."""
    return max(abs(r["ratio"] - 1) for r in rows)


def calibrate_with_one_rerun(job: Callable[[int], dict[str, Any]],
                             tolerance: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``job(attempt)`` runs one fresh calibration job and returns its report; a second runs only on a miss.

    Why: on a shared machine, a process that wakes up mid-job slows the measured
    steps after the inputs were measured. A miss (a row outside
    :func:`allowed_error`) gets one fresh job with the same bound, and the
    caller asserts on the last report. Returns (last report, every report), so
    a first miss is shown, not hidden.
    """
    reports = [job(0)]
    if any(abs(r["ratio"] - 1) > allowed_error(r, tolerance) for r in reports[0]["rows"]):
        reports.append(job(1))
    return reports[-1], reports


def input_drift(row: dict[str, Any], again: dict[str, Any]) -> float:
    """|again / row − 1| of one strategy's predicted step: from the inputs timed at the job's start, then its end."""
    return abs(again["predicted_s"] / row["predicted_s"] - 1)


def allowed_error(row: dict[str, Any], tolerance: float) -> float:
    """The bound a row's |ratio − 1| is held to: the model's ``tolerance`` plus the row's own ``input_drift``.

    Why: a prediction cannot be closer to the runs than its inputs are to
    themselves; the drift is measured in the same job, never assumed.
    """
    return tolerance + row.get("input_drift", 0.0)


# ---------------------------------------------------------------------- the job
class MeasureInputsCallback:
    """At the start of the first run, before its first step: the all-reduce sweep and the compute measurement."""

    def __init__(self, repeats: int = 5, iters: int = 10):
        self.repeats, self.iters = repeats, iters
        self.compute: ComputeMeasurement | None = None
        self.link: LinkFit | None = None
        self.model_config: Any = None
        self.initial: torch.nn.Module | None = None              # the first run's model, for measure_again
        self.compute_after: ComputeMeasurement | None = None
        self.link_after: LinkFit | None = None

    def on_train_start(self, run) -> None:
        self.link = measure_link(run.env.world_size, iters=self.iters)
        mesh = one_rank_mesh() if dist.is_initialized() else None
        self.compute = measure_compute(run.strategy.raw_model, run.cfg, self.repeats, one_rank=mesh, env=run.env,
                                       loss=run.strategy.token_loss)
        self.model_config = copy.deepcopy(run.strategy.raw_model.config)
        self.initial = copy.deepcopy(run.strategy.raw_model)
        if dist.is_initialized():
            dist.barrier()

    def measure_again(self, run, summary) -> None:
        """``on_train_end`` of the last run: the same inputs (compute, links) timed again, for :func:`input_drift`."""
        self.link_after = measure_link(run.env.world_size, iters=self.iters)
        mesh = one_rank_mesh() if dist.is_initialized() else None
        self.compute_after = measure_compute(self.initial, run.cfg, self.repeats, one_rank=mesh, env=run.env)


def calibration_defaults() -> TrainConfig:
    """Chapter 06's calibration runs: small BLOOM, seq 32, micro-batch 4, no padding, six steps, at fp32 (the
    precision the time model's committed calibrations were measured at; ``--precision`` changes it)."""
    return TrainConfig(model="small", seq_len=32, micro_batch_size=4, max_steps=6, eval_interval=0, eval_batches=1,
                       n_rows=300, save_model=False, progress=False, lr=1e-3, output_dir="runs/06/calibrate",
                       precision="fp32")


def run_calibration(cfg: TrainConfig, strategies: Sequence[str] = CALIBRATION_STRATEGIES,
                    repeats: int = 5) -> dict[str, Any]:
    """Measure the inputs, train each strategy, predict each step; returns (and writes) the report on every rank.

    The report lands in ``<output_dir>/time_model.json`` (rank 0): the
    measured inputs (timed again after the last run: ``input_drift``), one row
    per strategy and the worst |ratio − 1|.
    """
    probe = MeasureInputsCallback(repeats)
    variants = [PlannerStrategy(s) for s in strategies]
    again = SimpleNamespace(on_train_end=probe.measure_again)
    summaries = run_sweep(cfg, variants, lambda v, c: [probe] * (v is variants[0]) + [again] * (v is variants[-1]))
    assert probe.compute is not None and probe.link is not None
    measured = {v.label: s["step_time_s"] for v, s in zip(variants, summaries)}
    rows = calibration_rows(probe.compute, probe.link, measured, cfg, probe.model_config)
    again = calibration_rows(probe.compute_after, probe.link_after, measured, cfg, probe.model_config)
    for row, row_again in zip(rows, again):
        row["input_drift"] = input_drift(row, row_again)
    report = {"compute": asdict(probe.compute), "link": asdict(probe.link), "overlap": CPU_OVERLAP, "rows": rows,
              "worst_ratio_error": worst_ratio_error(rows), "world_size": probe.link.world_size,
              "compute_after": asdict(probe.compute_after), "link_after": asdict(probe.link_after),
              "steady_steps": {v.label: s["steady_steps"] for v, s in zip(variants, summaries)}}
    if int(os.environ.get("RANK", 0)) == 0:
        out = Path(cfg.output_dir) / "time_model.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
    return report


__all__ = ["ComputeMeasurement", "LinkFit", "fit_alpha_beta", "measure_link", "measure_compute", "measured_device",
           "measured_links", "predict_cpu_step", "one_rank_mesh", "calibration_rows", "worst_ratio_error",
           "training_loss", "calibrate_with_one_rerun", "input_drift", "allowed_error", "MeasureInputsCallback",
           "calibration_defaults", "run_calibration", "ALPHA_BETA_SIZES", "CPU_OVERLAP", "CALIBRATION_STRATEGIES",
           "FSDP_PATHS", "MEAN"]
