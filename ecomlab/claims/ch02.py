"""Chapter 02 (data parallel): scaling on 4 GPUs, per-GPU memory, loading, clipping, tokens."""

from __future__ import annotations

from dataclasses import replace

from tokenizers.pre_tokenizers import ByteLevel

from ecomkit.planner.links import link_spec
from ecomkit.models.bloom import preset_parameter_count
from ecomkit.models.tokenizer import ECOM_SPECIAL_TOKENS
from ecomkit.planner.memory import PlanInput
from ecomlab.claims.claim import Claim
from ecomlab.claims.evidence import Evidence
from ecomlab.claims.planner_comparisons import SEQGPT_SETUP
from ecomlab.claims.rules import memory_finding, speedup_finding
from ecomlab.claims.verdicts import Finding, agrees, at_most, holds, undefined, wrong_recipe
from ecomlab.measure.run_comparisons import CLASSIFICATION_METRICS, ClippingReport, compare_clip_policies

SEQGPT_EPOCH_MIN = (87.0, 31.0)   # SeqGPT guide, section 3.3: minutes per epoch on 1 and 4 RTX 4090


def _dp_4090(ev: Evidence) -> Finding:
    one, four = SEQGPT_EPOCH_MIN
    return speedup_finding(ev, one / four, replace(SEQGPT_SETUP, world_size=4), 4, "pcie4-x16")


def _mem_single(ev: Evidence) -> Finding:
    return memory_finding(ev, 22.1, SEQGPT_SETUP)


def _mem_ddp(ev: Evidence) -> Finding:
    return memory_finding(ev, 23.4, replace(SEQGPT_SETUP, world_size=4))


def _pcie_x8(ev: Evidence) -> Finding:
    x16 = link_spec("pcie4-x16")   # eight lanes carry half of sixteen
    x8 = replace(x16, key="pcie4-x8", name="PCIe 4.0 x8", bus_bytes_per_s=x16.bus_bytes_per_s / 2)
    return speedup_finding(ev, 2.5, replace(SEQGPT_SETUP, world_size=4), 4, x8)


def _params(ev: Evidence) -> Finding:
    psi = preset_parameter_count("seqgpt-560m")
    return agrees(560.2e6, psi, 0.05e6 / 560.2e6, source="ecomkit.models.bloom.preset_parameter_count (meta device)",
                  evidence=f"printed 560.2M; the SeqGPT-560M (BLOOM-560m) shape has {psi:,} = {psi / 1e6:.1f}M")


def _load_time(ev: Evidence) -> Finding:
    return undefined("the time is the disk's and the download's, and the guide names neither",
                     evidence="–", source="–")


def _accelerate(ev: Evidence) -> Finding:
    inp = PlanInput(model="seqgpt-560m", world_size=4, strategy="ddp", precision="fp32", micro_batch=12, seq_len=128,
                    gpu="a100-40g")
    return memory_finding(ev, 37.5, inp)


def _f1(ev: Evidence) -> Finding:
    return undefined("F1 on the guide's own NER data, with no baseline F1, seeds or split given",
                     evidence="–", source="–")


def _nvme(ev: Evidence) -> Finding:
    return undefined("the dataset size and the disks are not given, so 12 s and 1.8 s have no bytes to divide",
                     evidence="–", source="–")


def _three_details(ev: Evidence) -> Finding:
    one, four = SEQGPT_EPOCH_MIN
    ceiling = 2.5 * 1.15 * (one * 60) / (one * 60 - (12 - 1.8))   # its AMP +15 % and 10.2 s of loading per epoch
    return at_most(3.0, ceiling, source="the guide's own figures (sections 3.3 and 6.3)",
                   evidence=f"2.5× × 1.15 (AMP) × loading saved = {ceiling:.2f}×; its own table: {one / four:.2f}×",
                   bound_why="the three details' own figures multiply to less",
                   otherwise=speedup_finding(ev, 3.0, replace(SEQGPT_SETUP, world_size=4), 4, "pcie4-x16"))


def _arrow(ev: Evidence) -> Finding:
    return undefined("load_dataset already keeps Arrow files and memory-maps them; the 3× has no stated baseline "
                     "(first load with parsing, or a cached one)", evidence="–", source="ecomkit.data.loaders")


def clipping_findings(rows: list[dict] | None, source: str) -> Finding:
    """"Reviews with extreme sentiment make gradients explode; clip by sentiment": bench_clipping's seeds.

    Reproduced on CPU when sentiment-adaptive clipping is better than fixed
    clipping beyond the seed spread on any metric
    (:func:`ecomlab.measure.run_comparisons.compare_clip_policies`), refuted otherwise.
    """
    if not rows:
        return undefined("no bench_clipping artifact: run python benchmarks/bench_clipping.py", evidence="–",
                         source=source)
    fields = ClippingReport.__dataclass_fields__
    arms = {p: [ClippingReport(**{k: r[k] for k in fields}) for r in rows if r["policy"] == p]
            for p in ("fixed", "sentiment")}
    comps = [compare_clip_policies(arms["fixed"], arms["sentiment"], m) for m in (*CLASSIFICATION_METRICS, "eval_loss")]
    better = [c.metric for c in comps if "better" in c.verdict]
    return holds(bool(better), source=source + ", ecomlab.measure.run_comparisons.compare_clip_policies",
                 evidence="; ".join(f"{c.metric} Δ {c.difference:+.3f} (seed spread {c.spread:.3f})" for c in comps),
                 why_true=f"adaptive clipping is better on {', '.join(better)}",
                 why_false="no metric differs beyond the seed spread over "
                           f"{min(len(a) for a in arms.values())} seeds")


