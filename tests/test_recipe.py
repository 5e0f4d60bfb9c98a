"""Defaults chosen by what is trained (ecomkit/config/recipe.py): the rules, and a saved folder's run.

- a random-init preset keeps the mechanics (lr 3e-3, 10 warm-up steps, 60 steps);
- real weights get fine-tuning defaults: lr by size fully fine-tuned (2e-5 at 560 M), 2e-4 with LoRA, warm-up a share of the steps;
- ``--task nlu`` on a user's file trains epochs, at least a floor of steps, cut by the time estimate;
- every value a flag gives wins and is marked given;
- a ``save_pretrained`` folder passed as ``--model`` runs with those defaults, read back from ``summary.json``.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_script

from ecomkit.config import TrainConfig, parse_config
from ecomkit.config.recipe import (LORA_LR, MECHANICS, NLU_FILE_EPOCHS, NLU_FILE_MIN_STEPS, PRESET_NLU_FILE_LR,
                                   WARMUP_SHARE,
                                   RecipeFacts, apply_recipe, full_finetune_lr, resolve_recipe)
from ecomkit.errors import ConfigError


def _facts(kind: str = "preset", peft: str = "none", task: str = "lm", user_data: bool = False,
           examples: int = 4000, spe: int = 250, est: float | None = None) -> RecipeFacts:
    return RecipeFacts(model_kind=kind, n_params=560_000_000, peft=peft, task=task, user_data=user_data,
                       train_examples=examples, steps_per_epoch=spe, est_step_s=est)


def _values(recipe) -> dict:
    return {name: v.value for name, v in recipe.values.items()}


def test_defaults_are_auto_and_a_preset_keeps_the_mechanics():
    cfg = TrainConfig()
    assert (cfg.lr, cfg.warmup_steps, cfg.max_steps, cfg.eval_interval, cfg.precision) == ("auto",) * 5
    recipe = apply_recipe(cfg, _facts())
    assert (cfg.lr, cfg.warmup_steps, cfg.max_steps, cfg.eval_interval) == tuple(MECHANICS[k] for k in (
        "lr", "warmup_steps", "max_steps", "eval_interval")) == (3e-3, 10, 60, 20)
    assert not any(v.given for v in recipe.values.values())
    assert "random-init preset" in recipe.line() and "--lr sets it" in recipe.line()


@pytest.mark.parametrize("kind", ["local", "hub"])
def test_real_weights_fine_tune_at_a_small_lr_and_warm_up_by_share(kind):
    full = resolve_recipe("auto", "auto", 1000, 0.0, _facts(kind))
    assert _values(full)["lr"] == full_finetune_lr(560_000_000) == 2e-5
    assert 1e-5 <= full.values["lr"].value <= 5e-5   # the peers' range for 0.5-7 B models
    assert _values(full)["warmup_steps"] == round(WARMUP_SHARE * 1000) == 50
    assert "full fine-tuning" in full.values["lr"].reason
    lora = resolve_recipe("auto", "auto", 1000, 0.0, _facts(kind, peft="lora"))
    assert _values(lora)["lr"] == LORA_LR == 2e-4 and "LoRA" in lora.values["lr"].reason


def test_flags_win_and_are_marked_given():
    recipe = resolve_recipe(1e-3, 3, 7, 0.0, _facts("local", task="nlu", user_data=True), eval_interval=5)
    assert _values(recipe) == {"lr": 1e-3, "warmup_steps": 3, "max_steps": 7, "eval_interval": 5, "epochs": 0.03}
    assert all(v.given for v in recipe.values.values())
    by_epochs = resolve_recipe("auto", "auto", "auto", 2.0, _facts())
    assert by_epochs.values["max_steps"].value == 500 and by_epochs.values["max_steps"].given


def test_nlu_on_a_file_trains_epochs_with_a_floor_and_a_time_bound():
    big = resolve_recipe("auto", "auto", "auto", 0.0, _facts(task="nlu", user_data=True, spe=250))
    assert big.values["max_steps"].value == NLU_FILE_EPOCHS * 250 and "epochs" in big.values["max_steps"].reason
    assert big.values["eval_interval"].value == 250   # once an epoch, not every 20 steps
    small = resolve_recipe("auto", "auto", "auto", 0.0, _facts(task="nlu", user_data=True, spe=10))
    assert small.values["max_steps"].value == NLU_FILE_MIN_STEPS
    slow = resolve_recipe("auto", "auto", "auto", 0.0, _facts(task="nlu", user_data=True, spe=5000, est=0.5))
    assert slow.values["max_steps"].value == 15 * 60 / 0.5 and "cut to about 15 min" in slow.values["max_steps"].reason
    slower = resolve_recipe("auto", "auto", "auto", 0.0, _facts(task="nlu", user_data=True, spe=5000, est=5.0))
    assert slower.values["max_steps"].value == NLU_FILE_MIN_STEPS   # the floor holds
    assert big.values["lr"].value == PRESET_NLU_FILE_LR == 5e-3   # a preset on a user's NLU file
    synthetic = resolve_recipe("auto", "auto", "auto", 0.0, _facts(task="nlu"))
    assert synthetic.values["max_steps"].value == 60   # the chapters' synthetic runs keep the mechanics
    assert synthetic.values["lr"].value == MECHANICS["lr"]


def test_flags_parse_numbers_and_auto_and_refuse_the_rest():
    cfg, _ = parse_config(["--lr", "2e-5", "--warmup-steps", "4", "--max-steps", "auto"])
    assert (cfg.lr, cfg.warmup_steps, cfg.max_steps) == (2e-5, 4, "auto")
    for flag, value in (("--lr", "fast"), ("--lr", "0"), ("--warmup-steps", "-1"), ("--max-steps", "many")):
        with pytest.raises(ConfigError, match=flag):
            parse_config([flag, value])


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory):
    """A small BLOOM built from a config with the local tokenizer, saved as a user's ``save_pretrained`` folder."""
    from ecomkit.models.bloom import build_model
    from ecomkit.models.tokenizer import get_tokenizer
    from ecomkit.train.loop import tokenizer_cache_dir
    path = tmp_path_factory.mktemp("saved") / "my-bloom"
    tok = get_tokenizer("local", tokenizer_cache_dir())
    build_model("tiny", vocab_size=len(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("peft", ["none", "lora"])
def test_a_saved_folder_gets_fine_tuning_defaults(saved_folder, tmp_path, peft):
    out = tmp_path / "run"
    proc = run_script("02_data_parallel.py", ["--model", str(saved_folder), "--peft", peft, "--task", "nlu",
                                       "--n-rows", "200", "--max-steps", "4", "--eval-interval", "0",
                                       "--gen-eval-samples", "0", "--no-save-model", "--no-progress",
                                       "--report-to", "none", "--output-dir", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    recipe = summary["recipe"]
    # full fine-tuning: the lr for the folder's size (1e-3 for this 2-block model, 2e-5 at SeqGPT-560M's); LoRA: 2e-4
    lr = full_finetune_lr(summary["params"]) if peft == "none" else 2e-4
    assert lr == (1e-3 if peft == "none" else 2e-4)
    assert recipe["lr"] == {"value": lr, "reason": recipe["lr"]["reason"], "given": False}
    assert "real weights" in recipe["lr"]["reason"]
    assert recipe["warmup_steps"]["value"] == 1 and "5% of 4 steps" in recipe["warmup_steps"]["reason"]
    assert recipe["max_steps"] == {"value": 4, "reason": "--max-steps given", "given": True}
    assert recipe["precision"]["value"] in ("fp32", "bf16") and not recipe["precision"]["given"]
    # the start-up line says which precision and why (issue 49 item 3), and the real-weights lr
    line = re.search(r"recipe: .*", proc.stdout + proc.stderr).group(0)
    assert re.search(rf"precision {recipe['precision']['value']} \(auto: .+; --precision sets it\)", line), line
    assert f"lr {lr:g} (real weights" in line



def test_nlu_on_a_file_trains_a_global_batch_of_32_unless_a_flag_says_otherwise():
    from ecomkit.config.recipe import NLU_FILE_GLOBAL_BATCH, resolve_global_batch
    chosen = resolve_global_batch(0, 1, 8, 2, "nlu", True)
    assert (chosen.value, chosen.given) == (NLU_FILE_GLOBAL_BATCH, False) == (32, False)
    assert resolve_global_batch(0, 1, 8, 2, "lm", True).value == 16          # the mechanics: micro × ranks
    assert resolve_global_batch(0, 1, 8, 2, "nlu", False).value == 16        # the synthetic catalog too
    assert resolve_global_batch(0, 1, 12, 2, "nlu", True).value == 24        # 24 does not divide 32: said so
    assert resolve_global_batch(64, 1, 8, 2, "nlu", True).given
    assert resolve_global_batch(0, 3, 8, 2, "nlu", True).value == 48
    assert resolve_global_batch(0, 1, 8, 2, "nlu", True, length_auto=False).value == 16   # --max-steps given


def test_full_fine_tuning_lr_falls_with_size_between_the_measured_and_the_peers_anchors():
    from ecomkit.config.recipe import FULL_FT_ANCHORS, FULL_FT_LR_RANGE
    from ecomkit.models.bloom import preset_parameter_count
    from ecomkit.models.tokenizer import get_tokenizer
    from ecomkit.train.loop import tokenizer_cache_dir
    from ecomlab.measure.transfer import FINETUNE_LR
    sizes = [10_000, 356_416, 14_700_000, 559_214_592, 7_069_016_064, 10**12]
    lrs = [full_finetune_lr(n) for n in sizes]
    assert lrs == sorted(lrs, reverse=True)                                     # larger models, smaller steps
    assert all(FULL_FT_LR_RANGE[0] <= lr <= FULL_FT_LR_RANGE[1] for lr in lrs)
    assert [full_finetune_lr(n) for n, _ in FULL_FT_ANCHORS] == [lr for _, lr in FULL_FT_ANCHORS]
    assert full_finetune_lr(7_069_016_064) == 1e-5 and full_finetune_lr(None) == 2e-5
    # the transfer measurement (chapter 08, tests/test_transfer.py) fine-tunes tiny at what the recipe gives it
    assert full_finetune_lr(preset_parameter_count("tiny", len(get_tokenizer("local", tokenizer_cache_dir())))) == FINETUNE_LR == FULL_FT_ANCHORS[0][1]
