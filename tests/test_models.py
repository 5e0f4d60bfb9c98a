"""Model presets, exact meta-device parameter counts and load_model's error paths."""

from __future__ import annotations

import time

import pytest
import torch

from ecomkit.errors import ModelNotFoundError
from ecomkit.models.bloom import build_model, load_model, preset_parameter_count


def test_real_shapes_have_exact_parameter_counts_on_meta():
    # bigscience/bloom-560m and bloom-7b1 report exactly these counts
    assert preset_parameter_count("seqgpt-560m") == 559_214_592
    assert preset_parameter_count("ecomgpt-7b") == 7_069_016_064


def test_meta_build_allocates_nothing():
    model = build_model("ecomgpt-7b", device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())


def test_unknown_preset_is_one_clear_paragraph():
    with pytest.raises(ModelNotFoundError, match="Unknown model 'tinny'.*preset"):
        load_model("tinny")


def test_hub_id_offline_fails_fast_with_instructions():
    t = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="local-dir"):
        load_model("bigscience/bloom-560m")
    assert time.perf_counter() - t < 20


def test_dir_without_config_is_explained(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(str(tmp_path))


def test_local_dir_round_trip_gives_identical_logits(tmp_path):
    model = build_model("tiny", vocab_size=300)
    model.save_pretrained(tmp_path / "m")
    again = load_model(str(tmp_path / "m"))
    ids = torch.randint(0, 300, (2, 9))
    torch.testing.assert_close(model(ids).logits, again(ids).logits, rtol=0, atol=0)