def _clipping(ev: Evidence) -> Finding:
    return clipping_findings(ev.rows("bench_clipping"), ev.where("bench_clipping"))


def _tokens(ev: Evidence) -> Finding:
    byte_entries = [t for t in ECOM_SPECIAL_TOKENS if t in set(ByteLevel.alphabet())]
    return wrong_recipe([f"in a byte-level vocabulary such as BLOOM's, {' and '.join(byte_entries)} already name "
                         "single bytes, so adding them as tokens reuses those ids and corrupts decoding"]
                        if byte_entries else [], source="tokenizers ByteLevel.alphabet(), "
                        "ecomkit.models.tokenizer.add_ecom_special_tokens", evidence=f"{len(byte_entries)} of "
                        f"{len(ECOM_SPECIAL_TOKENS)} tokens are byte-level alphabet entries",
                        why_ok="none of the tokens is a byte of the byte-level alphabet")


CLAIMS = [
    Claim("S1-01", "1, 3.3", 2, "4张RTX 4090上做数据并行……时间从原来的87分钟缩短到31分钟",
          "Data parallel on 4× RTX 4090: one epoch drops from 87 to 31 minutes.",
          "SeqGPT-560M, fp32, max_length 128, batch 8 × accumulation 2 per GPU, PCIe", _dp_4090),
    Claim("S1-02", "3.3", 2, "单卡 … 显存峰值 22.1GB", "One GPU peaks at 22.1 GB.", "SeqGPT-560M, 1× RTX 4090, batch 8",
          _mem_single),
    Claim("S1-03", "3.3", 2, "4卡数据并行 … 23.4GB/卡", "4-GPU data parallel peaks at 23.4 GB per GPU.",
          "SeqGPT-560M, 4× RTX 4090, batch 8 per GPU", _mem_ddp),
    Claim("S1-04", "1", 2, "验证集上的F1分数基本保持一致，波动在±0.3以内", "Validation F1 stays within ±0.3.",
          "SeqGPT-560M, Chinese NER, 1 vs 4 GPUs", _f1),
    Claim("S1-05", "2.1", 2, "即使老款x8通道，速度提升也能达到2.5倍以上", "Even on PCIe x8 the speed-up is above 2.5×.",
          "SeqGPT-560M, 4 GPUs, PCIe x8", _pcie_x8),
    Claim("S1-06", "2.3", 2, "# 输出应为: 模型参数量: 560.2M", "The parameter count prints as 560.2M.",
          "SeqGPT-560M from the hub", _params),
    Claim("S1-07", "2.3", 2, "这一步不占GPU资源，纯CPU操作，通常10秒内完成", "Loading on the CPU takes under 10 s.",
          "SeqGPT-560M, low_cpu_mem_usage, safetensors", _load_time),
    Claim("S1-08", "4.4", 2, "Accelerate数据并行 37.5GB 12 1.05x（原生DataParallel 38.2GB）",
          "Accelerate DDP: 37.5 GB per GPU at batch 12 and 1.05× DataParallel (38.2 GB).",
          "SeqGPT-560M, 4× A100-40G", _accelerate),
    Claim("S1-15", "6.3", 2, "数据加载时间从12秒/epoch降到1.8秒", "NVMe instead of a hard disk: loading 12 s → 1.8 s per epoch.",
          "SeqGPT-560M, 4× RTX 4090", _nvme),
    Claim("S1-16", "6.3", 2, "这三个细节让我们的实测提速从2.5倍提升到3倍", "Three details raise the speed-up from 2.5× to 3×.",
          "SeqGPT-560M, 4× RTX 4090", _three_details),
    Claim("S0-28", "6", 2, "预先将数据集转换为Arrow格式并分片存储……使数据加载速度提升3倍",
          "Converting the dataset to Arrow shards makes data loading 3× faster.", "EcomGPT-7B, 8× A100", _arrow),
    Claim("S0-32", "2.3", 2, "用户评论常含极端情感词……梯度易爆炸，需动态调整", "Extreme-sentiment reviews make gradients "
          "explode; clip by batch sentiment (0.5 + 0.5·min(s, 2)).", "EcomGPT-7B, 8× A100", _clipping),
    Claim("S0-31", "6", 2, "原始tokenizer会将其拆分为多个子词……我们扩展tokenizer：special_tokens = [\"®\", \"™\", ...]",
          "Register ®, ™, ©, SKU- … as special tokens so they are not split.", "EcomGPT-7B tokenizer (BLOOM)", _tokens),
]
