"""The rules behind the ledger's recurring kinds of claim: speed-up, memory, padding, mixed precision, Top-K.

Each takes its evidence as arguments (an :class:`~ecomlab.claims.evidence.Evidence`,
artifact rows, planner inputs) and returns a :class:`~ecomlab.claims.verdicts.Finding`,
so tests can feed them other numbers and see the verdict change.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Sequence

from ecomkit.hardware import gpu_spec
from ecomkit.planner.links import LinkSpec
from ecomkit.planner.memory import PlanInput, plan_memory
from ecomkit.planner.step_time import speedups
from ecomlab.claims.evidence import Evidence, gpu_speedup, gpu_value
from ecomlab.claims.planner_comparisons import ASSUMPTION_BAND
from ecomlab.claims.verdicts import Finding, agrees, at_most, consistent_with, holds, model_band, undefined
from ecomlab.measure.compression import expected_byte_ratio

SPEEDUP_TOLERANCE = 0.10   # a measured speed-up within 10 % of the claim reproduces it
MEMORY_TOLERANCE = 0.20    # a plan is within 20 % of what nvidia-smi shows (allocator cache, CUDA context, workspace)
AMP_SAVING_TOLERANCE = 0.05   # a measured memory saving within 5 points of the claim reproduces it
PLANNER = "ecomkit.planner"
TIME_MODEL = "ecomkit.planner.step_time.speedups over planner.comparisons.ASSUMPTION_BAND"


def speedup_band(inp: PlanInput, n: int, link: str | LinkSpec) -> tuple[float, float, float]:
    """(low, central, high) speed-up of ``n`` GPUs over 1 predicted by the time model over its assumption band."""
    values = [speedups(inp, [n], link=link, efficiency=e, overlap=o, cpu_adam_params_per_s=c)[0]["speedup"]
              for e, o, c in itertools.product(*ASSUMPTION_BAND.values())]
    return min(values), speedups(inp, [n], link=link)[0]["speedup"], max(values)


def speedup_finding(ev: Evidence, claimed: float, inp: PlanInput, n: int, link: str | LinkSpec) -> Finding:
    """A claimed speed-up on ``n`` GPUs: the GPU report decides when it has the setup, else the time model's band."""
    board = gpu_spec(inp.gpu).name
    what = f"gpu_bench.py scaling: {inp.model} {inp.strategy} samples/s on 1 and {n} {board}"
    measured = gpu_speedup(ev, inp.model, inp.strategy, n, inp.gpu)
    if measured is not None:
        return agrees(claimed, measured, SPEEDUP_TOLERANCE, source=ev.where("gpu_bench"),
                      evidence=f"claimed {claimed:.2f}×, measured {measured:.2f}× on {n} GPUs")
    low, mid, high = speedup_band(inp, n, link)
    return model_band(claimed, n, low, high, source=TIME_MODEL, gpu_measurement=what,
                      evidence=f"claimed {claimed:.2f}×, predicted {mid:.2f}× [{low:.2f}–{high:.2f}] on {n} GPUs "
                               f"({getattr(link, 'key', link)})")


def memory_finding(ev: Evidence, claimed_gb: float, inp: PlanInput) -> Finding:
    """A claimed per-GPU memory figure: a GPU measurement of the setup decides, else the plan ± MEMORY_TOLERANCE."""
    measured = gpu_value(ev, "memory", "peak_bytes", inp.gpu, model=inp.model, strategy=inp.strategy,
                         gpus=inp.world_size, micro_batch=inp.micro_batch, seq_len=inp.seq_len)
    if measured is not None:
        return agrees(claimed_gb, measured / 1e9, MEMORY_TOLERANCE, source=ev.where("gpu_bench"),
                      evidence=f"claimed {claimed_gb:g} GB, measured {measured / 1e9:.1f} GB per GPU")
    planned = plan_memory(inp).total / 1e9
    what = (f"gpu_bench.py memory: {inp.model} {inp.strategy} peak per GPU on {inp.world_size} "
            f"{gpu_spec(inp.gpu).name}, "
            f"micro-batch {inp.micro_batch} × {inp.seq_len}")
    return consistent_with(claimed_gb, planned * (1 - MEMORY_TOLERANCE), planned * (1 + MEMORY_TOLERANCE),
                           source=f"{PLANNER}.memory.plan_memory", gpu_measurement=what,
                           evidence=f"claimed {claimed_gb:g} GB, planned {planned:.1f} GB per GPU "
                                    f"(±{MEMORY_TOLERANCE:.0%}) on {gpu_spec(inp.gpu).name}")


def padding_row(rows: Sequence[dict[str, Any]], task: str = "lm", shape: str = "8 x 1 x 1") -> dict[str, Any]:
    """The bench_padding row of one task and micro-batch shape (padding %, bucketed and random)."""
    return next(r for r in rows if r["measure"] == "padding" and r["task"] == task and r["shape"] == shape)


