"""The planner next to other estimators and next to the guides' claims (chapter 06).

- :func:`estimator_comparison`: per-GPU model-state bytes from the planner,
  from DeepSpeed's own ``estimate_zero{2,3}_model_states_mem_needs`` (through
  ``ecomkit.planner.zero_formulas.deepspeed_estimates``) and from ``accelerate
  estimate-memory`` (its functions on a meta model: the command itself needs
  the hub), for SeqGPT-560M and EcomGPT-7B, with why they differ.
- :func:`speedup_claims`: the time model's speed-ups for the guides' setups
  beside the numbers the guides report, with a band over the assumptions
  (efficiency, overlap, CPU-Adam speed) and a verdict computed from it.
- :func:`oom_recipes`: the SeqGPT guide's three "CUDA out of memory" fixes,
  checked against the planner, and :func:`oom_recipe_summary`, the verdicts
  drawn from them.

Rows carry fields (``model``, ``seq_len``, ``activation_checkpointing``, ...),
not only labels: a notebook selects and plots by field, it never parses a label.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any, Sequence

from ecomkit.hardware import GIB, gpu_spec
from ecomkit.planner.links import link_spec
from ecomkit.models.bloom import build_model
from ecomkit.planner.memory import PlanInput, max_micro_batch, plan_memory, state_bytes_of_rank
from ecomkit.planner.shapes import local_params, model_shape
from ecomkit.planner.step_time import (COLLECTIVE_TIME, GPUS_PER_NODE, ZERO12_GRAD_COLLECTIVE, predict_step_time,
                                       speedups)
from ecomkit.planner.zero_formulas import deepspeed_estimates


# ---------------------------------------------------------------------- other estimators
def accelerate_estimate(model: str) -> dict[str, Any]:
    """What ``accelerate estimate-memory`` prints, computed from its own functions on our meta model.

    ``accelerate estimate-memory`` downloads the config from the hub and calls
    ``calculate_maximum_sizes`` and ``estimate_training_usage``; offline we
    build the same meta model ourselves and call those two functions.
    Its "Training using Adam" column is the *largest* of its model / gradient /
    optimizer / step terms, not their sum.
    """
    from accelerate.commands.estimate import estimate_training_usage  # lazy: optional, heavy (accelerate)
    from accelerate.utils import calculate_maximum_sizes  # lazy: as above

    meta = build_model(model, device="meta")
    total, largest = calculate_maximum_sizes(meta)
    out = {"total_size_fp32": total, "largest_layer": largest[0]}
    for dtype in ("float32", "bfloat16"):
        usage = estimate_training_usage(total, dtype)
        out[f"training_{dtype}"] = max(usage.values())
        out[f"terms_{dtype}"] = usage
    return out


def estimator_comparison(models: Sequence[str] = ("seqgpt-560m", "ecomgpt-7b"), gpus: int = 8,
                         precision: str = "bf16") -> list[dict[str, Any]]:
    """Per-GPU (and CPU) model-state bytes: planner vs DeepSpeed's estimators vs accelerate, one row per setup."""
    rows = []
    setups = [("zero2", False, False), ("zero2", True, False), ("zero3", False, False), ("zero3", True, False),
              ("zero3", True, True)]
    for name in models:
        shape = model_shape(name)
        ds = deepspeed_estimates(shape.n_params, shape.largest_leaf, gpus)
        acc = accelerate_estimate(name)
        for strategy, off_opt, off_param in setups:
            inp = PlanInput(model=name, world_size=gpus, strategy=strategy, precision=precision,
                            offload_optimizer=off_opt, offload_param=off_param).resolved()
            mine = state_bytes_of_rank(inp, local_params(shape), 0)
            key = strategy + ("+offload_opt" if off_opt else "") + ("+offload_param" if off_param else "")
            rows.append({"model": name, "psi": shape.n_params, "gpus": gpus, "setup": key,
                         "planner_gpu": mine["params"] + mine["grads"] + mine["optimizer"],
                         "planner_cpu": mine["cpu"], "deepspeed_gpu": ds[key]["gpu"], "deepspeed_cpu": ds[key]["cpu"],
                         "accelerate_fp32_unsharded": acc["training_float32"],
                         "accelerate_bf16_unsharded": acc["training_bfloat16"]})
    return rows


