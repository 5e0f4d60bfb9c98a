"""The config dataclass, its derived CLI and its validation (no process group involved)."""

from __future__ import annotations

import json

import pytest

from ecomkit.config import CONFIG_PRESETS, TrainConfig, parse_config
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


def test_unknown_flag_exits_with_usage():
    with pytest.raises(SystemExit):
        parse_config(["--max-stepz", "3"])


@pytest.mark.parametrize("argv, match", [
    (["--lr", "-1"], "lr=-1.0 must be > 0"),
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
