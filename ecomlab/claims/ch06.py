"""Chapter 06, speed and cost: the single-GPU baseline, the speed-up table, cost and business figures."""

from __future__ import annotations

import itertools
from dataclasses import replace

from ecomkit.planner.memory import max_micro_batch
from ecomkit.planner.step_time import predict_step_time
from ecomlab.claims.claim import Claim
from ecomlab.claims.evidence import Evidence
from ecomlab.claims.planner_comparisons import ASSUMPTION_BAND, ECOMGPT_SETUP
from ecomlab.claims.rules import TIME_MODEL, speedup_finding
from ecomlab.claims.verdicts import Finding, at_most, consistent_with, undefined

ECOMGPT_1 = replace(ECOMGPT_SETUP, world_size=1, micro_batch=1)


def step_time_band(inp=ECOMGPT_1, link: str = "nvlink-a100") -> tuple[float, float]:
    """(fastest, slowest) predicted step of ``inp`` over the time model's assumption band."""
    values = [predict_step_time(inp, link=link, efficiency=e, overlap=o, cpu_adam_params_per_s=c).total_s
              for e, o, c in itertools.product(*ASSUMPTION_BAND.values())]
    return min(values), max(values)


def _baseline(ev: Evidence) -> Finding:
    low, high = step_time_band()
    return consistent_with(45.0, low, high, source=TIME_MODEL.replace("speedups", "predict_step_time"),
                           evidence=f"claimed > 45 s per step at batch 1; predicted {low:.1f}–{high:.1f} s; "
                                    f"the plan fits micro-batch {max_micro_batch(ECOMGPT_1)} on one card",
                           gpu_measurement="gpu_bench.py scaling: ecomgpt-7b zero2 step time on 1 GPU")


def _speedup(claimed: float, n: int, link: str = "nvlink-a100"):
    def decide(ev: Evidence) -> Finding:
        return speedup_finding(ev, claimed, replace(ECOMGPT_SETUP, world_size=n), n, link)
    return decide


def _cost(ev: Evidence) -> Finding:
    cost = 7.2 * 0.149    # its price ratio × its time ratio, for the same run "to the same loss" (section 5)
    return at_most(0.58, 1 - cost, source="the guide's own figures (sections 5 and 5.3)",
                   evidence=f"7.2 × 14.9 % = {cost:.2f}× the single-GPU cost per run, trained to the same loss",
                   bound_why="the same loss means the same accuracy, so the cost per point follows the cost per run",
                   otherwise=undefined("the cost per point also needs the accuracy gains, which the guide does not "
                                       "give", evidence="–", source="–"))


def _business(ev: Evidence) -> Finding:
    return undefined("a business outcome of one platform, not a property of the training", evidence="–", source="–")


def _accuracy_batch(ev: Evidence) -> Finding:
    return undefined("the guide's accuracy table has no numbers in its text and its four tasks are not public",
                     evidence="–", source="–")


CLAIMS = [
    Claim("S0-01", "1", 6, "单卡A100训练EcomGPT-7B的batch size被限制在1，每步迭代耗时超过45秒",
          "On one A100 the batch is limited to 1 and a step takes over 45 s.",
          "EcomGPT-7B, 1× A100-40G (the guide's ZeRO-2 + offload config)", _baseline),
    Claim("S0-02", "1", 6, "2卡提速1.9倍", "2 GPUs: 1.9× faster.", "EcomGPT-7B, A100-40G NVLink, ZeRO-2 + CPU offload",
          _speedup(1.9, 2)),
    Claim("S0-03", "1", 6, "4卡提速3.7倍", "4 GPUs: 3.7× faster.", "same", _speedup(3.7, 4)),
    Claim("S0-04", "1", 6, "8卡提速7.2倍", "8 GPUs: 7.2× faster.", "same", _speedup(7.2, 8)),
    Claim("S0-05", "5.1", 6, "8卡配置达到6.7倍加速比，效率83.8%", "8 GPUs reach 6.7× (83.8 % efficiency).", "same",
          _speedup(6.7, 8)),
    Claim("S0-06", "5.1", 6, "16卡时效率下降至73.5%", "16 GPUs: efficiency falls to 73.5 %.",
          "EcomGPT-7B, 2 nodes of 8× A100, 400 Gb/s", _speedup(16 * 0.735, 16, "ib-400g")),
    Claim("S0-24", "5.2", 6, "显存释放使我们能使用更大的batch size（48 vs 8），增强了梯度估计的统计稳健性",
          "Accuracy improves because the freed memory allows batch 48 instead of 8.", "EcomGPT-7B, 4 tasks",
          _accuracy_batch),
    Claim("S0-26", "5.3", 6, "8卡实例每小时费用为单卡的7.2倍，但训练时间仅为14.9%。综合计算，单位精度提升的成本降低58%",
          "8 GPUs cost 7.2× per hour for 14.9 % of the time: cost per unit of accuracy falls 58 %.",
          "EcomGPT-7B, 8× vs 1× A100", _cost),
    Claim("S0-27", "5.3", 6, "模型迭代周期从7天缩短至1.5天……带动相关品类GMV提升23%",
          "Iteration time 7 → 1.5 days; GMV +23 %.", "an e-commerce platform", _business),
]