def padding_finding(rows: Sequence[dict[str, Any]] | None, before: float, after: float, source: str) -> Finding:
    """"Bucketing cuts padding from ``before`` % to ``after`` %": bench_padding's random and bucketed batches.

    Reproduced on CPU when bucketed batches pad at most ``after`` % and random
    ones pad within a factor 2 of ``before`` % (the same kind of data).
    """
    if not rows:
        return undefined("no bench_padding artifact: run python benchmarks/bench_padding.py", evidence="–",
                         source=source)
    r = padding_row(rows)
    ok = r["bucketed %"] <= after and before / 2 <= r["random %"] <= before * 2
    return holds(ok, source=source,
                 evidence=f"random {r['random %']:.1f} % → bucketed {r['bucketed %']:.1f} % padding "
                          f"(lm, micro-batch 8; "
                          f"claimed {before:g} → {after:g} %)",
                 why_true="length bucketing cuts padding at least as far as claimed, from a similar random baseline",
                 why_false="the measured padding does not reach the claimed level or starts from another baseline")


def amp_finding(ev: Evidence, claimed_speedup: float, claimed_saving: float, inp: PlanInput) -> Finding:
    """Mixed precision "+X % speed, −Y % memory" for ``inp`` (planned in fp32 vs ``inp.precision``).

    Bounds: the speed-up is at most the GPU's 16-bit/fp32 peak ratio, and the
    memory saving at most half of everything but the fp32 model states
    (autocast keeps fp32 weights, gradients and Adam moments). Inside both,
    the GPU report's ``precision`` rows decide; without them it needs a GPU.
    """
    fp32, amp = plan_memory(replace(inp, precision="fp32")), plan_memory(inp)
    gpu = gpu_spec(inp.gpu)
    speed_bound = gpu.peak_flops(inp.precision) / gpu.peak_flops("fp32")
    saving_bound = 0.5 * (fp32.total - fp32.model_states) / fp32.total
    planned = 1 - amp.total / fp32.total
    evidence = (f"claimed {claimed_speedup:.2f}× and −{claimed_saving:.0%}; bounds {speed_bound:.1f}× "
                f"({gpu.name} peaks) and −{saving_bound:.0%}; planned −{planned:.1%}")
    otherwise = consistent_with(claimed_saving, 0, saving_bound, source=f"{PLANNER}.memory.plan_memory",
                                evidence=evidence, gpu_measurement=(f"gpu_bench.py precision: {inp.model} fp32 vs "
                                                                    f"{inp.precision} tokens/s and peak memory"))
    t = {p: gpu_value(ev, "precision", "tokens_per_s", inp.gpu, model=inp.model, precision=p)
         for p in ("fp32", inp.precision)}
    m = {p: gpu_value(ev, "precision", "peak_bytes", inp.gpu, model=inp.model, precision=p)
         for p in ("fp32", inp.precision)}
    if None not in (*t.values(), *m.values()):
        speed, saving = t[inp.precision] / t["fp32"], 1 - m[inp.precision] / m["fp32"]
        otherwise = holds(abs(speed / claimed_speedup - 1) <= SPEEDUP_TOLERANCE
                          and abs(saving - claimed_saving) <= AMP_SAVING_TOLERANCE, on_cpu=False,
                          source=ev.where("gpu_bench"), evidence=evidence + f"; measured {speed:.2f}×, −{saving:.0%}",
                          why_true="the GPU measurement agrees on both figures",
                          why_false="the GPU measurement disagrees on speed or memory")
    return at_most(claimed_speedup, speed_bound, evidence=evidence, source="ecomkit.hardware peaks",
                   bound_why="16-bit tensor-core peak over fp32 peak",
                   otherwise=at_most(claimed_saving, saving_bound, evidence=evidence, source=f"{PLANNER}.memory",
                                     bound_why="fp32 model states stay under autocast; the rest at most halves",
                                     otherwise=otherwise))


def topk_cut_finding(claimed_cut: float, k_ratio: float) -> Finding:
    """"Top-K at ``k_ratio`` cuts communication by ``claimed_cut``": what each recipe puts on the wire.

    Sparse Top-K sends a value and an index per kept entry, so it cuts at most
    ``1 − 2k`` (4-byte values and indices, ecomlab.measure.compression.expected_byte_ratio);
    the guide's code all-reduces the dense, zero-filled tensor and cuts nothing.
    """
    sparse_cut = 1 - 1 / expected_byte_ratio(f"topk:{k_ratio}")
    naive_cut = 1 - 1 / expected_byte_ratio(f"topk_naive:{k_ratio}")
    evidence = (f"claimed −{claimed_cut:.0%}; the guide's code (dense all-reduce) −{naive_cut:.0%}; sparse Top-K "
                f"{k_ratio:.0%} with indices −{sparse_cut:.0%} (chapter 05 counts these bytes per step)")
    return at_most(claimed_cut, sparse_cut, evidence=evidence, source="ecomlab.measure.compression.expected_byte_ratio",
                   bound_why="every kept value also needs its index on the wire",
                   otherwise=holds(claimed_cut <= naive_cut, evidence=evidence, on_cpu=True,
                                   source="ecomlab.measure.compression.expected_byte_ratio",
                                   why_true="the recipe's bytes allow it", why_false="the recipe moves dense bytes"))
