"""The config dataclass, its derived CLI and its validation (no process group involved)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from import_cost import fresh_python

from ecomkit.config import (CONFIG_PRESETS, StrategyName, TrainConfig, parse_config, parse_plan_strategy,
                            plan_strategy_name)
from ecomkit.errors import ConfigError


def test_flags_are_derived_with_dashes_and_nested_prefixes():
    cfg, _ = parse_config(["--max-steps", "7", "--micro-batch-size", "4", "--output-dir", "x",
                           "--zero-stage", "2", "--no-bucketed", "--column-map", '{"name": "title"}'])
    assert (cfg.max_steps, cfg.micro_batch_size, cfg.output_dir) == (7, 4, "x")
    assert cfg.zero.stage == 2 and cfg.bucketed is False and cfg.column_map == {"name": "title"}


def test_yaml_and_json_config_files(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("lr: 0.01\nzero:\n  stage: 1\n")
    cfg, _ = parse_config(["--config", str(y), "--lr", "0.02"])
    assert cfg.lr == 0.02 and cfg.zero.stage == 1  # flags win over the file
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"max_steps": 3}))
    assert parse_config(["--config", str(j)])[0].max_steps == 3


def test_unknown_key_in_file_is_rejected_with_suggestion(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("max_step: 3\n")
    with pytest.raises(ConfigError, match="unknown config key 'max_step'.*max_steps"):
        parse_config(["--config", str(y)])


def test_unknown_flag_is_a_user_error_naming_the_flag():
    with pytest.raises(ConfigError, match="unrecognized arguments: --max-stepz"):
        parse_config(["--max-stepz", "3"])


@pytest.mark.parametrize("argv, match", [
    (["--lr", "-1"], "--lr -1.0: must be > 0"),
    (["--eval-batches", "0"], "--eval-batches 0: must be > 0"),   # 0 batches reported an eval loss of 0.0
    (["--strategy", "dpp"], "Unknown strategy 'dpp'"),
    (["--data", "missing.jsonl"], "does not exist"),
    (["--global-batch-size", "12", "--micro-batch-size", "8"], "not divisible"),
    (["--precision", "fp8"], "Unknown precision"),
    (["--compression-method", "gzip"], "Unknown compression.method"),
])
def test_invalid_values_are_rejected_before_any_process_group(argv, match):
    import torch.distributed as dist

    with pytest.raises(ConfigError, match=match):
        parse_config(argv)
    assert not dist.is_initialized()


def test_global_batch_derives_accumulation():
    cfg = TrainConfig(global_batch_size=32, micro_batch_size=4)
    assert cfg.resolve_grad_accum(world_size=2) == 4
    assert cfg.resolve_grad_accum(world_size=1) == 8


def test_every_named_preset_validates():
    for name, make in CONFIG_PRESETS.items():
        cfg = make()
        cfg.validate(world_size=1)
        assert isinstance(cfg, TrainConfig), name


# ---------------------------------------------------------------------- one validation, every chapter
@pytest.mark.parametrize("change, match", [
    ({"compression.method": "topk", "strategy": "zero"}, "needs DDP communication hooks"),
    ({"compression.topk_ratio": 0.0}, "topk_ratio=0.0"),
    ({"compression.method": "powersgd", "compression.powersgd_start_iter": 1}, "powersgd_start_iter=1"),
    ({"strategy": "zero", "zero.stage": 2, "zero.offload_param": True}, "needs ZeRO stage 3"),
    ({"zero.stage": 5}, r"zero.stage=5 must be 0, 1, 2 or 3"),
    ({"fault.checkpoint_interval": -5}, "--fault-checkpoint-interval -5"),
    ({"strategy": "zero", "fault.checkpoint_interval": 10}, "not supported with --strategy zero"),
    ({"fault.straggler_factor": 1.0}, "--fault-straggler-factor 1.0"),
    ({"parallel.dcp_dir": "shards"}, "--dcp-dir is for the chapter-04 strategies"),
])
def test_every_chapter_is_checked_by_validate(change, match):
    cfg = TrainConfig()
    for key, value in change.items():
        owner, _, name = key.rpartition(".")
        setattr(getattr(cfg, owner) if owner else cfg, name, value)
    with pytest.raises(ConfigError, match=match):
        cfg.validate(world_size=2)


@pytest.mark.parametrize("user, match", [
    ({"train_batch_size": 64}, "train_batch_size=64 disagrees with this run"),
    ({"gradient_accumulation_steps": 4}, "gradient_accumulation_steps=4 disagrees"),
])
def test_deepspeed_json_batch_sizes_must_agree_with_the_launch(tmp_path, user, match):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(user))
    cfg = TrainConfig(strategy="zero", micro_batch_size=4, grad_accum=2)
    cfg.zero.user_config = str(path)
    with pytest.raises(ConfigError, match=match):
        cfg.validate(world_size=2)
    path.write_text(json.dumps({"train_batch_size": 16}))  # 4 × 2 × 2: agrees
    cfg.validate(world_size=2)


def test_missing_deepspeed_json_is_reported_before_any_process_group():
    cfg = TrainConfig(strategy="zero")
    cfg.zero.user_config = "no_such_ds.json"
    with pytest.raises(ConfigError, match="does not exist"):
        cfg.validate(world_size=1)


def test_strategy_vocabulary_round_trips_through_the_planner_names():
    assert plan_strategy_name(StrategyName.ZERO, 2) == "zero2"
    assert parse_plan_strategy("zero-3") == (StrategyName.ZERO, 3)
    assert parse_plan_strategy("fsdp") == (StrategyName.FSDP, 0)
    with pytest.raises(ConfigError, match="Unknown planner strategy"):
        parse_plan_strategy("zero4")


def test_every_strategy_name_has_a_registered_strategy_and_ddp_does_not_load_deepspeed():
    """The registry covers the whole vocabulary, and importing it (a DDP run) never imports DeepSpeed."""
    code = ("import sys; from ecomkit.config import StrategyName; from ecomkit.parallel import STRATEGIES; "
            "import ecomkit.train; assert set(STRATEGIES) == set(StrategyName), STRATEGIES; "
            "assert 'deepspeed' not in sys.modules, 'deepspeed imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("setting,loads", [("", False), ("cfg.peft = 'lora'", True), ("cfg.compile = True", True),
                                           ("cfg.label_map = {'sentiment': {'0': 'negative'}}", True),
                                           ("cfg.loss_kernel = 'liger'", True), ("cfg.lora_base_bits = 8", True)])
def test_the_checks_of_options_load_only_when_a_config_sets_one(setting, loads):
    """``validate.OPTION_CHECKS`` is imported by name for a fused loss kernel, LoRA/QLoRA, --compile or a label map,
    and a default config validates without it (a DDP run loads what it uses)."""
    code = ("import sys; from ecomkit.config import TrainConfig; from ecomkit.errors import ConfigError; "
            f"cfg = TrainConfig(); {setting}\ntry:\n    cfg.validate(2)\nexcept ConfigError:\n    pass\n"
            "print('ecomkit.config.validate_options' in sys.modules)")
    assert fresh_python(code).split()[-1] == str(loads)


@pytest.mark.parametrize("given", [False, True])
def test_the_config_file_reader_loads_only_with_config(given, tmp_path):
    """``cli.CONFIG_FILE`` is imported by name when ``--config`` is given (and its values applied), never without."""
    path = tmp_path / "run.yaml"
    path.write_text("micro_batch_size: 3\n")
    argv = ["--config", str(path)] if given else []
    code = ("import sys; from ecomkit.config import parse_config; "
            f"cfg, _ = parse_config({argv!r}); "
            "print(cfg.micro_batch_size, 'ecomkit.config.config_file' in sys.modules)")
    expected = ["3", "True"] if given else [str(TrainConfig().micro_batch_size), "False"]
    assert fresh_python(code).split()[-2:] == expected