ESTIMATOR_DIFFERENCES = [
    "DeepSpeed's ZeRO-2 estimator charges 2Ψ + 18Ψ/N: besides the 16-bit weights it counts a 16-bit *and* an "
    "fp32 gradient partition (2 + 4 bytes) next to the fp32 master and Adam (12 bytes). The planner counts what the "
    "ZeRO-2 optimizer in this DeepSpeed version holds at the step, as measured in the tests: 16-bit weights, "
    "16-bit gradients of the rank's parameters (whole parameters at partition boundaries) and 12 bytes per "
    "partitioned element; fp32 gradients only exist on the CPU with offload.",
    "DeepSpeed's ZeRO-3 estimator adds 4 × the largest layer (its gathered 16-bit weights and gradients); for "
    "BLOOM the largest 'layer' is the 250,880 × h embedding (1.03 B parameters in EcomGPT-7B, 4.1 GB). The planner "
    "puts the gathered layers under temporary buffers, not model states.",
    "With offload DeepSpeed multiplies host memory by additional_buffer_factor = 1.5 (pinned staging buffers) and "
    "sizes it for all GPUs of the node; the planner shows one rank's offloaded bytes without that factor.",
    "accelerate estimate-memory knows nothing of sharding or activations, and its 'Training using Adam' column is "
    "the largest of its terms, not their sum: 16Ψ in fp32 but only 8Ψ (the optimizer term) in bf16, while "
    "mixed-precision Adam really holds 16Ψ (fp32 master + grads + two moments) on one GPU.",
]


# ---------------------------------------------------------------------- guide speed-up claims
ECOMGPT_SETUP = PlanInput(model="ecomgpt-7b", strategy="zero2", offload_optimizer=True, precision="fp16",
                          micro_batch=4, seq_len=1024, activation_checkpointing=True, gpu="a100-40g")
SEQGPT_SETUP = PlanInput(model="seqgpt-560m", strategy="ddp", precision="fp32", micro_batch=8, seq_len=128,
                         grad_accum=2, gpu="rtx4090")

ASSUMPTION_BAND = {"efficiency": (0.3, 0.6), "overlap": (0.0, 1.0), "cpu_adam_params_per_s": (1e9, 4e9)}


def _band(inp: PlanInput, n: int, link: str) -> tuple[float, float, float]:
    """(low, central, high) predicted speed-up of n GPUs over 1 across the assumption band."""
    values = []
    for eff, ov, cpu in itertools.product(*ASSUMPTION_BAND.values()):
        row = speedups(inp, [n], link=link, efficiency=eff, overlap=ov, cpu_adam_params_per_s=cpu)[0]
        values.append(row["speedup"])
    central = speedups(inp, [n], link=link)[0]["speedup"]
    return min(values), central, max(values)


VERDICTS = ("implausible", "within the model's range", "faster than the model's range",
            "slower than the model's range")
VERDICT_REASONS = {
    "implausible": "more than N× on the same training would need each GPU to do less than 1/N of the work; "
                   "the time model never predicts it (tests/test_step_time_properties.py)",
    "within the model's range": "some efficiency, overlap and CPU-Adam speed inside the assumption band "
                                "predicts it",
    "faster than the model's range": "possible (at most N×) only with better efficiency, overlap or CPU-Adam "
                                     "speed than the band assumes, or a different baseline",
    "slower than the model's range": "the loss must come from something the model leaves out (data loading, "
                                     "stragglers, a slower CPU or host link), not from the modelled terms",
}


def speedup_verdict(claim: float, n: int, low: float, high: float) -> str:
    """One of :data:`VERDICTS` for a claimed speed-up on ``n`` GPUs, given the model's band ``[low, high]``.

    The rule is the model's own output: anything above N× is impossible for
    the time model (it never predicts it), the band is what it predicts over
    its assumptions, and outside the band the claim is faster or slower than
    any of those predictions.
    """
    if not 0 < low <= high:
        raise ValueError(f"the model's band must satisfy 0 < low <= high, got [{low}, {high}]")
    if claim > n:
        return "implausible"
    if low <= claim <= high:
        return "within the model's range"
    return "slower than the model's range" if claim < low else "faster than the model's range"


