"""``--peft lora`` in TrainConfig: flags with help, and the combinations validate() refuses, before any process group."""

from __future__ import annotations

import pytest

from conftest import main_in_process
from ecomkit.config import TrainConfig, parse_config
from ecomkit.errors import ConfigError


def test_flags_parse_into_the_config():
    cfg, _ = parse_config(["--peft", "lora", "--lora-r", "32", "--lora-alpha", "64", "--lora-dropout", "0.05",
                           "--lora-target-modules", "query_key_value,dense", "--lora-modules-to-save", "word_embeddings"])
    assert (cfg.peft, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout) == ("lora", 32, 64.0, 0.05)
    assert cfg.lora_target_modules == "query_key_value,dense" and cfg.lora_modules_to_save == "word_embeddings"
    assert TrainConfig().lora_target_modules == "query_key_value,dense,dense_h_to_4h,dense_4h_to_h"


@pytest.mark.parametrize("changes, words", [
    ({"peft": "qlora"}, "Unknown peft 'qlora'"),
    ({"lora_r": 0}, "--lora-r 0"),
    ({"lora_alpha": 0.0}, "lora_alpha=0.0"),
    ({"lora_dropout": 1.0}, "lora_dropout=1.0"),
    ({"lora_target_modules": " , "}, "lora_target_modules is empty"),
    ({"strategy": "tp"}, "no tensor-parallel plan"),
    ({"strategy": "pp"}, "no mapping yet"),
    ({"strategy": "mixed"}, "neither has a LoRA layout"),
    ({"strategy": "zero", "lora_modules_to_save": "word_embeddings"}, "ModulesToSaveWrapper"),
])
def test_validate_refuses_what_cannot_work(changes, words):
    cfg = TrainConfig(peft="lora")
    for k, v in changes.items():
        setattr(cfg, k, v)
    with pytest.raises(ConfigError, match=words):
        cfg.validate(world_size=2)


def test_fsdp_with_tp_is_refused_and_plain_strategies_pass():
    cfg = TrainConfig(peft="lora", strategy="fsdp")
    cfg.parallel.tp = 2
    with pytest.raises(ConfigError, match="parallel-tp 1"):
        cfg.validate(world_size=4)
    for strategy in ("ddp", "accelerate", "zero", "fsdp"):
        TrainConfig(peft="lora", strategy=strategy).validate(world_size=2)


def test_script_refuses_before_any_process_group(monkeypatch, capsys):
    code, err = main_in_process("04_mixed_parallel.py", ["--strategy", "tp", "--peft", "lora"], monkeypatch, capsys)
    assert code != 0 and "--peft lora cannot run with --strategy tp" in err


def test_hf_trainer_path_refuses_lora(monkeypatch, capsys):
    code, err = main_in_process("02_hf_trainer.py", ["--peft", "lora"], monkeypatch, capsys)
    assert code != 0 and "HF Trainer comparison path has no LoRA step" in err
