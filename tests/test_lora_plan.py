"""The planner's LoRA rows (unit): adapter count = PEFT's, frozen base without gradients or optimizer states,
activations as full fine-tuning, only the adapters' gradients communicated, QLoRA smaller, refusals.
The 2-process comparison with measured bytes is in tests/test_lora.py."""

from __future__ import annotations

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.errors import ConfigError
from ecomkit.planner.cli import read_job, render, run_plan
from ecomkit.planner.lora import (LoraPlan, adapter_params, gradient_bytes_per_step, lora_state_bytes_per_rank,
                                  plan_lora_memory)
from ecomkit.planner.memory import PlanInput, model_state_bytes_per_rank, plan_memory
from ecomkit.planner.shapes import model_shape


def test_adapter_count_is_peft_s_own():
    from peft import get_peft_model

    from ecomkit.models.bloom import build_model
    from ecomkit.models.lora import lora_config

    for r in (8, 64):
        cfg = TrainConfig(peft="lora", lora_r=r)
        peft_count = get_peft_model(build_model("small", vocab_size=4003, device="meta"),
                                    lora_config(cfg)).get_nb_trainable_parameters()[0]
        assert sum(p.numel for p in adapter_params(model_shape("small", 4003), LoraPlan(r=r))) == peft_count


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3", "fsdp2"])
def test_frozen_base_has_no_grads_or_optimizer_states(strategy):
    inp = PlanInput(model="ecomgpt-7b", world_size=8, strategy=strategy, precision="bf16")
    lora, full = lora_state_bytes_per_rank(inp, LoraPlan(r=16))[0], model_state_bytes_per_rank(inp)[0]
    trainable = sum(p.numel for p in adapter_params(model_shape("ecomgpt-7b"), LoraPlan(r=16)))
    assert lora["grads"] <= 4 * trainable and lora["optimizer"] <= 12 * trainable   # adapters only
    assert lora["grads"] > 0 and lora["optimizer"] > 0                                 # ... and they have both
    assert lora["params"] < full["params"] or strategy.startswith("zero")  # torch: the base in bf16, not fp32
    assert lora["grads"] < full["grads"] / 100 and lora["optimizer"] < full["optimizer"] / 100


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_bf16_lora_params_are_the_bytes_the_model_holds(strategy):
    """Under bf16 the frozen base is bf16 but its LayerNorms fp32 (models/lora.freeze_base_in_bf16): the planner's
    parameter bytes are what a bf16 LoRA model built the loop's way holds (FSDP2: over its two ranks' shards)."""
    from ecomkit.models.bloom import build_model
    from ecomkit.models.lora import apply_peft

    cfg = TrainConfig(peft="lora", lora_r=8, precision="bf16")
    model = apply_peft(build_model("small", vocab_size=4003, dtype=torch.bfloat16), cfg)
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    inp = PlanInput(model="small", vocab_size=4003, world_size=2, strategy=strategy, precision="bf16")
    planned = [r["params"] for r in lora_state_bytes_per_rank(inp, LoraPlan(r=8))]
    assert (planned[0] if strategy == "ddp" else sum(planned)) == held


def test_activations_are_full_fine_tuning_s_and_the_planner_says_so():
    inp = PlanInput(model="ecomgpt-7b", world_size=8, strategy="zero3", gpu="a100-40g", seq_len=512)
    lora, full = plan_lora_memory(inp, LoraPlan(r=16)), plan_memory(inp)
    assert lora.activations == full.activations and lora.model_states < full.model_states / 2
    assert any("activations are paid in full" in n for n in lora.notes)
    assert gradient_bytes_per_step(inp, LoraPlan(r=16)) * 100 < gradient_bytes_per_step(inp, None)


def test_qlora_base_is_smaller_and_refusals_are_clear():
    inp = PlanInput(model="ecomgpt-7b", world_size=4, strategy="fsdp2", gpu="rtx4090")
    sixteen, four = (plan_lora_memory(inp, LoraPlan(r=16, base_bits=b)).params for b in (16, 4))
    assert four < 0.35 * sixteen
    with pytest.raises(ConfigError, match="tp"):
        plan_lora_memory(PlanInput(model="ecomgpt-7b", world_size=4, strategy="tp"), LoraPlan())
    with pytest.raises(ConfigError, match="ZeRO-3"):
        plan_lora_memory(PlanInput(model="ecomgpt-7b", world_size=4, strategy="zero3"), LoraPlan(base_bits=4))


def test_cli_plans_lora():
    job = read_job(["--model", "ecomgpt-7b", "--gpus", "4", "--gpu", "rtx4090", "--zero", "3",
                    "--peft", "lora", "--lora-r", "16", "--seq-len", "512"])
    text = render(run_plan(job))
    assert "activations are paid in full" in text and "31,457,280 trainable" in text
