"""Two processes: the planner against what ranks really hold (the time model: tests/test_calibration.py)."""

from __future__ import annotations

import json

import pytest

from conftest import run_script

# DeepSpeed keeps a few scalar tensors next to the partitions (global grad norm, overflow flag, Adam step):
# 12-17 bytes here. The planner does not model them; everything else must match to the byte.
SCALAR_BOOKKEEPING_BYTES = 64


@pytest.mark.dist
@pytest.mark.slow
def test_planned_model_states_equal_measured_for_every_strategy(tmp_path):
    out = tmp_path / "states"
    run_script("06_memory_tuning.py", ["states", "--output-dir", str(out)], nproc=2, timeout=240)
    rows = json.loads((out / "states_fp32.json").read_text())
    assert {r["strategy"] for r in rows} == {"ddp", "zero1", "zero2", "zero3", "fsdp2"}
    assert len(rows) == 10
    for r in rows:
        for part in ("params", "grads", "optimizer"):
            diff = r[part] - r[f"planned_{part}"]
            assert 0 <= diff <= SCALAR_BOOKKEEPING_BYTES, (r["strategy"], r["rank"], part, r[part], r[f"planned_{part}"])
        if r["strategy"] in ("ddp", "fsdp2"):
            assert r["difference_bytes"] == 0, r
    by = {(r["strategy"], r["rank"]): r["measured_total"] for r in rows}
    assert by[("fsdp2", 0)] != by[("fsdp2", 1)]        # odd vocabulary: uneven shards, still planned exactly
    assert by[("zero3", 0)] < by[("zero2", 0)] < by[("ddp", 0)]
