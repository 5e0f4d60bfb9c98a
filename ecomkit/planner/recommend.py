"""``--recommend``: the fastest setup that fits, among the strategies ecomkit trains, for the same global batch.

Each candidate keeps the user's global batch, takes the largest micro-batch that fits, and is ranked by its predicted
step time; a tie (within :data:`STEP_TIE`) goes to the simpler layout, then the smaller peak, since the time model
cannot tell a few per cent apart. Refused candidates lose with their reason; :func:`what_would_fit` says what would.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, replace
from typing import Any, Callable

from ecomkit.config import StrategyName, TrainConfig
from ecomkit.errors import ConfigError
from ecomkit.hardware import GIB, GPUS
from ecomkit.planner.candidates import FULL, LORA, Candidate, full_candidates, launch_line, lora_candidates
from ecomkit.planner.job import Cluster, plan_degrees, plan_job, planned_precision, planned_seq_len
from ecomkit.planner.links import gpu_spec
from ecomkit.planner.memory import MemoryPlan
from ecomkit.planner.shapes import model_shape
from ecomkit.planner.step_time import StepTime, predict_step_time

# Extra candidate groups: name → function(cluster, shape) → candidates. Each is ranked apart from FULL.
EXTRA_GROUPS: dict[str, Callable[..., list[Candidate]]] = {LORA: lora_candidates}
# What the LoRA group's step times are (the time model knows full fine-tuning only).
GROUP_NOTES = {LORA: "predicted times are full fine-tuning's time model, an upper bound for LoRA (no weight "
                     "gradients for the frozen base, only the adapters' gradients sent); memory is LoRA's "
                     "(ecomkit.planner.lora)"}
# Step times within this share of the fastest are a tie: the time model's error by strategy is larger.
STEP_TIE = 0.02


@dataclass
class Choice:
    """One candidate's outcome: its config at the chosen micro-batch, the plan and step time, or why it lost."""

    candidate: Candidate
    cfg: TrainConfig | None = None
    plan: MemoryPlan | None = None
    step: StepTime | None = None
    reason: str = ""                 # why it cannot run ("does not fit: ...", "not allowed: ...")
    tied: int = 0                    # fitting candidates within STEP_TIE of the fastest (set by rank_choices)

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.fits and self.step is not None

    @property
    def step_s(self) -> float:
        return self.step.total_s if self.step is not None else float("inf")


def global_batch(cfg: TrainConfig, cluster: Cluster) -> int:
    """Samples per optimizer step of the job as given."""
    _, dp, _, _ = plan_degrees(cfg, cluster.gpus)
    return cfg.global_batch_size if cfg.global_batch_size > 0 else cfg.micro_batch_size * cfg.grad_accum * dp


def layout_complexity(cfg: TrainConfig) -> int:
    """How much machinery a layout adds over plain DDP (0); a tie in step time goes to the lowest.

    ZeRO-N adds N, FSDP2 3, TP or PP 4 (both 5), each CPU offload 2, activation checkpointing 1.
    """
    strategy, par, zero = StrategyName(cfg.strategy), cfg.parallel, cfg.zero
    score = {StrategyName.DDP: 0, StrategyName.ZERO: zero.stage, StrategyName.FSDP: 3}.get(strategy, 0)
    if strategy in (StrategyName.TP, StrategyName.PP, StrategyName.MIXED):
        score = max(4, 3 + (par.tp > 1) + (par.pp > 1))
    if strategy == StrategyName.ZERO:
        score += 2 * zero.offload_optimizer + 2 * zero.offload_param + zero.activation_checkpointing
    else:
        score += 2 * par.fsdp_cpu_offload + par.activation_checkpointing
    return score


def rank_choices(choices: list[Choice]) -> list[Choice]:
    """Fitting first, fastest first; the ties with the fastest (:data:`STEP_TIE`) simplest, then smallest, first."""
    ranked = sorted(choices, key=lambda ch: (not ch.fits, ch.step_s, ch.plan.peak if ch.plan else float("inf")))
    if not ranked or not ranked[0].fits:
        return ranked
    limit = ranked[0].step_s * (1 + STEP_TIE)
    tied = [ch for ch in ranked if ch.fits and ch.step_s <= limit]
    tied.sort(key=lambda ch: (layout_complexity(ch.cfg), ch.plan.peak, ch.step_s))
    for ch in tied:
        ch.tied = len(tied)
    return tied + ranked[len(tied):]


def _divisors_desc(k: int) -> list[int]:
    return sorted((d for d in range(1, k + 1) if k % d == 0), reverse=True)


