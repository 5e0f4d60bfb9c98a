"""``--attn auto``: the rule, its crossover function, and its constant against the committed measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecomkit.config import TrainConfig
from ecomkit.errors import ConfigError
from ecomkit.models.attention_rule import CPU_EAGER_MAX_SEQ, eager_max_seq, pick_attention

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def rows(precision: str, times: dict[int, tuple[float, float]]) -> list[dict]:
    """Two repeats per length: (eager, sdpa) step times, the second repeat 10 % slower on both sides."""
    return [{"precision": precision, "seq": seq, "attn": attn, "step_s": t * f}
            for seq, pair in times.items() for f in (1.0, 1.1) for attn, t in zip(("eager", "sdpa"), pair)]


def test_crossover_is_the_last_length_of_the_first_unbroken_eager_run():
    r = rows("bf16", {64: (1.0, 1.2), 128: (1.0, 1.1), 256: (1.0, 0.9), 512: (1.0, 1.5)})
    assert eager_max_seq(r, "bf16") == 128       # 512 is faster again, but after a loss: not counted
    assert eager_max_seq(r, "fp32") == 0         # no rows of that precision
    assert eager_max_seq(rows("bf16", {64: (1.0, 1.0)}), "bf16") == 0   # a tie is not a win
    assert eager_max_seq(rows("bf16", {64: (1.0, 1.04)}), "bf16") == 0  # nor a gain within EAGER_MIN_GAIN
    assert eager_max_seq(rows("bf16", {64: (1.0, 1.04)}), "bf16", min_gain=0.0) == 64


def test_crossover_refuses_a_length_measured_on_one_side_only():
    with pytest.raises(ValueError, match="no sdpa rows"):
        eager_max_seq([{"precision": "bf16", "seq": 64, "attn": "eager", "step_s": 1.0}])


def test_rule_by_device_precision_and_length():
    limits = {"bf16": 256, "fp32": 0}
    assert pick_attention("auto", "bf16", "cpu", 128, limits)[0] == "eager"
    assert pick_attention("auto", "bf16", "cpu", 256, limits)[0] == "eager"
    assert pick_attention("auto", "bf16", "cpu", 512, limits)[0] == "sdpa"
    assert pick_attention("auto", "fp32", "cpu", 64, limits)[0] == "sdpa"
    assert pick_attention("auto", "bf16", "cuda", 64, limits)[0] == "sdpa"
    assert pick_attention("eager", "fp32", "cuda", 4096, limits) == ("eager", "--attn eager as asked")
    impl, why = pick_attention("auto", "bf16", "cpu", 512, limits)
    assert "512" in why and "256" in why


def test_auto_is_the_default_and_validated():
    assert TrainConfig().attn == "auto"
    TrainConfig(attn="auto").validate(2)
    with pytest.raises(ConfigError, match="attn"):
        TrainConfig(attn="fast").validate(2)


def test_constant_is_the_committed_measurement():
    """CPU_EAGER_MAX_SEQ equals eager_max_seq of the newest bench_attn_rule artifact, per precision measured."""
    paths = sorted(RESULTS.glob("bench_attn_rule-*.json"), key=lambda p: json.loads(p.read_text())["time_utc"])
    assert paths, "no bench_attn_rule artifact: run python benchmarks/bench_attn_rule.py"
    doc = json.loads(paths[-1].read_text())
    measured = doc["extra"]["measurements"]
    for precision in sorted({r["precision"] for r in measured}):
        assert CPU_EAGER_MAX_SEQ[precision] == eager_max_seq(measured, precision), (precision, paths[-1].name)
