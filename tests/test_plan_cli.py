"""``python -m ecomkit.plan`` and the time model's arithmetic."""

from __future__ import annotations

import json
import re

import pytest

from ecomkit.planner.links import LINKS
from ecomkit.planner.cli import main
from ecomkit.planner.memory import PlanInput
from ecomkit.planner.shapes import model_shape
from ecomkit.planner.step_time import all_gather_s, all_reduce_s, comm_volume, predict_step_time, speedups
from ecomlab.claims.planner_comparisons import (claims_for_model, ecomgpt_step_breakdown, estimator_comparison,
                                                oom_recipe_summary, oom_recipes, seqgpt_epoch_minutes,
                                                single_node_scaling, speedup_claims, speedup_verdict)


def test_cli_prints_table_verdict_and_time(capsys):
    main(["--model", "ecomgpt-7b", "--gpus", "8", "--gpu", "a100-40g", "--zero", "2", "--offload-optimizer",
          "--precision", "bf16", "--seq-len", "128"])
    out = capsys.readouterr().out
    for words in ("A100-SXM4-40GB", "parameters", "optimizer states", "activations (attention scores)",
                  "host (CPU) memory, offloaded", "largest micro-batch that fits", "speed-up over 1 GPU"):
        assert words in out
    assert "fits" in out.splitlines()[0]
    line = next(ln for ln in out.splitlines() if ln.startswith("speed-up over 1 GPU"))
    speedup = float(re.search(r": ([0-9.]+)×", line).group(1))
    assert 1.0 <= speedup <= 8.0, line          # 8 GPUs can never be more than 8× faster on the same training
    # the job the scripts would run with --seq-len 128: micro-batch 8 × 128 tokens, sdpa, chunked loss (not for ZeRO)
    job = PlanInput(model="ecomgpt-7b", gpu="a100-40g", strategy="zero2", offload_optimizer=True, micro_batch=8,
                    seq_len=128, attn="sdpa", loss_chunk_tokens=1024)
    assert speedup == pytest.approx(speedups(job, [8])[0]["speedup"], abs=0.01)


def test_seq_len_auto_is_planned_at_the_model_limit_and_said_so(capsys):
    main(["--model", "seqgpt-560m", "--gpus", "1", "--gpu", "h200", "--precision", "bf16"])
    out = capsys.readouterr().out
    assert "micro-batch 8 × 2048 tokens" in out.splitlines()[0]
    assert "--seq-len auto: planned at 2048 tokens, the longest a run of seqgpt-560m may choose" in out


