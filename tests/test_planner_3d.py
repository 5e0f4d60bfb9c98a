"""The planner's 3-D layout (dp × tp × pp): properties of its memory and time model, and where it recommends it.

Pure arithmetic over a grid (seconds). What each test holds is in its docstring; the measured side (a real
2 × 2 × 2 run's per-rank model states against these formulas) is in tests/test_parallel_3d.py.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from ecomkit.config import TrainConfig
from ecomkit.planner.links import LINKS
from ecomkit.models.bloom import flops_per_token
from ecomkit.parallel.pipeline import head_cost_in_blocks, stage_layer_ranges
from ecomkit.planner.candidates import FULL, launch_line
from ecomkit.planner.job import Cluster
from ecomkit.planner.memory import PlanInput, model_state_bytes_per_rank, plan_memory
from ecomkit.planner.recommend import STEP_TIE, best_choice, recommend
from ecomkit.planner.shapes import fsdp2_shard, local_params, model_shape
from ecomkit.planner.split_time import mesh_links, replica_compute_share
from ecomkit.planner.step_time import comm_volume, predict_step_time, speedups

MODELS = ("small", "seqgpt-560m", "ecomgpt-7b")
SHAPES = {m: model_shape(m) for m in MODELS}
LAYOUTS = ((2, 2), (2, 4), (4, 2), (8, 2))          # (tp, pp)
BALANCES = ("layers", "compute")


def _three_d(model: str, tp: int, pp: int, dp: int, balance: str, **kw) -> PlanInput:
    return PlanInput(model=model, strategy="tp", tp=tp, pp=pp, world_size=dp * tp * pp, precision="bf16",
                     micro_batch=2, seq_len=512, grad_accum=2, pp_microbatches=4 * pp, pp_balance=balance,
                     gpu="h100-80g", **kw)


def _stage_loads(ranges: list[tuple[int, int]], head: float) -> list[float]:
    return [hi - lo + (head if i == len(ranges) - 1 else 0.0) for i, (lo, hi) in enumerate(ranges)]


@pytest.mark.parametrize("n_layer, n_stages", [(2, 2), (5, 2), (7, 3), (30, 4), (24, 5)])
def test_stage_split_is_the_lightest_possible_and_even_without_a_head(n_layer, n_stages):
    """Over every contiguous split with a block per stage, none has a lighter most-loaded stage; with no head the
    split is the even one, earlier stages taking the extras (the split chapter 04's runs use)."""
    base, extra = divmod(n_layer, n_stages)
    assert [hi - lo for lo, hi in stage_layer_ranges(n_layer, n_stages)] == [
        base + (1 if s < extra else 0) for s in range(n_stages)]
    for head in (0.0, 0.7, 3.0, 12.5):
        got = stage_layer_ranges(n_layer, n_stages, head)
        assert got[0][0] == 0 and got[-1][1] == n_layer and all(a[1] == b[0] for a, b in zip(got, got[1:]))
        assert all(hi > lo for lo, hi in got)
        best = min(max(_stage_loads(list(zip((0, *cuts), (*cuts, n_layer))), head))
                   for cuts in itertools.combinations(range(1, n_layer), n_stages - 1))
        assert max(_stage_loads(got, head)) == pytest.approx(best)


def test_the_head_weighs_what_its_flops_say():
    """6·V·h FLOPs per token against a block's 6·params + 12·h·T, times tp (the head stays whole on a tp rank)."""
    shape = SHAPES["ecomgpt-7b"]
    one = head_cost_in_blocks(shape.vocab, shape.hidden, shape.block_params(0), 1, 1024)
    per_token = flops_per_token(shape.n_params, shape.n_layer, shape.hidden, 1024)
    head = 6.0 * shape.vocab * shape.hidden
    assert one == pytest.approx(head / ((per_token - head) / shape.n_layer), rel=1e-4)   # + the 4 LayerNorm vectors
    assert head_cost_in_blocks(shape.vocab, shape.hidden, shape.block_params(0), 2, 1024) == pytest.approx(2 * one)
    assert 4 < one < 6   # BLOOM's 250,880-token head is worth about five 7b1 blocks


@pytest.mark.parametrize("model", MODELS)
def test_a_gpu_of_a_split_replica_never_runs_less_than_its_share_and_balance_never_slows_it(model):
    """tp × pp GPUs share a replica's FLOPs: the slowest stage sets the pace, and it runs more than 1/(tp·pp) of them
    (the LM head is whole on each of its tp ranks); cutting stages by compute never leaves it more than cutting
    by block count."""
    shape = SHAPES[model]
    for (tp, pp), seq in itertools.product(LAYOUTS, (256, 2048)):
        if shape.n_head % tp or pp > shape.n_layer:
            continue
        by = {b: replica_compute_share(replace(_three_d(model, tp, pp, 1, b), seq_len=seq), shape) for b in BALANCES}
        assert 1 / (tp * pp) < by["compute"] <= by["layers"] * (1 + 1e-12) <= 1, (model, tp, pp, seq, by)


@pytest.mark.parametrize("model", MODELS)
def test_three_d_memory_holds_every_parameter_once_per_tp_slice_and_shards_it_over_dp(model):
    """Model states of a dp × tp × pp rank are 16 bytes (fp32 weight, grad, 2 Adam moments: torch's) per element of
    FSDP2's dim-0 shard of its stage's tp slice; over all ranks, every parameter is stored (the tp-replicated ones
    once per tp rank), and more dp never raises a rank's states."""
    shape = SHAPES[model]
    for (tp, pp), balance in itertools.product(LAYOUTS, BALANCES):
        if shape.n_head % tp or pp > shape.n_layer:
            continue
        stored, previous = 0, None
        for dp in (1, 2, 4):
            inp = _three_d(model, tp, pp, dp, balance)
            hb = inp.head_blocks(shape)
            rank0 = model_state_bytes_per_rank(inp, shape)[0]
            planned = rank0["params"] + rank0["grads"] + rank0["optimizer"]
            assert planned == 16 * fsdp2_shard(local_params(shape, tp, pp, 0, hb), dp, 0)
            assert previous is None or planned <= previous
            previous = planned
            if dp == 2:
                stored = sum(16 * fsdp2_shard(local_params(shape, tp, pp, s, hb), dp, r) * tp
                             for s in range(pp) for r in range(dp))
        assert stored >= 16 * shape.n_params


def test_a_pipeline_with_data_parallel_holds_its_stage_gathered_until_the_reduce_scatter():
    """torch's pipeline schedule runs FSDP2 without gradient sync until the last micro-batch: the plan's
    communication buffers are the stage's whole tp slice in the parameter dtype plus its fp32 gradients (a probe
    of a pp 2 × dp 2 run found both whole, 306,304 elements each on the tiny preset, before the reduce-scatter)."""
    shape = SHAPES["ecomgpt-7b"]
    inp = _three_d("ecomgpt-7b", 2, 2, 2, "layers")
    psi = {sum(p.numel for p in local_params(shape, 2, 2, s)) for s in range(2)}
    assert plan_memory(inp, shape).temporary["comm"] in {(2 + 4) * n for n in psi}
    assert plan_memory(replace(inp, world_size=4), shape).temporary["comm"] == 0   # dp = 1: nothing to gather


def test_groups_inside_a_node_use_its_link_and_the_others_the_link_between_nodes():
    """Ranks fill (pp, dp, tp) tp innermost: on 2 nodes of 8, tp 2 and dp 4 stay inside a node, pp crosses."""
    ib, nv = LINKS["ib-200g"], LINKS["nvlink-a100"]
    inp = _three_d("ecomgpt-7b", 2, 2, 4, "layers")
    links = mesh_links(inp, ib, nv, gpus_per_node=8)
    assert (links.tp, links.dp, links.pp) == (nv, nv, ib)
    assert mesh_links(replace(inp, pp=1, world_size=16, tp=2), ib, nv, 8).dp == ib   # dp 8 × tp 2 spans both nodes
    assert mesh_links(inp, ib).tp == ib                                              # one link given: everywhere


@pytest.mark.parametrize("model", MODELS)
def test_three_d_speedup_never_exceeds_n_and_faster_links_never_slow_it(model):
    """The data-parallel properties hold for the 3-D layout too: N GPUs never beat one GPU by more than N× on the
    same training, and a faster link (between nodes or inside them) never slows a step."""
    shape = SHAPES[model]
    for (tp, pp), balance, link in itertools.product(LAYOUTS, BALANCES, ("nvlink-h100", "ib-200g")):
        if shape.n_head % tp or pp > shape.n_layer:
            continue
        inp = _three_d(model, tp, pp, 2, balance)
        for row in speedups(inp, [tp * pp, 2 * tp * pp, 8 * tp * pp], link=link, shape=shape):
            assert 0 < row["speedup"] <= row["gpus"] * (1 + 1e-9), (model, tp, pp, balance, row)
        kw = {"shape": shape, "gpus_per_node": 8}
        base = predict_step_time(inp, link=link, intra_node_link="nvlink-a100", **kw).total_s
        faster = replace(LINKS[link], key="faster", bus_bytes_per_s=2 * LINKS[link].bus_bytes_per_s)
        assert predict_step_time(inp, link=faster, intra_node_link="nvlink-a100", **kw).total_s <= base * (1 + 1e-12)
        assert predict_step_time(inp, link=link, intra_node_link="nvlink-h100", **kw).total_s <= base * (1 + 1e-12)


def test_fsdp_in_a_pipeline_gathers_per_micro_batch_and_reduces_once_after_the_schedule():
    """Per pipeline micro-batch an all-gather in forward and in backward; one fp32 reduce-scatter, after the
    schedule's last backward, which nothing is left to hide (the 2-D TP × FSDP layout hides it behind the last
    backward). More micro-batches shrink the bubble, never the other way round."""
    shape = SHAPES["ecomgpt-7b"]
    inp = _three_d("ecomgpt-7b", 2, 2, 2, "layers")
    volume = comm_volume(inp, shape)
    psi = shape.n_params / 4
    assert volume["weight all-gather (fwd)"] == ("all_gather", inp.pp_microbatches * 2 * psi, "forward")
    assert volume["grad reduce-scatter (fp32)"] == ("reduce_scatter", 4 * psi, "exposed")
    assert comm_volume(replace(inp, pp=1, world_size=4), shape)["grad reduce-scatter (fp32)"][2] == "backward_last"
    steps = [predict_step_time(replace(inp, pp_microbatches=m, grad_accum=8, micro_batch=2)) for m in (4, 8, 16)]
    assert steps[0].compute_s > steps[1].compute_s > steps[2].compute_s


def test_ecomgpt_7b_across_two_nodes_trains_fastest_in_three_d():
    """EcomGPT-7B on 2 nodes of 8 A100-80GB over InfiniBand HDR: TP 2 × PP 2 × DP 4, stages cut by compute, is
    recommended, faster than every other fitting setup by more than the tie margin. Its TP and FSDP traffic stays
    on each node's NVLink and only the pipeline's activations cross the slower link. On one 8-GPU NVLink node the
    model does not pick it: sharding over all 8 (FSDP2/ZeRO-3) hides its traffic behind the backward pass, and
    the 250,880-token LM head, whole on every tp rank, makes the split replica's last stage slow."""
    cluster = Cluster(gpus=16, gpu="a100-80g", link="ib-200g", nodes=2)
    job = TrainConfig(model="ecomgpt-7b", precision="bf16", seq_len=2048, global_batch_size=16, micro_batch_size=1)
    ranked = recommend(job, cluster, groups=False)
    best = best_choice(ranked)
    assert best.candidate.label == "TP 2 × PP 2 × DP 4 · stages by compute", best.candidate.label
    others = [c for c in ranked[FULL] if c.fits and c is not best]
    assert all(c.step_s > best.step_s * (1 + STEP_TIE) for c in others)
    line = launch_line(best.cfg, cluster, set())
    assert "--nnodes 2" in line and "--parallel-tp 2" in line and "--parallel-pp 2" in line
    assert "--parallel-pp-balance compute" in line
    one_node = best_choice(recommend(replace(job, global_batch_size=32), Cluster(gpus=8, gpu="a100-80g"),
                                     groups=False))
    assert one_node.cfg.parallel.pp == 1 and one_node.cfg.parallel.tp == 1
