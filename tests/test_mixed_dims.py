"""Parallel degrees: clear errors before any process group, degree resolution, and the decision table."""

from __future__ import annotations

import pytest

from conftest import main_in_process
from ecomkit.config import (PARALLEL_FLAG_ALIASES, ParallelConfig, TrainConfig, expand_aliases, parse_config,
                            resolve_parallel_degrees)
from ecomkit.errors import ConfigError
from ecomkit.parallel.dims import ParallelDims
from ecomkit.planner.layouts import decision_table


def mesh_cfg(strategy: str = "mixed", **parallel) -> TrainConfig:
    return TrainConfig(strategy=strategy, parallel=ParallelConfig(**parallel))


def test_product_must_equal_world_size():
    with pytest.raises(ConfigError, match=r"dp=2 × tp=2 × pp=1 = 4, but torchrun started 2"):
        mesh_cfg(dp=2, tp=2).validate(world_size=2)


def test_tp_must_divide_heads_and_pp_must_not_exceed_layers():
    with pytest.raises(ConfigError, match=r"tp=3 does not divide the 4 heads .* \[1, 2, 4\]"):
        mesh_cfg(tp=3).validate(world_size=3, n_head=4, n_layer=2)
    with pytest.raises(ConfigError, match=r"pp=3 is larger than the 2 blocks"):
        mesh_cfg(pp=3).validate(world_size=3, n_head=4, n_layer=2)
    mesh_cfg(dp=2, tp=2).validate(world_size=4, n_head=4, n_layer=2)  # fine


def test_degrees_resolve_from_strategy_and_leftover_dp():
    par = ParallelConfig()
    assert resolve_parallel_degrees("fsdp", par, 4) == (4, 1, 1)
    assert resolve_parallel_degrees("tp", par, 2) == (1, 2, 1)
    assert resolve_parallel_degrees("pp", par, 2) == (1, 1, 2)
    assert ParallelDims.from_config(mesh_cfg(tp=2), 4) == ParallelDims(2, 2, 1, 4)
    with pytest.raises(ConfigError, match="does not divide the 6 processes"):
        resolve_parallel_degrees("mixed", ParallelConfig(tp=4), 6)


def test_unsupported_combinations_are_refused_with_a_way_out():
    with pytest.raises(ConfigError, match="--precision bf16"):
        TrainConfig(strategy="fsdp", precision="fp16").validate(world_size=2)
    with pytest.raises(ConfigError, match="pp_schedule 'zb'"):
        mesh_cfg("pp", pp_schedule="zb").validate(world_size=2)
    with pytest.raises(ConfigError, match="--dcp-dir is for the chapter-04 strategies"):
        TrainConfig(parallel=ParallelConfig(dcp_dir="x")).validate(world_size=2)


def test_three_d_layouts_and_their_sharded_saves_are_accepted():
    """dp × tp × pp all above 1, with DCP saves: each was refused before the 3-D layout was built."""
    cfg = mesh_cfg(dp=2, tp=2, pp=2, pp_microbatches=2, dcp_dir="x")
    cfg.validate(world_size=8, n_head=4, n_layer=2)
    assert ParallelDims.from_config(cfg, 8) == ParallelDims(2, 2, 2, 8)
    mesh_cfg(tp=2, pp=2).validate(world_size=4, n_head=4, n_layer=2)
    mesh_cfg("pp", dcp_dir="x").validate(world_size=2)
    from ecomkit.config import dcp_unsupported_reason
    assert dcp_unsupported_reason(cfg) is None   # chapter 07's checkpoints save and resume it


def test_global_batch_is_split_over_the_data_parallel_replicas_only():
    """tp=2 on 2 processes is one replica: a global batch of 8 is micro 8 × 1 replica."""
    cfg = mesh_cfg("tp")
    cfg.micro_batch_size, cfg.global_batch_size = 8, 8
    cfg.validate(world_size=2)
    assert cfg.resolve_grad_accum(1) == 1


def test_rank_coordinates_put_tp_innermost():
    dims = ParallelDims(dp=2, tp=2, pp=1, world_size=4)
    assert [dims.coordinates(r) for r in range(4)] == [
        {"pp": 0, "dp": 0, "tp": 0}, {"pp": 0, "dp": 0, "tp": 1},
        {"pp": 0, "dp": 1, "tp": 0}, {"pp": 0, "dp": 1, "tp": 1}]
    assert all(dims.rank_of(**dims.coordinates(r)) == r for r in range(4))


