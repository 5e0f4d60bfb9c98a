"""Weights load in the dtype their strategy trains them in: a run that holds bf16 weights never builds fp32 ones.

- each strategy names that dtype (``Strategy.weight_dtype``): torch's strategies fp32 for a full fine-tune
  (autocast, FSDP2's policy compute from fp32 weights), DeepSpeed the training dtype, LoRA's frozen base bf16
  under ``--precision bf16``;
- LoRA under bf16: the model a strategy builds is already bf16, and after PEFT the adapters are fp32 with the
  same seeded values, and the base the same bf16 values, as the former fp32 load then cast gave;
- a local safetensors checkpoint loads one tensor at a time into the dtype asked, equal to ``from_pretrained``'s;
- a preset built in bf16 equals the fp32 build rounded to bf16 (so every rank, and a reference, agree).

The load peak itself is measured in ``tests/test_load_peak.py``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.models.bloom import ModelSource, build_empty_model, build_model, load_model
from ecomkit.models.lora import apply_peft
from ecomkit.parallel import build_strategy

BF16, FP32 = torch.bfloat16, torch.float32


def _cfg(strategy: str = "ddp", precision: str = "bf16", peft: str = "none", **extra) -> TrainConfig:
    cfg = TrainConfig()
    cfg.strategy, cfg.precision, cfg.peft = strategy, precision, peft
    for k, v in extra.items():
        setattr(cfg, k, v)
    return cfg


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    build_model("tiny", vocab_size=300).save_pretrained(path, max_shard_size="40KB")
    return str(path)


@pytest.mark.parametrize("strategy, precision, peft, dtype", [
    ("ddp", "fp32", "none", FP32), ("ddp", "bf16", "none", FP32),      # DDP + autocast: fp32 weights
    ("ddp", "bf16", "lora", BF16), ("ddp", "fp32", "lora", FP32),      # LoRA's frozen base: bf16 under bf16
    ("zero", "bf16", "none", BF16), ("zero", "bf16", "lora", BF16),    # DeepSpeed: the training dtype
    ("zero", "fp32", "none", FP32),
    ("fsdp", "bf16", "none", FP32), ("fsdp", "bf16", "lora", BF16),    # FSDP2 shards fp32 weights
])
def test_each_strategy_loads_in_the_dtype_it_trains_weights_in(strategy, precision, peft, dtype):
    assert build_strategy(_cfg(strategy, precision, peft), DistEnv()).weight_dtype() == dtype


@pytest.mark.parametrize("modules_to_save", ["", "ln_f"])
def test_lora_bf16_builds_a_bf16_model_and_peft_gives_the_fp32_load_s_adapters(checkpoint, modules_to_save):
    cfg = _cfg(peft="lora", lora_r=4, lora_modules_to_save=modules_to_save)
    built = build_strategy(cfg, DistEnv()).build_model(ModelSource(checkpoint))
    assert {p.dtype for p in built.parameters()} == {BF16}          # never fp32, not even before PEFT
    model = apply_peft(built, cfg)
    reference = apply_peft(load_model(checkpoint, dtype=FP32), cfg)  # the former path: fp32, then the base cast
    ours, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, p in ours.items():   # adapters, saved modules and the frozen LayerNorms fp32 (norms: bf16 values)
        norm = "layernorm" in name or "ln_f" in name
        assert p.dtype == (FP32 if p.requires_grad or norm else BF16), name
        assert not norm or torch.equal(p, p.to(BF16).float()), name
        assert p.dtype == theirs[name].dtype and torch.equal(p, theirs[name]), name
    assert any(".lora_A." in n for n in ours) and all(p.requires_grad for n, p in ours.items() if ".lora_" in n)


def test_a_checkpoint_built_empty_keeps_its_own_vocabulary(checkpoint):
    """ZeRO-3 and FSDP2 build a local checkpoint's architecture empty, then load it: with the checkpoint's vocabulary,
    as load_model does, not the tokenizer's count the loop passes (BLOOM's embedding has more rows than its
    tokenizer has entries); a preset is sized by it."""
    assert build_empty_model(ModelSource(checkpoint, vocab_size=250)).config.vocab_size == 300
    assert build_empty_model(ModelSource("tiny", vocab_size=250)).config.vocab_size == 250


def test_a_local_checkpoint_loads_tensor_by_tensor_as_from_pretrained_does(checkpoint):
    for dtype in (FP32, BF16):
        ours = load_model(checkpoint, dtype=dtype)
        theirs = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
        assert ours.dtype == dtype and not ours.training
        assert ours.lm_head.weight is ours.transformer.word_embeddings.weight
        for (n, p), (m, q) in zip(ours.state_dict().items(), theirs.state_dict().items()):
            assert n == m and torch.equal(p, q), n


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_a_preset_built_in_16_bits_is_the_fp32_init_rounded(dtype):
    made = build_model("small", vocab_size=512, dtype=dtype)
    rounded = build_model("small", vocab_size=512).to(dtype)
    assert made.dtype == dtype
    for (n, p), (_, q) in zip(made.state_dict().items(), rounded.state_dict().items()):
        assert torch.equal(p, q), n
