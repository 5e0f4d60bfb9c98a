"""benchmarks/gpu_bench.py: its CPU dry run (tiny model, two gloo processes) runs every part's code path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.dist
def test_gpu_bench_dry_run_writes_a_complete_artifact(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_bench.py"), "--dry-run", "--strategies", "ddp",
                           "--out", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("gpu_bench-*-cpu*.json")  # written by benchmarks/common.write_artifact
    doc = json.loads(path.read_text())
    assert doc["bench"] == "gpu_bench" and doc["extra"]["dry_run"] is True and doc["load_before"] is not None
    assert doc["extra"]["preflight"]["missing"] == []  # this environment has datasets and deepspeed
    parts = {}
    for r in doc["rows"]:
        parts.setdefault(r["part"], []).append(r)
    (ar,) = parts["all_reduce"]
    assert ar["status"] == "ok" and ar["backend"] == "gloo" and ar["nproc"] == 2 and ar["best_busbw_gbps"] > 0
    rows = {r["attn"]: r for r in parts["attention"]}
    assert rows["eager"]["status"] == rows["sdpa"]["status"] == "ok"
    for r in (rows["eager"], rows["sdpa"]):
        assert r["tokens_per_s"] > 0 and r["mfu"] is None  # no peak FLOP/s for a CPU
    # same seed, same data, same steps: the two paths must train identically
    assert abs(rows["sdpa"]["final_loss"] - rows["eager"]["final_loss"]) <= 1e-5 * abs(rows["eager"]["final_loss"])
    assert rows["flex"]["status"] == "skipped" and "CPU" in rows["flex"]["reason"]
    assert [(r["head_dim"], r["padded_to"]) for r in parts["head_dim"]] == [(64, 72), (128, 136)]
    assert all(r["ms"] > 0 and r["padded_ms"] > 0 for r in parts["head_dim"])
    (ddp,) = parts["strategy"]
    assert ddp["status"] == "ok", ddp
    assert ddp["samples_per_s"] > 0 and ddp["world_size"] == 2
    (scaling,) = doc["extra"]["scaling"]  # what ecomkit.claims reads from a GPU report
    assert (scaling["model"], scaling["strategy"], scaling["gpus"]) == ("tiny", "ddp", 2)
    assert scaling["samples_per_s"] == ddp["samples_per_s"]
    assert doc["extra"]["goal"]["verdict"].startswith("n/a")
    cases = {r["case"]: r for r in parts["packing"]}           # the catalog job: bucketed, packed, HF Trainer
    assert set(cases) == {"catalog bucketed", "catalog packed", "catalog HF Trainer"}
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in cases.values()), cases
    assert cases["catalog packed"]["fill_rate"] > cases["catalog bucketed"]["fill_rate"] - 0.1
    assert cases["catalog packed"]["seq_len"] == 256 and {r["case"] for r in parts["packing_ratio"]} == {
        "packed / catalog bucketed", "packed / catalog HF Trainer"}


def test_preflight_names_what_is_missing(monkeypatch):
    """Without deepspeed the ZeRO-3 row is skipped with the install line; nothing is installed."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_bench

    real = gpu_bench.importlib.util.find_spec
    monkeypatch.setattr(gpu_bench.importlib.util, "find_spec", lambda name: None if name == "deepspeed" else real(name))
    pre = gpu_bench.preflight(on_gpu=False, dry_run=False)
    assert pre["deepspeed"] is False
    assert any(m.startswith("no CUDA GPU visible") for m in pre["missing"])
    assert any("deepspeed is not installed: zero3, zero3+lora skipped (pip install deepspeed)" == m for m in pre["missing"])
    st = gpu_bench.settings(gpu_bench.parse_args(["--dry-run"]), on_gpu=False, n_gpus=0)
    row = gpu_bench.strategy_case("zero3", st, pre, "sdpa", "fp32", timeout_s=1, nproc=2)
    assert row["status"] == "skipped" and "pip install deepspeed" in row["reason"]