def test_presets_are_checked_without_building_the_model(monkeypatch):
    """run_training checks a preset's shape before it creates the process group."""
    import torch.distributed as dist

    from ecomkit.train import run_training

    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match="larger than the 2 blocks of model 'tiny'"):
        run_training(mesh_cfg("pp", pp=3))
    assert not dist.is_initialized()


def test_script_refuses_invalid_degrees_before_starting(tmp_path, monkeypatch, capsys):
    """WORLD_SIZE=3 without torchrun: the check must fire before any process group is created."""
    monkeypatch.setenv("WORLD_SIZE", "3")
    code, err = main_in_process("04_mixed_parallel.py", ["--tp", "3", "--model", "tiny", "--output-dir",
                                                         str(tmp_path)], monkeypatch, capsys)
    assert code == 2, err[-2000:]
    assert "does not divide the 4 heads" in err and "Traceback" not in err


def test_short_aliases_expand_to_config_flags(monkeypatch):
    assert expand_aliases(["--tp", "2", "--dp=2", "--pp-x", "1", "--dcp-dir", "d"], PARALLEL_FLAG_ALIASES) == [
        "--parallel-tp", "2", "--parallel-dp=2", "--pp-x", "1", "--parallel-dcp-dir", "d"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg, _ = parse_config(["--strategy", "tp", "--tp", "2"], aliases=PARALLEL_FLAG_ALIASES)
    assert cfg.parallel.tp == 2


def test_decision_table_is_computed_from_exact_parameter_counts():
    from ecomkit.models.bloom import preset_parameter_count

    psi = preset_parameter_count("ecomgpt-7b")
    rows = decision_table(["seqgpt-560m", "ecomgpt-7b"], [4, 8], gpu="a100-80g", micro_batch=4, seq_len=1024)
    by = {(r["model"], r["gpus"], r["layout"]): r for r in rows}
    # torch keeps 16 bytes per parameter (fp32 weights, grads, 2 Adam moments): replicated vs sharded over 8
    assert by[("ecomgpt-7b", 8, "DP (DDP)")]["state_gb"] * 1e9 == pytest.approx(16 * psi)
    assert by[("ecomgpt-7b", 8, "ZeRO-3 / FSDP2")]["state_gb"] * 1e9 == pytest.approx(16 * psi / 8, rel=1e-3)
    picks = {(r["model"], r["gpus"]): r["layout"] for r in rows if r["pick"]}
    assert picks[("seqgpt-560m", 4)] == picks[("seqgpt-560m", 8)] == "DP (DDP)"   # fits replicated
    assert picks[("ecomgpt-7b", 8)] == "ZeRO-3 / FSDP2"                           # 113 GB replicated: shard
    assert not by[("ecomgpt-7b", 4, "DP (DDP)")]["fits"]
    # same work per step: DDP and FSDP2 send the same bytes (bf16 gathers twice + fp32 reduce-scatter = fp32 all-reduce)
    assert by[("ecomgpt-7b", 8, "DP (DDP)")]["comm_gb_per_step"] == pytest.approx(
        by[("ecomgpt-7b", 8, "ZeRO-3 / FSDP2")]["comm_gb_per_step"], rel=1e-3)


def test_decision_facts_read_the_figures_chapter_04_quotes():
    from ecomkit.planner.shapes import model_shape
    from ecomlab.plots.mixed import decision_facts

    rows = decision_table(["seqgpt-560m"], [8], gpu="a100-80g", micro_batch=4, seq_len=1024)
    f = decision_facts(rows, "seqgpt-560m", 8)
    psi = model_shape("seqgpt-560m").n_params
    assert f["replicated_state_gb"] == pytest.approx(16 * psi / 1e9)
    assert f["replicated_state_gb_all_gpus"] == pytest.approx(8 * 16 * psi / 1e9)
    assert f["fewest_states_layout"] == "ZeRO-3 / FSDP2" and f["sharded_state_gb_range"][0] == pytest.approx(
        2 * psi / 1e9, rel=1e-2)
    assert f["most_memory_gb"] == max(r["total_gb"] for r in rows)
    assert 0.4 < f["embedding_share"] < 0.5   # 250,880 × 1,024 of 559 M parameters
    with pytest.raises(ValueError):
        decision_facts(rows, "seqgpt-560m", 4)
