"""benchmarks/gpu_bench.py must pass its CPU dry run (tiny model, a few steps) where no GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_bench_dry_run_writes_a_complete_report(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_bench.py"), "--dry-run", "--scripts", "ddp",
                           "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] is True
    assert report["environment"]["date"] and report["environment"]["device"].startswith("CPU")
    rows = {r["attn"]: r for r in report["attention"]}
    assert rows["eager"]["status"] == rows["sdpa"]["status"] == "ok"
    for r in (rows["eager"], rows["sdpa"]):
        assert r["tokens_per_s"] > 0 and r["mfu"] is None  # no peak FLOP/s for a CPU
    # same seed, same data, same steps: the two paths must train identically
    assert abs(rows["sdpa"]["final_loss"] - rows["eager"]["final_loss"]) <= 1e-5 * abs(rows["eager"]["final_loss"])
    assert rows["flex"]["status"] == "skipped" and "CPU" in rows["flex"]["reason"]
    (ddp,) = report["scripts"]
    assert ddp["status"] == "ok", ddp
    assert ddp["samples_per_s"] > 0 and ddp["world_size"] == 1
    assert report["goal"]["verdict"].startswith("n/a")
