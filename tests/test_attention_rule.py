"""``--attn auto``: the rule, its crossover function, and its constant against the committed measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ecomkit.config import TrainConfig
from ecomkit.errors import ConfigError
from ecomkit.hardware import gpu_kind
from ecomkit.models.attention import CPU_EAGER_MAX_SEQ, GPU_EAGER_MAX_SEQ, pick_attention
from ecomlab.derive.attention import eager_max_seq

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


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
    assert pick_attention("auto", "bf16", "cuda", 64, limits, gpu_kind="h200", gpu_eager_max_seq={})[0] == "sdpa"
    assert pick_attention("eager", "fp32", "cuda", 4096, limits) == ("eager", "--attn eager as asked")
    impl, why = pick_attention("auto", "bf16", "cpu", 512, limits)
    assert "512" in why and "256" in why


def test_auto_is_the_default_and_validated():
    assert TrainConfig().attn == "auto"
    TrainConfig(attn="auto").validate(2)
    with pytest.raises(ConfigError, match="attn"):
        TrainConfig(attn="fast").validate(2)


def artifacts() -> list[tuple[Path, dict]]:
    """Every committed bench_attn_rule artifact, oldest first (a dry run never writes there)."""
    docs = [(p, json.loads(p.read_text())) for p in RESULTS.glob("bench_attn_rule-*.json")]
    return sorted(docs, key=lambda d: d[1]["time_utc"])


def test_constant_is_the_committed_measurement():
    """CPU_EAGER_MAX_SEQ equals eager_max_seq of the newest CPU bench_attn_rule artifact, per precision measured."""
    cpu = [(p, d) for p, d in artifacts() if not d.get("gpu")]
    assert cpu, "no CPU bench_attn_rule artifact: run python benchmarks/bench_attn_rule.py on a CPU machine"
    path, doc = cpu[-1]
    measured = doc["extra"]["measurements"]
    for precision in sorted({r["precision"] for r in measured}):
        assert CPU_EAGER_MAX_SEQ[precision] == eager_max_seq(measured, precision), (precision, path.name)


def test_gpu_table_is_the_committed_gpu_measurement_or_the_unmeasured_fallback():
    """GPU_EAGER_MAX_SEQ[kind] is eager_max_seq of the newest GPU artifact of that kind; with none, auto is sdpa
    on every GPU and says that the choice is unmeasured there."""
    newest: dict[str, dict] = {}
    for _, doc in artifacts():
        if doc.get("gpu") and not doc["extra"].get("dry_run"):
            newest[gpu_kind(doc["gpu"])] = doc          # oldest first: the last one of a kind stays
    expected = {kind: {p: eager_max_seq(doc["extra"]["measurements"], p)
                       for p in sorted({r["precision"] for r in doc["extra"]["measurements"]})}
                for kind, doc in newest.items()}
    assert GPU_EAGER_MAX_SEQ == expected
    if not expected:
        impl, why = pick_attention("auto", "bf16", "cuda", 64, gpu_kind="h200")
        assert impl == "sdpa" and "unmeasured on this GPU (h200)" in why


def test_gpu_rule_reads_the_measurement_of_its_kind():
    table = {"h200": {"bf16": 256}}
    impl, why = pick_attention("auto", "bf16", "cuda", 128, gpu_kind="h200", gpu_eager_max_seq=table)
    assert impl == "eager" and "on h200" in why
    assert pick_attention("auto", "bf16", "cuda", 1024, gpu_kind="h200", gpu_eager_max_seq=table)[0] == "sdpa"
    assert pick_attention("auto", "fp32", "cuda", 64, gpu_kind="h200", gpu_eager_max_seq=table)[0] == "sdpa"
    impl, why = pick_attention("auto", "bf16", "cuda", 64, gpu_kind="a100-80g", gpu_eager_max_seq=table)
    assert impl == "sdpa" and "unmeasured on this GPU (a100-80g)" in why


def test_crossover_needs_eager_to_win_at_every_micro_batch_of_a_length():
    both = [{"precision": "bf16", "seq": seq, "batch": b, "attn": a, "step_s": t}
            for seq, b, te, ts in ((64, 8, 1.0, 1.5), (64, 16, 1.0, 1.3), (128, 8, 1.0, 1.5), (128, 16, 1.0, 1.0))
            for a, t in (("eager", te), ("sdpa", ts))]
    assert eager_max_seq(both, "bf16") == 64      # at 128, micro-batch 16 is a tie


@pytest.mark.dist
def test_gpu_settings_dry_run_writes_both_micro_batches_with_padding(tmp_path):
    """bench_attn_rule's GPU code path (padded catalog-like rows, two micro-batches, autocast) on a CPU, tiny."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_attn_rule.py"), "--dry-run", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (path,) = tmp_path.glob("bench_attn_rule-*.json")
    doc = json.loads(path.read_text())
    assert doc["extra"]["dry_run"] is True and doc["extra"]["device"] == "cpu"
    assert {(r["seq"], r["batch"]) for r in doc["rows"]} == {(32, 2), (32, 4), (64, 2), (64, 4)}
    assert all(0 <= r["padding"] < 0.5 and r["eager_step_s"] > 0 for r in doc["rows"])
    assert any(r["padding"] > 0 for r in doc["rows"])
    assert set(doc["extra"]["eager_max_seq"]) == {"bf16"}
    assert not any("CPU_EAGER_MAX_SEQ" in n for n in doc["extra"]["notes"])
