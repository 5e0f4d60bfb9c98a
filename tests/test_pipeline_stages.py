"""Pipeline stages of BLOOM, chained in one process, reproduce the unsplit model (no process group needed)."""

from __future__ import annotations

import copy

import pytest
import torch

from ecomkit.errors import ConfigError
from ecomkit.models.bloom import build_model, preset_config
from ecomkit.parallel.pipeline import BloomPipelineStage, pad_to_length, stage_layer_ranges


def test_layer_ranges_are_contiguous_and_balanced():
    assert stage_layer_ranges(30, 4) == [(0, 8), (8, 16), (16, 23), (23, 30)]
    assert stage_layer_ranges(2, 2) == [(0, 1), (1, 2)]
    with pytest.raises(ConfigError, match="between 1 and the 2 blocks"):
        stage_layer_ranges(2, 3)


@pytest.mark.parametrize("n_stages", [2, 3])
def test_chained_stages_give_the_full_models_logits_and_state(n_stages):
    cfg = preset_config("tiny", 200, n_layer=3)
    full = build_model(cfg, seed=0).eval()
    stages = [BloomPipelineStage(copy.deepcopy(full), s, n_stages).eval() for s in range(n_stages)]
    ids = torch.randint(3, 200, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    with torch.no_grad():
        out = (ids, mask)
        for stage in stages:
            out = stage(*out)
        expected = full(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(out, expected)
    # the last stage holds an untied copy of the embedding; the merged state dict stores it once
    assert stages[-1].tied_weight() is not stages[0].tied_weight()
    merged = {}
    for stage in stages:
        merged.update(stage.global_state_dict())
    reference = {k: v for k, v in full.state_dict().items() if k != "lm_head.weight"}
    assert merged.keys() == reference.keys()
    for k, v in reference.items():
        torch.testing.assert_close(merged[k], v)


def test_padding_to_the_pipeline_length_masks_the_new_positions():
    batch = {"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.tensor([[1, 1]]),
             "labels": torch.tensor([[5, 6]])}
    out = pad_to_length(batch, 4, pad_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 0, 0]]
    assert out["labels"].tolist() == [[5, 6, -100, -100]]
    with pytest.raises(ConfigError, match="--seq-len 1"):
        pad_to_length(batch, 1)


def test_a_stage_keeps_the_unsplit_models_names_and_indexes_locally():
    """Stage 1 of 2 over 3 blocks holds block 2 as ``h.2`` (its DCP and optimizer keys), yet ``h[0]`` is it."""
    cfg = preset_config("tiny", 200, n_layer=3)
    full = build_model(cfg, seed=0)
    block2 = full.transformer.h[2]
    stage = BloomPipelineStage(full, 1, 2)
    blocks = stage.model.transformer.h
    assert stage.layer_range == (2, 3) and len(blocks) == 1 and blocks[0] is block2 and list(blocks) == [block2]
    names = set(stage.model.state_dict())
    assert "transformer.h.2.mlp.dense_4h_to_h.weight" in names and not any(".h.0." in n for n in names)
    replacement = torch.nn.Identity()
    blocks[0] = replacement   # what activation checkpointing does to each block: the same key is replaced
    assert list(blocks.named_children()) == [("2", replacement)]


def test_stages_cut_by_compute_give_the_last_stage_fewer_blocks_and_still_chain_to_the_full_model():
    """--parallel-pp-balance compute: a head worth 2 blocks moves a block off the last of 2 stages (4 blocks:
    3 + 1, not 2 + 2), and the stages still compute the unsplit model's logits."""
    cfg = preset_config("tiny", 200, n_layer=4)
    full = build_model(cfg, seed=0).eval()
    stages = [BloomPipelineStage(copy.deepcopy(full), s, 2, head_blocks=2.0).eval() for s in range(2)]
    assert [s.layer_range for s in stages] == [(0, 3), (3, 4)]
    assert [s.layer_range for s in (BloomPipelineStage(copy.deepcopy(full), i, 2) for i in range(2))] == [(0, 2), (2, 4)]
    ids = torch.randint(3, 200, (2, 6))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(stages[1](*stages[0](ids, mask)), full(input_ids=ids, attention_mask=mask).logits)
