"""Properties the time model must have whatever its inputs (pure arithmetic, a few seconds).

Over a grid of models × GPUs × links × strategies (offload included) × N in
1..64 × gradient accumulation 1..8:

- N GPUs are never predicted more than N× faster than one GPU on the same training (parameter offload
  excepted, for a physical reason: see its own test);
- a step never gets slower when the link (or the host link) gets faster;
- a step never gets slower when the efficiency rises.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from ecomkit.errors import ConfigError
from ecomkit.planner.links import LINKS, LinkSpec
from ecomkit.planner.memory import PlanInput
from ecomkit.planner.shapes import model_shape
from ecomkit.planner.step_time import comm_volume, hidden_exposed, last_bucket, predict_step_time, speedups
from ecomlab.claims.planner_comparisons import ASSUMPTION_BAND, ECOMGPT_SETUP, speedup_verdict

MODELS = ("small", "seqgpt-560m", "ecomgpt-7b")
GPUS = (("a100-40g", "bf16"), ("rtx4090", "fp32"), ("v100-32g", "fp16"), ("h100-80g", "bf16"))
LINK_KEYS = ("pcie4-x16", "nvlink-a100", "ib-400g")
STRATEGIES = {"ddp": {}, "zero1": {}, "zero2": {}, "zero2+offload": {"strategy": "zero2", "offload_optimizer": True},
              "zero1+offload": {"strategy": "zero1", "offload_optimizer": True}, "zero3": {},
              "zero3+offload": {"strategy": "zero3", "offload_optimizer": True, "offload_param": True},
              "fsdp2": {}, "fsdp2+offload": {"strategy": "fsdp2", "offload_param": True}}
GPU_COUNTS = (1, 2, 3, 8, 16, 64)
ACCUMULATION = (1, 2, 8)


def _setups():
    """(model, gpu, precision, link, strategy label, PlanInput): every model and strategy, GPUs and links rotated."""
    for i, (model, label) in enumerate(itertools.product(MODELS, STRATEGIES)):
        gpu, precision = GPUS[i % len(GPUS)]
        link = LINK_KEYS[i % len(LINK_KEYS)]
        kw = STRATEGIES[label] or {"strategy": label}
        yield model, gpu, precision, link, label, PlanInput(model=model, gpu=gpu, precision=precision, micro_batch=2,
                                                            seq_len=256, **kw)


SHAPES = {m: model_shape(m) for m in MODELS}


def _faster(link: LinkSpec, factor: float = 2.0) -> LinkSpec:
    return replace(link, key=link.key + "-faster", bus_bytes_per_s=link.bus_bytes_per_s * factor,
                   latency_s=link.latency_s / factor)


@pytest.mark.parametrize("model, gpu, precision, link, label, inp", list(_setups()),
                         ids=[f"{s[0]}-{s[4]}-{s[1]}-{s[3]}" for s in _setups()])
def test_speedup_never_exceeds_n_and_faster_links_or_efficiency_never_slow_a_step(model, gpu, precision, link,
                                                                                   label, inp):
    shape = SHAPES[model]
    for acc in ACCUMULATION:
        run = replace(inp, grad_accum=acc)
        rows = speedups(run, list(GPU_COUNTS), link=link, shape=shape)
        for r in rows:
            if not inp.offload_param:   # parameter offload: see test_parameter_offload_can_scale_super_linearly
                assert r["speedup"] <= r["gpus"] * (1 + 1e-9), (label, acc, r)
            assert r["speedup"] > 0
        for n in GPU_COUNTS:
            setup = replace(run, world_size=n)
            base = predict_step_time(setup, link=link, shape=shape).total_s
            fast_link = predict_step_time(setup, link=_faster(LINKS[link]), shape=shape).total_s
            fast_host = predict_step_time(setup, link=link, host_link=_faster(LINKS["pcie4-x16"]), shape=shape).total_s
            assert fast_link <= base * (1 + 1e-12) and fast_host <= base * (1 + 1e-12), (label, acc, n)
            times = [predict_step_time(setup, link=link, efficiency=e, overlap=ov, shape=shape).total_s
                     for ov in (0.0, 0.5, 1.0) for e in (0.2, 0.45, 0.9)]
            for lo, hi in zip(times[0::3] + times[1::3], times[1::3] + times[2::3]):
                assert hi <= lo * (1 + 1e-12), (label, acc, n, times)


def test_exposed_communication_is_monotone_in_its_windows_and_times():
    """The overlap rule alone: more window never exposes more, more communication never exposes less."""
    base = {"forward": 0.1, "backward": 0.3, "backward_last": 0.2, "exposed": 0.05}
    e0 = hidden_exposed(base, 0.1, 0.4, 0.1, 0.9, floor_s=0.01)
    assert hidden_exposed(base, 0.1, 0.8, 0.2, 0.9, floor_s=0.01) <= e0
    for key in base:
        assert hidden_exposed({**base, key: base[key] * 2}, 0.1, 0.4, 0.1, 0.9, floor_s=0.01) >= e0
    # a once-per-step reduction fits only in the last micro-step's backward, not in all of them
    assert hidden_exposed({"backward_last": 0.2}, 0, 0.4, 0.1, 1.0) == pytest.approx(0.1)
    assert hidden_exposed({"backward": 0.2}, 0, 0.4, 0.1, 1.0) == pytest.approx(0.0)


def test_accumulation_hides_a_no_sync_all_reduce_behind_the_last_micro_step_only():
    """SeqGPT-560M on 4 × RTX 4090, fp32, accumulation 2: the DDP all-reduce overlaps one backward, not two."""
    inp = PlanInput(model="seqgpt-560m", strategy="ddp", precision="fp32", micro_batch=8, seq_len=128, grad_accum=2,
                    gpu="rtx4090", world_size=4)
    st = predict_step_time(inp, link="pcie4-x16", overlap=0.9)
    assert st.comm_exposed_s == pytest.approx(st.comm_s - 0.9 * st.backward_s / 2)
    assert 0.10 < st.comm_exposed_s < 0.12


def test_bf16_on_v100_is_an_error_in_the_time_model_too():
    with pytest.raises(ConfigError, match="no bf16 tensor cores"):
        predict_step_time(PlanInput(model="seqgpt-560m", gpu="v100-32g", precision="bf16"))


def test_the_last_bucket_uses_the_strategys_collective():
    """DDP and DeepSpeed's ZeRO-1/2 (bucket all-reduce by default) all-reduce their last bucket; ZeRO-3 and FSDP2
    reduce-scatter it, which costs half as much."""
    shape = SHAPES["seqgpt-560m"]
    for s, kind in (("ddp", "all_reduce"), ("zero1", "all_reduce"), ("zero2", "all_reduce"),
                    ("zero3", "reduce_scatter"), ("fsdp2", "reduce_scatter")):
        assert last_bucket(PlanInput(model="seqgpt-560m", strategy=s, world_size=8), shape, 25 * 2**20)[0] == kind


def test_zero2_gradients_cost_an_all_reduce_like_ddp_in_16_bit():
    """DeepSpeed's default ZeRO-2 all-reduces each gradient bucket: 2Ψ bytes in bf16, half DDP's 4Ψ in fp32."""
    inp = PlanInput(model="seqgpt-560m", strategy="zero2", world_size=4, precision="bf16")
    shape = SHAPES["seqgpt-560m"]
    kind, nbytes, _ = comm_volume(inp, shape)["grad all-reduce"]
    assert (kind, nbytes) == ("all_reduce", 2 * shape.n_params)
    ddp_kind, ddp_bytes, _ = comm_volume(replace(inp, strategy="ddp"), shape)["grad all-reduce (fp32)"]
    assert ddp_kind == kind and ddp_bytes == 2 * nbytes


def test_offload_charges_the_node_cpu_and_shared_host_links():
    """ZeRO-2 + offload, EcomGPT-7B: CPU Adam per node does not shrink with GPUs on one node, only across nodes."""
    inp = replace(ECOMGPT_SETUP, grad_accum=1)
    cpu = {n: predict_step_time(replace(inp, world_size=n)).parts["offload: CPU Adam (node)"] for n in (1, 2, 8, 16)}
    assert cpu[1] == pytest.approx(cpu[2]) == pytest.approx(cpu[8])
    assert cpu[16] == pytest.approx(cpu[8] / 2)
    copy = {n: predict_step_time(replace(inp, world_size=n)).parts["offload: gradient copy to host"] for n in (1, 2, 8)}
    assert copy[2] == pytest.approx(copy[1])          # two GPUs behind one PCIe switch share its uplink (DGX A100)
    assert copy[8] == pytest.approx(copy[1] / 4)      # eight GPUs use all four uplinks
    h100 = predict_step_time(replace(inp, world_size=2, gpu="h100-80g")).parts["offload: gradient copy to host"]
    assert h100 < copy[2]                             # DGX H100: one GPU per (faster) host link


def test_the_verdict_agrees_with_the_model_and_flips_with_the_evidence():
    assert speedup_verdict(8.5, 8, 3.0, 7.9) == "implausible"
    assert speedup_verdict(7.95, 8, 3.0, 7.9) == "faster than the model's range"
    assert speedup_verdict(5.0, 8, 3.0, 7.9) == "within the model's range"
    assert speedup_verdict(2.0, 8, 3.0, 7.9) == "slower than the model's range"
    assert speedup_verdict(3.0, 8, 3.0, 7.9) == speedup_verdict(7.9, 8, 3.0, 7.9) == "within the model's range"
    with pytest.raises(ValueError):
        speedup_verdict(2.0, 8, 5.0, 4.0)
    # the evidence: how fast the node's CPUs run Adam. A claimed 3.2x on 4 GPUs is faster than the model allows with
    # the assumed 1-4e9 parameters/s, and inside its range for a node ten times faster.
    band = ASSUMPTION_BAND["cpu_adam_params_per_s"]
    slow = [speedups(ECOMGPT_SETUP, [4], cpu_adam_params_per_s=c)[0]["speedup"] for c in band]
    fast = [speedups(ECOMGPT_SETUP, [4], cpu_adam_params_per_s=10 * c)[0]["speedup"] for c in band]
    assert speedup_verdict(3.2, 4, min(slow), max(slow)) == "faster than the model's range"
    assert speedup_verdict(3.2, 4, min(fast), max(fast)) == "within the model's range"


def test_parameter_offload_can_scale_super_linearly_and_only_through_the_host_links():
    """With parameters in host memory every micro-step fetches them over PCIe. One GPU fetches all of them through
    one link; N GPUs fetch 1/N each through their own links and gather the rest over NVLink, so the host-link term
    shrinks faster than 1/N (ZeRO-Infinity reports super-linear scaling for this reason). Make the host link
    infinitely fast and the bound N holds again."""
    inp = PlanInput(model="seqgpt-560m", strategy="zero3", offload_optimizer=True, offload_param=True, micro_batch=2,
                    seq_len=256, grad_accum=4, gpu="a100-40g")
    fast_host = replace(LINKS["pcie4-x16"], bus_bytes_per_s=1e30, latency_s=0.0)
    for n, slow, fast in zip(GPU_COUNTS, speedups(inp, list(GPU_COUNTS)),
                             speedups(inp, list(GPU_COUNTS), host_link=fast_host, cpu_adam_params_per_s=1e30)):
        assert fast["speedup"] <= n * (1 + 1e-9)
    assert any(r["speedup"] > r["gpus"] for r in speedups(inp, list(GPU_COUNTS)))
