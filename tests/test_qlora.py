"""QLoRA: the frozen base's adapted Linears stored by bitsandbytes in 4 bits (NF4) or 8 bits (LLM.int8), on CPU.

Needs the optional extra (``pip install 'ecomkit[qlora]'``); skipped without it. In this process: the
target Linears become bitsandbytes layers with packed integer weights, frozen; the trainable count is
PEFT's; a few AdamW steps lower the loss and leave every frozen byte as it was; the dequantized weights
(what ``<out>/final`` is merged from) reproduce the quantized model's logits (within 1e-2: the 8-bit
path also quantizes the activations). On 2 gloo processes: ``scripts/02_data_parallel.py --peft lora
--lora-base-bits 4`` trains under DDP and saves an adapter and a merged ``final`` that plain
transformers loads. The sharding strategies are refused before any process group exists.
"""

from __future__ import annotations

import pytest
import torch

from conftest import run_script
from ecomkit.config import TrainConfig
from ecomkit.errors import ConfigError
from ecomkit.models.bloom import build_model
from ecomkit.models.lora import apply_peft, peft_model_from_state
from ecomkit.models.quant import dequantized_state_dict
from ecomlab.measure.lora import peft_trainable_count

bnb = pytest.importorskip("bitsandbytes")

PACKED = {4: (bnb.nn.Linear4bit, torch.uint8), 8: (bnb.nn.Linear8bitLt, torch.int8)}


def qlora_config(bits: int, **kw) -> TrainConfig:
    return TrainConfig(peft="lora", lora_r=8, lora_alpha=16.0, lora_base_bits=bits, **kw)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_base_is_packed_frozen_and_the_adapters_learn(bits):
    cfg = qlora_config(bits)
    cfg.validate(1)
    model = apply_peft(build_model("tiny", vocab_size=300, seed=0), cfg)
    layer_type, dtype = PACKED[bits]
    quantized = [m for m in model.modules() if isinstance(m, layer_type)]
    assert len(quantized) == 4 * model.config.n_layer   # BLOOM's four Linears per block
    assert all(m.weight.dtype == dtype and not m.weight.requires_grad for m in quantized)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == peft_trainable_count(model.config, cfg)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    ids = torch.randint(0, 300, (4, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(10):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
    assert all(torch.equal(frozen[n], p) for n, p in model.named_parameters() if n in frozen)
    model.eval()
    rebuilt = peft_model_from_state(dequantized_state_dict(model), model.config, cfg).eval()
    with torch.no_grad():
        diff = (rebuilt(input_ids=ids).logits - model(input_ids=ids).logits).abs().max().item()
    assert diff < 1e-2, diff


@pytest.mark.parametrize("strategy", ["zero", "fsdp", "accelerate"])
def test_sharding_strategies_are_refused_before_any_process_group(strategy):
    with pytest.raises(ConfigError, match="--lora-base-bits 4 with --strategy"):
        qlora_config(4, strategy=strategy).validate(2)
    with pytest.raises(ConfigError, match="needs --peft lora"):
        TrainConfig(lora_base_bits=4).validate(1)


@pytest.mark.dist
def test_ddp_trains_a_4bit_base_and_saves_adapter_and_merged_model(tmp_path):
    import json

    from transformers import AutoModelForCausalLM

    run_script("02_data_parallel.py", ["--model", "tiny", "--n-rows", "200", "--seq-len", "48", "--max-steps", "6",
                                       "--eval-interval", "6", "--eval-batches", "2", "--micro-batch-size", "4",
                                       "--warmup-steps", "2", "--peft", "lora", "--lora-r", "8", "--lora-base-bits", "4",
                                       "--lr", "1e-2", "--no-progress", "--output-dir", str(tmp_path)], nproc=2)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["world_size"] == 2 and s["peft"] == "lora" and s["config"]["lora_base_bits"] == 4
    assert s["final_loss"] < s["first_loss"]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert s["trainable_params"] == peft_trainable_count(merged.config, qlora_config(4)) > 0
    assert s["params"] == sum(p.numel() for p in merged.parameters()) + s["trainable_params"]  # 4-bit: unpacked
    assert not any(type(m).__module__.startswith("bitsandbytes") for m in merged.modules())