def _try(cand: Candidate, base: TrainConfig, cluster: Cluster, gbatch: int, vocab_size: int | None,
         time_kw: dict[str, Any]) -> Choice:
    """The largest micro-batch of ``cand`` that fits, with the accumulation that keeps ``gbatch``."""
    cfg = cand.config(base)
    cfg.global_batch_size = 0
    shape = model_shape(cfg.model, vocab_size)
    try:
        _, dp, _, pp = plan_degrees(cfg, cluster.gpus)
    except ConfigError as exc:
        return Choice(cand, reason=f"not allowed: {exc}")
    if gbatch % dp:
        return Choice(cand, reason=f"global batch {gbatch} is not a multiple of its {dp} data-parallel replicas")
    per_replica = gbatch // dp
    if pp > 1:   # one sequence per pipeline micro-batch: the smallest bubble, (pp-1)/(m+pp-1), and activations
        if per_replica < pp:
            return Choice(cand, reason=f"{per_replica} samples per replica are fewer than its {pp} pipeline stages")
        cfg.parallel.pp_microbatches = per_replica

    def attempt(m: int) -> tuple[TrainConfig, MemoryPlan]:
        c = copy.deepcopy(cfg)
        c.micro_batch_size, c.grad_accum = m, per_replica // m
        return c, plan_job(c, cluster, vocab_size, shape)

    sizes = _divisors_desc(per_replica)
    try:
        smallest_cfg, smallest = attempt(sizes[-1])
    except ConfigError as exc:
        return Choice(cand, reason=f"not allowed: {exc}")
    if not smallest.fits:
        return Choice(cand, smallest_cfg, smallest, reason=f"does not fit: {smallest.peak / GIB:.1f} GiB at "
                                                           f"micro-batch {sizes[-1]} > {smallest.gpu.name}")
    lo, hi = len(sizes) - 1, 0          # sizes[lo] fits; find the smallest index (largest size) that fits
    best_cfg, best = smallest_cfg, smallest
    while hi < lo:
        mid = (hi + lo) // 2
        c, p = attempt(sizes[mid])
        if p.fits:
            lo, best_cfg, best = mid, c, p
        else:
            hi = mid + 1
    if sizes[lo] != best_cfg.micro_batch_size:
        best_cfg, best = attempt(sizes[lo])
    return Choice(cand, best_cfg, best, predict_step_time(best.inputs, shape=shape, **time_kw))


def recommend(base: TrainConfig, cluster: Cluster, vocab_size: int | None = None,
              time_kw: dict[str, Any] | None = None, groups: bool = True) -> dict[str, list[Choice]]:
    """{group: choices ranked fastest first (fitting ones first)} for the job ``base`` on ``cluster``."""
    time_kw = {**cluster.time_links(), **(time_kw or {})}
    base = dataclasses.replace(base, precision=planned_precision(base.precision, cluster))   # auto: as a run would
    shape = model_shape(base.model, vocab_size)
    gbatch = global_batch(base, cluster)
    out = {FULL: [_try(c, base, cluster, gbatch, vocab_size, time_kw) for c in full_candidates(cluster, shape)]}
    for name, make in (EXTRA_GROUPS.items() if groups else ()):
        out[name] = [_try(c, base, cluster, gbatch, vocab_size, time_kw) for c in make(cluster, shape)]
    return {name: rank_choices(choices) for name, choices in out.items()}


def best_choice(ranked: dict[str, list[Choice]], group: str = FULL) -> Choice | None:
    top = ranked[group][0] if ranked.get(group) else None
    return top if top is not None and top.fits else None


def why_lost(choice: Choice, best: Choice | None) -> str:
    if not choice.fits:
        return choice.reason or "does not fit"
    if best is None or choice is best:
        if choice.tied > 1:
            return (f"chosen: the simplest, then smallest, of the {choice.tied} within {STEP_TIE:.0%} of the "
                    "fastest step (a tie)")
        return "fastest"
    if choice.tied > 1:
        simpler = layout_complexity(best.cfg) < layout_complexity(choice.cfg)
        return (f"a tie (within {STEP_TIE:.0%} of the fastest step): {best.candidate.label} is "
                + ("simpler" if simpler else f"smaller ({best.plan.peak / GIB:.1f} GiB peak)"))
    slower = choice.step_s / best.step_s - 1
    return f"slower by {slower:.0%} (+{choice.step_s - best.step_s:.2f} s per global batch)"