def test_cli_json(capsys):
    main(["--model", "seqgpt-560m", "--gpus", "4", "--gpu", "rtx4090", "--precision", "fp32", "--micro-batch", "8",
          "--seq-len", "128", "--link", "pcie4-x16", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["psi"] == 559_214_592 and data["fits"] is True
    assert data["max_micro_batch"] >= 8 and 1 < data["speedup"]["speedup"] <= 4


@pytest.mark.parametrize("argv, words", [(["--gpus", "0"], "at least 1 GPU"), (["--gpu", "b100"], "Unknown GPU"),
                                         (["--strategy", "tp", "--tp", "3", "--gpus", "3"], "attention heads"),
                                         (["--zero", "2", "--strategy", "fsdp2"], "disagree")])
def test_cli_user_errors_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_alpha_beta_ring_formulas():
    link = LINKS["nvlink-a100"]
    s = 1e9
    assert all_reduce_s(s, 1, link) == 0
    assert all_reduce_s(s, 8, link) == pytest.approx(14 * link.latency_s + 2 * 7 / 8 * s / link.bus_bytes_per_s)
    assert all_reduce_s(s, 8, link) == pytest.approx(2 * all_gather_s(s, 8, link))


def test_comm_volume_per_strategy():
    psi = 7_069_016_064
    inp = PlanInput(world_size=8, precision="bf16")
    assert comm_volume(PlanInput(world_size=8, strategy="ddp"), model_shape(
        "ecomgpt-7b"))["grad all-reduce (fp32)"][1] == 4 * psi
    z3 = comm_volume(PlanInput(world_size=8, strategy="zero3").resolved(),
                     model_shape("ecomgpt-7b"))
    assert sum(v[1] for v in z3.values()) == 3 * 2 * psi
    assert inp.dp == 8


def test_more_gpus_never_slow_a_step_down_more_than_comm_allows():
    inp = PlanInput(model="seqgpt-560m", strategy="ddp", precision="bf16", micro_batch=8, seq_len=512, gpu="a100-80g")
    rows = speedups(inp, [1, 2, 4, 8], link="nvlink-a100")
    assert rows[0]["speedup"] == pytest.approx(1.0)
    assert all(1 <= r["speedup"] <= r["gpus"] for r in rows[1:])
    slow = speedups(inp, [8], link="pcie4-x16", overlap=0.0)[0]["speedup"]
    assert slow < rows[-1]["speedup"]
    st = predict_step_time(inp, efficiency=0.5)
    assert st.total_s == pytest.approx(st.compute_s + st.comm_exposed_s + st.optimizer_s + st.offload_s)


def test_guide_claims_have_computed_verdicts():
    rows = speedup_claims()
    assert len(rows) == 6
    for r in rows:
        assert r["predicted_low"] <= r["predicted"] <= r["predicted_high"] <= r["gpus"]
        assert r["verdict"] == speedup_verdict(r["claimed_speedup"], r["gpus"], r["predicted_low"],
                                               r["predicted_high"])
    verdicts = {(r["model"], r["gpus"], r["claimed_speedup"]): r["verdict"] for r in rows}
    # ZeRO-2 + CPU offload of 7B: the node's CPUs run Adam on all 7 B parameters every step, whatever the GPU count
    # on the node, so 1.9× / 3.7× / 7.2× on 2 / 4 / 8 GPUs is faster than any assumption in the band allows
    assert verdicts[("ecomgpt-7b", 2, 1.9)] == "faster than the model's range"
    assert verdicts[("ecomgpt-7b", 4, 3.7)] == "faster than the model's range"
    assert verdicts[("ecomgpt-7b", 8, 7.2)] == "faster than the model's range"
    assert verdicts[("seqgpt-560m", 4, 87 / 31)] == "within the model's range"
    assert not any(v == "implausible" for v in verdicts.values())       # no claim above N
    est = {(r["model"], r["setup"]): r for r in estimator_comparison()}
    # with optimizer offload both the planner and DeepSpeed keep exactly the 16-bit weights (2Ψ) on the GPU
    r = est[("ecomgpt-7b", "zero2+offload_opt")]
    assert r["planner_gpu"] == r["deepspeed_gpu"] == 2 * r["psi"]


def test_claims_are_selected_by_their_model_field():
    rows = speedup_claims()
    seqgpt = claims_for_model(rows, "seqgpt-560m")
    assert len(seqgpt) == 1 and seqgpt[0]["gpus"] == 4 and seqgpt[0]["link"] == "pcie4-x16"
    assert len(claims_for_model(rows, "ecomgpt-7b")) == 5
    fake = [{"model": "m", "gpus": 2, "predicted": 2.1}, {"model": "m", "gpus": 16, "predicted": 9.0}]
    assert single_node_scaling(fake, "m") == "at least linear"          # 16 GPUs span two nodes: not counted
    assert single_node_scaling(fake + [{"model": "m", "gpus": 8, "predicted": 7.0}], "m") == "sub-linear"


def test_seqgpt_memory_verdict_and_ecomgpt_step_breakdown():
    ep = seqgpt_epoch_minutes()
    expected = ("more than the planner's" if ep["claimed_peak_gib"] > 1.2 * ep["planned_peak_gib_per_gpu"]
                else "consistent with the planner's")
    assert ep["memory_verdict"] == expected
    st = ecomgpt_step_breakdown(gpus=8)
    assert st["grad_bytes"] == 2 * model_shape("ecomgpt-7b").n_params
    assert 0 < st["grad_sync_s"] and st["offload_s"] > st["compute_s"] > 0
    assert st["step_s"] == pytest.approx(st["compute_s"] + st["comm_exposed_s"] + st["offload_s"], rel=0.01)


def test_oom_recipes_carry_fields_and_their_summary_is_computed_from_them():
    rows = oom_recipes()
    assert rows[0]["seq_len"] == 1024 and not rows[0]["activation_checkpointing"] and rows[0]["attn"] == "eager"
    assert [r["recipe"] for r in rows if r["single_recipe"]] == ["shorter sequences (T=256)", "checkpointing (T=1024)"]
    for r in rows:
        assert r["plan"].inputs.seq_len == r["seq_len"] and r["plan"].inputs.attn == r["attn"]
        assert r["plan"].total / 2**30 == pytest.approx(r["total_gib"])
    summary = oom_recipe_summary(rows)
    assert summary["rule_batch"] == 7                                  # floor(24 GB × 0.3): the guide's "7"
    assert set(summary["max_micro_batch_by_seq_len"]) == {1024, 256}
    assert summary["max_micro_batch_by_seq_len"][256] > summary["max_micro_batch_by_seq_len"][1024]
    assert summary["checkpointing_seq_len"] == 1024 and 0 < summary["checkpointing_saving"] < 1
    assert summary["biggest_single_recipe"] in ("shorter sequences (T=256)", "checkpointing (T=1024)")
