"""benchmarks/gpu_check.sh: on a CPU with --dry-run it installs a wheel folder into a temporary target, imports
what the benchmarks need, and runs bench_attn_rule's and gpu_bench's dry runs into --out, with its log.

The wheel folder here is one small wheel made by the test (the real one, benchmarks/gpu_wheels.sh's, is ~70 MB
and needs PyPI); the packages the check imports come from this environment. gpu_bench runs one cheap part
(--parts all_reduce: chapter 01's sweep, launched under torchrun by ``gpu_jobs.launch``): its full dry run is
tests/test_attention_gpu_bench.py's, with every launch forked from the suite's preloaded server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def make_wheel(folder: Path, name: str = "ecomkit_probe_pkg", version: str = "0.1") -> Path:
    """A minimal pure-Python wheel: a package whose module says where it was imported from."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "WHERE = __file__\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{info}/top_level.txt": f"{name}\n"}
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, text in files.items():
            zf.writestr(p, text)
    return path


@pytest.mark.dist
def test_dry_run_installs_the_wheels_into_a_target_and_runs_the_benchmarks(tmp_path):
    make_wheel(tmp_path / "wheels")
    target, out = tmp_path / "site", tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHON": os.environ.get(
        "PYTHON", str(Path(os.sys.executable)))}
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--wheels", str(tmp_path / "wheels"), "--target",
                           str(target), "--out", str(out), "--parts", "all_reduce"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (target / "ecomkit_probe_pkg" / "__init__.py").exists()                   # installed into the target
    assert re.search(r"ok +ecomkit_probe_pkg +from the wheel folder: " + re.escape(str(target)), proc.stdout)
    for name in ("datasets", "deepspeed", "peft", "ecomkit", "ecomlab"):
        assert f"  ok       {name}" in proc.stdout
    assert "skipped  liger_kernel" in proc.stdout or "ok       liger_kernel" in proc.stdout
    (rule,) = out.glob("bench_attn_rule-*.json")
    (bench,) = out.glob("gpu_bench-*.json")
    assert json.loads(rule.read_text())["extra"]["dry_run"] is True
    doc = json.loads(bench.read_text())
    assert doc["extra"]["dry_run"] is True and [(r["part"], r["status"]) for r in doc["rows"]] == [("all_reduce", "ok")]
    assert doc["rows"][0]["nproc"] == 2 and doc["rows"][0]["best_busbw_gbps"] > 0
    assert "== 4b. gpu_bench" in (out / "gpu_check.log").read_text()


def test_without_a_wheel_folder_it_says_how_to_build_one(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--wheels", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "benchmarks/gpu_wheels.sh --out DIR" in proc.stderr