def what_would_fit(base: TrainConfig, cluster: Cluster, vocab_size: int | None = None,
                   time_kw: dict[str, Any] | None = None) -> list[str]:
    """When nothing fits: the smallest change of each kind that makes something fit (each one re-planned).

    A GPU without the job's precision refuses every candidate, so that is named first and the rest planned at one it
    has.
    """
    tips = []

    def fastest(cfg: TrainConfig, cl: Cluster) -> Choice | None:
        return best_choice(recommend(cfg, cl, vocab_size, time_kw, groups=False))

    spec = gpu_spec(cluster.gpu)
    base = dataclasses.replace(base, precision=planned_precision(base.precision, cluster))
    if not spec.supports(base.precision):
        wanted, base = base.precision, copy.deepcopy(base)
        base.precision = next(p for p in ("fp16", "bf16", "fp32") if spec.supports(p))
        found = fastest(base, cluster)
        tips.append(f"the precision, not the memory: the {spec.name} has no {wanted} support (no {wanted} tensor "
                    f"cores), so no setup can run at --precision {wanted}; with --precision {base.precision} "
                    + (f"{found.candidate.label} fits" if found else "nothing fits either; for that precision:"))
        if found:
            return tips
    gbatch = global_batch(base, cluster)
    for n in (2 * cluster.gpus, 4 * cluster.gpus, 8 * cluster.gpus):
        if gbatch % n == 0:
            bigger = replace(cluster, gpus=n, nodes=max(1, n // max(cluster.gpus_per_node, 8)) if n > 8 else 1)
            found = fastest(base, bigger)
            if found:
                tips.append(f"more GPUs: {n} × {cluster.gpu} fit with {found.candidate.label}")
                break
    for key, other in sorted(GPUS.items(), key=lambda kv: kv[1].memory_bytes):
        if other.memory_bytes > spec.memory_bytes and other.supports(base.precision):
            try:
                found = fastest(base, replace(cluster, gpu=key))
            except ConfigError:
                continue
            if found:
                tips.append(f"a bigger GPU: {cluster.gpus} × {other.name} ({other.memory_bytes / GIB:.0f} GiB) fit "
                            f"with {found.candidate.label}")
                break
    seq = planned_seq_len(base)[0] // 2
    while seq >= 32:
        shorter = copy.deepcopy(base)
        shorter.seq_len = seq
        found = fastest(shorter, cluster)
        if found:
            tips.append(f"a shorter sequence: --seq-len {seq} fits with {found.candidate.label}")
            break
        seq //= 2
    ranked = recommend(base, cluster, vocab_size, time_kw) if LORA in EXTRA_GROUPS else {}
    lora = best_choice(ranked, LORA) if ranked else None
    if lora is not None:
        tips.append(f"training fewer parameters: LoRA (r={lora.cfg.lora_r}) fits with {lora.candidate.label} "
                    "(its own table above; it trains adapters, not the model)")
    elif ranked.get(LORA):
        why = ranked[LORA][0].reason or "does not fit"
        tips.append(f"LoRA (adapters on a frozen base) does not help: {why}")
    return tips or ["nothing the planner searches fits; plan a smaller model"]


def mostly(plan: MemoryPlan) -> str:
    """A few words on what holds the peak, when one part holds most of it ("logits 62%"), else ""."""
    part = plan.dominant_part()
    if part is None:
        return ""
    name, share = part
    return name if name == "the loading copy" else f"{name} {share:.0%}"


def choice_row(choice: Choice, best: Choice | None, cluster: Cluster, given: set[str]) -> dict[str, Any]:
    """One table/JSON row for a choice."""
    row: dict[str, Any] = {"candidate": choice.candidate.label, "group": choice.candidate.group,
                           "fits": choice.fits, "why": why_lost(choice, best)}
    if choice.plan is not None and choice.cfg is not None:
        plan = choice.plan
        row.update({"micro_batch": choice.cfg.micro_batch_size, "grad_accum": choice.cfg.grad_accum,
                    "train_bytes": plan.total, "load_bytes": plan.load_bytes, "peak_bytes": plan.peak,
                    "gpu_bytes": plan.gpu.memory_bytes, "headroom_bytes": plan.headroom,
                    "cpu_bytes": plan.cpu_bytes, "memory_parts": plan.parts(), "mostly": mostly(plan)})
    if choice.fits and choice.step is not None and choice.cfg is not None:
        samples = choice.cfg.micro_batch_size * choice.cfg.grad_accum * plan.inputs.dp
        row.update({"step_s": choice.step.total_s,
                    "tokens_per_s_per_gpu": samples * planned_seq_len(choice.cfg)[0] / choice.step.total_s / cluster.gpus,
                    "launch": launch_line(choice.cfg, cluster, given), "config": choice.cfg.to_dict()})
    return row


__all__ = ["Choice", "EXTRA_GROUPS", "GROUP_NOTES", "STEP_TIE", "layout_complexity", "rank_choices", "global_batch", "recommend", "best_choice", "why_lost", "what_would_fit",
           "choice_row", "mostly"]
