"""Chapter 04 (mixed parallel): model parallelism for small cards, the mixed-parallel table, the Gaudi/Neuron recipe."""

from __future__ import annotations

import itertools

from ecomkit.models.bloom import preset_parameter_count
from ecomkit.planner.links import gpu_spec
from ecomkit.planner.memory import PlanInput
from ecomkit.planner.shapes import model_shape
from ecomkit.planner.step_time import predict_step_time
from ecomkit.planner.zero_formulas import GB, formula_bytes
from ecomlab.claims.claim import Claim
from ecomlab.claims.evidence import Evidence
from ecomlab.claims.planner_comparisons import ASSUMPTION_BAND
from ecomlab.claims.verdicts import Finding, at_most, consistent_with, holds, wrong_recipe


def _small_cards(ev: Evidence) -> Finding:
    psi = preset_parameter_count("seqgpt-560m")
    shape = model_shape("seqgpt-560m")
    states = formula_bytes(0, psi, 1, param_bytes=4, master_bytes=0)["total"] / GB
    card = gpu_spec("v100-16g").memory_bytes / GB
    return holds(states > card, on_cpu=False, source="ecomkit.planner.zero_formulas.formula_bytes, ecomkit.hardware",
                 evidence=f"all model states 16Ψ = {states:.1f} GB on a {card:.1f} GB V100; embedding "
                          f"{shape.vocab * shape.hidden / psi:.0%} of Ψ",
                 why_true="the model's states do not fit one 16 GB card",
                 why_false="the whole model, with gradients and Adam, already fits one 16 GB card: splitting off "
                           "the embedding is not what makes it fit")


def dp_overhead_bound(inp: PlanInput, link: str) -> tuple[float, dict[str, float]]:
    """The most any layout can beat data parallelism by at the same work per GPU: DP's step over its compute.

    Every layout does at least the same FLOPs per GPU; DP adds only its
    gradient all-reduce (taken here with no overlap, at each efficiency of the band).
    """
    ratios = {}
    for eff, cpu in itertools.product(ASSUMPTION_BAND["efficiency"], ASSUMPTION_BAND["cpu_adam_params_per_s"]):
        st = predict_step_time(inp, link=link, efficiency=eff, overlap=0.0, cpu_adam_params_per_s=cpu)
        ratios[f"efficiency {eff:g}"] = st.total_s / st.compute_s
    return max(ratios.values()), ratios


def _mixed_table(ev: Evidence) -> Finding:
    inp = PlanInput(model="seqgpt-560m", world_size=8, strategy="ddp", precision="bf16", micro_batch=8, seq_len=128,
                    gpu="a100-40g")
    bound, _ = dp_overhead_bound(inp, "nvlink-a100")
    return at_most(1.6, bound, source="ecomkit.planner.step_time.predict_step_time (overlap 0)",
                   evidence=f"claimed mixed 1.6× DP; DP's step is at most {bound:.2f}× its own compute",
                   bound_why="same work per GPU, and DP only adds its all-reduce",
                   otherwise=consistent_with(1.6, 0.0, bound, source="ecomkit.planner.step_time.predict_step_time",
                                             evidence=f"claimed mixed 1.6× DP; bound {bound:.2f}×",
                                             gpu_measurement="gpu_bench.py scaling: seqgpt-560m ddp vs fsdp2 and "
                                                             "tp×fsdp2 samples/s on 8 GPUs"))


def _gaudi(ev: Evidence) -> Finding:
    problems = ["optimum.habana's GaudiTrainer runs on Intel Gaudi HPUs and optimum[neuron] on AWS Trainium/"
                "Inferentia, not on the guide's NVIDIA GPUs; device_map='auto' places layers for inference, it is "
                "not tensor parallelism"]
    return wrong_recipe(problems, evidence="the packages' target devices",
                        source="optimum-habana / optimum-neuron docs",
                        why_ok="")


CLAIMS = [
    Claim("S1-10", "4.1", 4, "Embedding层参数最多……把它单独放一张卡……这样即使只有2张16GB卡，也能跑起来",
          "Put the embedding on its own card: then even two 16 GB cards can train the model (one cannot hold it).",
          "SeqGPT-560M, 2× V100-16G", _small_cards),
    Claim("S1-11", "5.3", 4, "纯数据并行 302GB 1.0x；纯模型并行 128GB 0.7x；混合并行 185GB 1.6x",
          "Data parallel 302 GB 1.0×, model parallel 128 GB 0.7×, mixed 185 GB 1.6×.",
          "SeqGPT-560M, 8× A100", _mixed_table),
    Claim("S1-12", "5.2", 4, "pip install optimum[neuron] … from optimum.habana import GaudiConfig, GaudiTrainer",
          "Enable tensor parallelism through optimum's Gaudi/Neuron trainers.", "SeqGPT-560M, NVIDIA GPUs", _gaudi),
]
