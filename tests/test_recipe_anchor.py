"""Full fine-tuning's small lr anchor is what ``bench_transfer`` measured (``ecomlab.derive.recipe``).

The core keeps the anchor as a constant (``ecomkit.config.recipe.FULL_FT_ANCHORS``); these tests hold it equal to
the derivation on the newest committed artifact, and hold the derivation's "learned" to the noise of its evaluation.
"""

from __future__ import annotations

import json

import pytest

from ecomkit.config.recipe import FULL_FT_ANCHORS
from ecomkit.models.bloom import preset_parameter_count
from ecomkit.models.tokenizer import get_tokenizer
from ecomlab.artifacts import newest_artifacts, results_dir
from ecomlab.derive.recipe import learned, lowest_learning_lr


def _artifact(rows: list[dict], eval_samples: int = 64) -> dict:
    return {"extra": {"sizes": {"model": "tiny", "eval_samples": eval_samples}}, "rows": rows}


def _row(lr: float, acc: float, majority: float = 0.26, pretrained: bool = True) -> dict:
    return {"lr": lr, "pretrained": pretrained, "acc_category": acc, "majority_category": majority,
            "acc_sentiment": 0.72, "majority_sentiment": 0.72}


def test_learned_means_beyond_the_majority_baselines_noise():
    assert not learned(0.30, 0.26, 64)        # +0.04 over 64 records: within two standard errors (0.11)
    assert learned(0.40, 0.26, 64)
    assert learned(0.30, 0.26, 2000)          # the same margin over 2,000 records is beyond the noise
    assert not learned(0.72, 0.72, 64)        # the majority label itself


def test_the_lowest_learning_lr_skips_lrs_within_noise_and_runs_from_scratch():
    rows = [_row(1e-4, 0.24), _row(3e-4, 0.30), _row(1e-3, 1.0), _row(3e-3, 1.0), _row(3e-3, 0.9, pretrained=False),
            _row(1e-5, 0.9, pretrained=False)]
    assert lowest_learning_lr(_artifact(rows)) == 1e-3
    assert lowest_learning_lr(_artifact(rows, eval_samples=5000)) == 3e-4    # with more records 3e-4's +0.04 counts
    with pytest.raises(ValueError, match="no fine-tuning lr"):
        lowest_learning_lr(_artifact(rows[:2]))


def test_the_small_full_fine_tuning_anchor_is_what_bench_transfer_measured():
    path = newest_artifacts(results_dir()).get("bench_transfer")
    assert path is not None, "no bench_transfer artifact: python benchmarks/bench_transfer.py writes one"
    doc = json.loads(path.read_text())
    n_params = preset_parameter_count(doc["extra"]["sizes"]["model"], len(get_tokenizer("local")))
    assert FULL_FT_ANCHORS[0] == (n_params, lowest_learning_lr(doc)), path.name
