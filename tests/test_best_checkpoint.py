"""The weights a run keeps in ``final/`` (``ecomkit.train.outcome``): the best evaluation's, or the last step's and why."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from ecomkit.train.outcome import BestWeights, why_last


def test_why_the_last_weights_are_kept():
    assert why_last(20, "ddp", True) is None and why_last(20, "single", True) is None
    assert why_last(0, "ddp", True).startswith("no periodic evaluation (--eval-interval 0)")
    assert "strategy zero saves weights" in why_last(20, "zero", True)      # ZeRO-1/2: the fp32 master is saved
    assert "strategy fsdp2" in why_last(20, "fsdp2", False)


def test_one_copy_of_the_trainable_parameters_at_the_lowest_loss_is_put_back_when_it_beats_the_last():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    model[1].weight.requires_grad_(False)        # frozen (a LoRA base): never copied, never changes
    best = BestWeights(model, None)
    best.observe(0, {"eval_loss": 3.0})
    with torch.no_grad():
        model[0].weight.fill_(1.0)
    best.observe(10, {"eval_loss": 2.0})          # the lowest: its copy replaces step 0's
    assert best.step == 10 and set(best.copy) == {"0.weight", "0.bias", "1.bias"}
    with torch.no_grad():
        model[0].weight.fill_(5.0)
    best.observe(20, {"eval_loss": 2.5})          # worse: the copy stays step 10's
    kept = best.finish(30, last_value=2.7)
    assert kept["kept"] == "best" and kept["step"] == 10 and kept["value"] == 2.0 and kept["last_value"] == 2.7
    assert torch.equal(model[0].weight, torch.ones(3, 3)) and best.copy is None   # put back, copy released
    assert kept["line"].startswith("kept weights    the best evaluation's, step 10, eval_loss 2.0000 on the periodic sample")


def test_the_last_weights_stay_when_they_are_best_or_nothing_was_compared():
    model = torch.nn.Linear(2, 2)
    best = BestWeights(model, None)
    best.observe(0, {"eval_loss": 3.0})
    with torch.no_grad():
        model.weight.fill_(7.0)
    kept = best.finish(40, last_value=1.0)
    assert kept["kept"] == "last" and kept["step"] == 40 and torch.equal(model.weight, torch.full((2, 2), 7.0))
    close = BestWeights(model, None)
    close.observe(10, {"eval_loss": 1.995})
    kept = close.finish(40, last_value=2.0)    # lower by 0.25 %: within the sample's noise, the last stays
    assert kept["kept"] == "last" and "lower by more than 1%" in kept["reason"]
    assert torch.equal(model.weight, torch.full((2, 2), 7.0))
    none = BestWeights(None, why_last(0, "ddp", True)).finish(40, None)
    assert none["kept"] == "last" and none["reason"].startswith("no periodic evaluation")
    assert "the last step's, step 40: no periodic evaluation" in none["line"]


@pytest.mark.slow
def test_a_run_whose_loss_rises_saves_its_best_weights_in_final(tmp_path):
    """An lr far too high makes the held-out loss rise after step 0: final/ must hold step 0's weights (the
    preset's initialisation), the summary must say so, and the final evaluation must describe those weights."""
    from ecomkit.config import TrainConfig
    from ecomkit.dist import DistEnv
    from ecomkit.models.bloom import load_model
    from ecomkit.train.loop import train_in_session

    cfg = TrainConfig(model="tiny", task="nlu", n_rows=120, seq_len=64, micro_batch_size=4, max_steps=6,
                      eval_interval=3, eval_batches=2, eval_nlu_samples=4, gen_eval_samples=0, final_eval_samples=8,
                      lr=3.0, warmup_steps=0, max_grad_norm=0.0, precision="fp32", output_dir=str(tmp_path / "run"),
                      progress=False)
    env = DistEnv(rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))
    summary = train_in_session(cfg, env)
    kept = summary["final_checkpoint"]
    assert kept["kept"] == "best" and kept["step"] == 0, kept
    assert kept["last_value"] > kept["value"]
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["final_checkpoint"] == kept
    weights = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    init = load_model("tiny", vocab_size=weights["transformer.word_embeddings.weight"].shape[0], seed=cfg.seed)
    for name, value in init.state_dict().items():
        if name in weights:
            assert torch.equal(weights[name], value.float()), name