def speedup_claims() -> list[dict[str, Any]]:
    """Each guide claim, the predicted band and central value, and a verdict derived from them."""
    claims = [
        ("EcomGPT-7B, 2× A100 NVLink, ZeRO-2 + CPU offload", ECOMGPT_SETUP, 2, "nvlink-a100", 1.9),
        ("EcomGPT-7B, 4× A100 NVLink, ZeRO-2 + CPU offload", ECOMGPT_SETUP, 4, "nvlink-a100", 3.7),
        ("EcomGPT-7B, 8× A100 NVLink, ZeRO-2 + CPU offload (section 1)", ECOMGPT_SETUP, 8, "nvlink-a100", 7.2),
        ("EcomGPT-7B, 8× A100 NVLink, ZeRO-2 + CPU offload (section 5: 83.8 %)", ECOMGPT_SETUP, 8, "nvlink-a100", 6.7),
        ("EcomGPT-7B, 16× A100, 2 nodes over IB 400G (section 5: 73.5 %)", ECOMGPT_SETUP, 16, "ib-400g", 16 * 0.735),
        ("SeqGPT-560M, 4× RTX 4090 PCIe, DDP, 87 → 31 min/epoch", SEQGPT_SETUP, 4, "pcie4-x16", 87 / 31),
    ]
    rows = []
    for label, inp, n, link, claim in claims:
        low, central, high = _band(inp, n, link)
        rows.append({"claim": label, "model": inp.model, "gpus": n, "link": link,
                     "claimed_speedup": claim, "claimed_efficiency": claim / n,
                     "predicted_low": low, "predicted": central, "predicted_high": high,
                     "verdict": (v := speedup_verdict(claim, n, low, high)), "verdict_reason": VERDICT_REASONS[v]})
    return rows


