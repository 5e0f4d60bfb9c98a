"""The EcomGPT guide's sentiment-adaptive clip value, per global batch (ecomkit.train.clip)."""

from __future__ import annotations

import pytest
import torch

from ecomkit.train.clip import clip_values_per_global_batch, sentiment_clip_value, sentiment_strength


def test_the_rule_spans_half_to_one_and_a_half():
    assert sentiment_clip_value(sentiment_strength(torch.tensor([0, 0]))) == 0.5
    assert sentiment_clip_value(sentiment_strength(torch.tensor([1, -1]))) == 1.5
    assert sentiment_clip_value(5.0) == 1.5


def test_clip_values_join_the_ranks_micro_batches_of_each_step():
    polarity = torch.tensor([1, 0, -1, 0, 1, 1, 0, 0])
    rank0, rank1 = [[0, 1], [4, 5]], [[2, 3], [6, 7]]   # step 1: samples 0-3 (2 polar), step 2: 4-7 (2 polar)
    assert clip_values_per_global_batch(polarity, [rank0, rank1]) == pytest.approx([1.0, 1.0])
    assert clip_values_per_global_batch(polarity, [[[0, 2]], [[4, 5]]]) == pytest.approx([1.5])
    assert clip_values_per_global_batch(polarity, [[[1]], [[3]]]) == pytest.approx([0.5])