def claims_for_model(rows: Sequence[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """The :func:`speedup_claims` rows about one model (by its ``model`` field)."""
    return [r for r in rows if r["model"] == model]


def single_node_scaling(rows: Sequence[dict[str, Any]], model: str = "ecomgpt-7b",
                        gpus_per_node: int = GPUS_PER_NODE) -> str:
    """"at least linear" when every predicted speed-up of ``model`` within one node reaches N, else "sub-linear"."""
    on_node = [r for r in claims_for_model(rows, model) if r["gpus"] <= gpus_per_node]
    return "at least linear" if all(r["predicted"] >= r["gpus"] for r in on_node) else "sub-linear"


def seqgpt_epoch_minutes(single_gpu_minutes: float = 87.0, gpus: int = 4) -> dict[str, Any]:
    """The SeqGPT claim in minutes: predicted epoch time on N GPUs from the claimed single-GPU time.

    Also the guide's memory figure (22.1 GB per GPU at micro-batch 8) next to
    the plan: ``memory_verdict`` says whether it is more than the planned peak
    (by over 20 %: nvidia-smi also counts the allocator's cache) or consistent with it.
    """
    low, central, high = _band(SEQGPT_SETUP, gpus, "pcie4-x16")
    plan = plan_memory(SEQGPT_SETUP)
    claimed_gib = 22.1 * 1e9 / GIB
    planned_gib = plan.total / GIB
    return {"single_gpu_minutes": single_gpu_minutes, "claimed_minutes": 31.0,
            "predicted_minutes": single_gpu_minutes / central,
            "predicted_range_minutes": (single_gpu_minutes / high, single_gpu_minutes / low),
            "planned_peak_gib_per_gpu": planned_gib, "claimed_peak_gib": claimed_gib,
            "memory_verdict": ("more than the planner's" if claimed_gib > 1.2 * planned_gib
                               else "consistent with the planner's"),
            "max_micro_batch_on_4090": max_micro_batch(SEQGPT_SETUP)}


def ecomgpt_step_breakdown(gpus: int = 8, link: str = "nvlink-a100") -> dict[str, float]:
    """Where the predicted EcomGPT-7B step (the guide's ZeRO-2 + CPU offload setup) goes on ``gpus`` GPUs.

    ``grad_sync_s`` is the 16-bit gradient reduction alone (2Ψ bytes, with
    the collective DeepSpeed's ZeRO-2 uses: :data:`ZERO12_GRAD_COLLECTIVE`),
    to compare with the CPU Adam update and its PCIe copies.
    """
    step = predict_step_time(replace(ECOMGPT_SETUP, world_size=gpus), link=link)
    grad_bytes = 2 * model_shape(ECOMGPT_SETUP.model).n_params
    return {"gpus": gpus, "step_s": step.total_s, "offload_s": step.offload_s, "compute_s": step.compute_s,
            "comm_exposed_s": step.comm_exposed_s, "grad_bytes": grad_bytes,
            "grad_sync_s": COLLECTIVE_TIME[ZERO12_GRAD_COLLECTIVE](grad_bytes, gpus, link_spec(link))}


# ---------------------------------------------------------------------- OOM recipes (SeqGPT guide, section 6.1)
def oom_recipes(gpu: str = "rtx4090", precision: str = "bf16") -> list[dict[str, Any]]:
    """Each recipe's effect on the planned per-GPU bytes of SeqGPT-560M (DDP, micro-batch 8), and the 0.3×GB rule.

    One row per setting, the baseline first. ``single_recipe`` marks the
    guide's two recipes applied alone (shorter sequences; checkpointing), and
    ``plan`` is the :class:`~ecomkit.planner.memory.MemoryPlan` of the row.
    """
    base = PlanInput(model="seqgpt-560m", strategy="ddp", precision=precision, micro_batch=8, seq_len=1024, gpu=gpu)
    rule_batch = math.floor(gpu_spec(gpu).memory_bytes / 1e9 * 0.3)
    variants = [("baseline (T=1024)", base, False),
                ("shorter sequences (T=256)", replace(base, seq_len=256), True),
                ("checkpointing (T=1024)", replace(base, activation_checkpointing=True), True),
                ("checkpointing (T=256)", replace(base, seq_len=256, activation_checkpointing=True), False),
                ("T=256 + sdpa attention", replace(base, seq_len=256, attn="sdpa"), False)]
    base_total = plan_memory(base).total
    rows = []
    for label, inp, single in variants:
        plan = plan_memory(inp)
        same_t_plain = plan_memory(inp, activation_checkpointing=False, attn="eager").total
        rows.append({"recipe": label, "seq_len": inp.seq_len, "activation_checkpointing": inp.activation_checkpointing,
                     "attn": inp.attn, "single_recipe": single, "plan": plan,
                     "total_gib": plan.total / GIB, "fits": plan.fits,
                     "saving_vs_baseline": 1 - plan.total / base_total,
                     "saving_vs_same_T_plain": 1 - plan.total / same_t_plain,
                     "max_micro_batch": max_micro_batch(inp), "rule_0.3xGB_batch": rule_batch,
                     "rule_batch_fits": plan_memory(inp, micro_batch=max(rule_batch, 1)).fits})
    return rows


def oom_recipe_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The verdicts drawn from :func:`oom_recipes` rows (selected by field, never by label).

    - ``rule_batch`` and ``max_micro_batch_by_seq_len``: the 0.3×GB rule gives
      one batch whatever T; the planner's largest micro-batch per T (plain eager rows);
    - ``checkpointing_saving``: checkpointing alone at the baseline's T, against the same T without it;
    - ``biggest_single_recipe`` / ``biggest_single_saving``: of the recipes applied alone,
      the one that saves most against the baseline.
    """
    base = rows[0]
    plain = [r for r in rows if not r["activation_checkpointing"] and r["attn"] == "eager"]
    ckpt = next(r for r in rows if r["activation_checkpointing"] and r["seq_len"] == base["seq_len"]
                and r["attn"] == "eager")
    biggest = max((r for r in rows if r["single_recipe"]), key=lambda r: r["saving_vs_baseline"])
    return {"rule_batch": base["rule_0.3xGB_batch"],
            "max_micro_batch_by_seq_len": {r["seq_len"]: r["max_micro_batch"] for r in plain},
            "checkpointing_seq_len": ckpt["seq_len"], "checkpointing_saving": ckpt["saving_vs_same_T_plain"],
            "biggest_single_recipe": biggest["recipe"], "biggest_single_saving": biggest["saving_vs_baseline"]}


__all__ = ["accelerate_estimate", "estimator_comparison", "ESTIMATOR_DIFFERENCES", "speedup_claims",
           "claims_for_model", "single_node_scaling", "speedup_verdict", "VERDICTS", "VERDICT_REASONS",
           "seqgpt_epoch_minutes", "ecomgpt_step_breakdown", "oom_recipes", "oom_recipe_summary", "ECOMGPT_SETUP",
           "SEQGPT_SETUP", "ASSUMPTION_BAND"]
