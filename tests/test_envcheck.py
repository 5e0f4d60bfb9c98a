"""Tests for chapter 01: environment lint, bandwidth arithmetic, all-reduce check, the script."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from conftest import load_module, run_script

from ecomkit.dist import DistEnv
from ecomkit.envcheck.collectives import (bus_bandwidth, check_all_reduce, format_bandwidth,
                                          measure_local_copy_bandwidth, parse_size, size_range)
from ecomkit.envcheck.lint import lint_env, probe_machine
from ecomkit.envcheck.run import run_env_check
from ecomkit.envcheck.system import system_report
from ecomkit.envcheck.lint import _has_infiniband
from ecomkit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "01_env_check.py"

# A big 8-GPU NVLink + InfiniBand node, set up well.
BIG_NODE = dict(n_cpus=32, n_gpus=8, local_world_size=8, has_infiniband=True, has_nvlink=True,
                interfaces=["lo", "eth0", "ib0"])
CLEAN_ENV = {"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
             "NCCL_SOCKET_IFNAME": "eth0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def lint(extra: dict[str, str], **machine) -> dict[str, str]:
    """Lint CLEAN_ENV + extra on BIG_NODE (overridable); return {variable: severity}."""
    facts = {**BIG_NODE, **machine}
    return {f.variable: f.severity for f in lint_env({**CLEAN_ENV, **extra}, **facts)}


# ---------------------------------------------------------------- lint_env

def test_clean_env_on_big_node_has_no_findings():
    assert lint_env(CLEAN_ENV, **BIG_NODE) == []


@pytest.mark.parametrize("extra, variable, severity", [
    ({"NCCL_P2P_DISABLE": "1"}, "NCCL_P2P_DISABLE", "error"),
    ({"NCCL_P2P_LEVEL": "LOC"}, "NCCL_P2P_LEVEL", "error"),
    ({"NCCL_IB_DISABLE": "1"}, "NCCL_IB_DISABLE", "error"),
    ({"NCCL_SOCKET_IFNAME": "=eth1"}, "NCCL_SOCKET_IFNAME", "error"),
    ({"NCCL_SOCKET_IFNAME": "^eth,lo,ib"}, "NCCL_SOCKET_IFNAME", "error"),
    ({"GLOO_SOCKET_IFNAME": "enp3s0"}, "GLOO_SOCKET_IFNAME", "error"),
    ({"NCCL_DEBUG": "INFO"}, "NCCL_DEBUG", "warning"),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "warning"),
    ({"NCCL_BLOCKING_WAIT": "1"}, "NCCL_BLOCKING_WAIT", "info"),
    ({"NCCL_SOCKET_TIMEOUT": "1800"}, "NCCL_SOCKET_TIMEOUT", "info"),
    ({"CUDA_LAUNCH_BLOCKING": "1"}, "CUDA_LAUNCH_BLOCKING", "warning"),
    ({"OMP_NUM_THREADS": "8"}, "OMP_NUM_THREADS", "warning"),
    ({"OMP_NUM_THREADS": "zero"}, "OMP_NUM_THREADS", "error"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,1,2"}, "CUDA_VISIBLE_DEVICES", "error"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES", "warning"),
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "TORCH_DISTRIBUTED_DEBUG", "warning"),
    ({"NCCL_SHM_DISABLE": "1"}, "NCCL_SHM_DISABLE", "warning"),
])
def test_each_hazard_is_detected(extra, variable, severity):
    assert lint(extra).get(variable) == severity


def test_unset_omp_warns_only_with_several_local_processes():
    env = {k: v for k, v in CLEAN_ENV.items() if k != "OMP_NUM_THREADS"}
    by_var = lambda **m: {f.variable: f.severity for f in lint_env(env, **{**BIG_NODE, **m})}
    assert by_var()["OMP_NUM_THREADS"] == "warning"
    assert by_var(local_world_size=1)["OMP_NUM_THREADS"] == "info"


def test_severity_depends_on_the_machine():
    """The same variable is an error where it hurts and info where it changes nothing."""
    one_gpu = dict(n_gpus=1, local_world_size=1, has_infiniband=False, has_nvlink=False)
    assert lint({"NCCL_P2P_DISABLE": "1"}, **one_gpu)["NCCL_P2P_DISABLE"] == "info"
    assert lint({"NCCL_P2P_DISABLE": "1"}, has_nvlink=None)["NCCL_P2P_DISABLE"] == "warning"
    assert lint({"NCCL_IB_DISABLE": "1"}, **one_gpu)["NCCL_IB_DISABLE"] == "info"
    assert lint({"CUDA_LAUNCH_BLOCKING": "1"}, n_gpus=0)["CUDA_LAUNCH_BLOCKING"] == "info"


@pytest.mark.parametrize("spec", ["eth", "=eth0", "^lo", "ib0,eth9", "^=docker0"])
def test_socket_ifname_that_matches_is_fine(spec):
    assert "NCCL_SOCKET_IFNAME" not in lint({"NCCL_SOCKET_IFNAME": spec})


def test_socket_ifname_not_checked_when_interfaces_unknown():
    assert "NCCL_SOCKET_IFNAME" not in lint({"NCCL_SOCKET_IFNAME": "=nope0"}, interfaces=None)


def test_guide_nccl_exports_are_errors_on_an_nvlink_infiniband_node():
    """The EcomGPT guide exports these for speed; on the hardware it describes two of them hurt."""
    guide = {"NCCL_SOCKET_TIMEOUT": "1800", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1",
             "NCCL_SHM_DISABLE": "0", "NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "4"}
    found = {f.variable: f.severity for f in lint_env(guide, **BIG_NODE)}
    assert found == {"NCCL_P2P_DISABLE": "error", "NCCL_IB_DISABLE": "error",
                     "NCCL_SOCKET_TIMEOUT": "info", "NCCL_ASYNC_ERROR_HANDLING": "info"}


def test_findings_are_sorted_errors_first_and_explained():
    findings = lint_env({"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1", "NCCL_BLOCKING_WAIT": "1"}, **BIG_NODE)
    sev = [f.severity for f in findings]
    assert sev == sorted(sev, key=["error", "warning", "info"].index)
    assert all(len(f.message) > 40 for f in findings)


def test_probe_machine_is_cheap_and_sane(tmp_path):
    m = probe_machine(local_world_size=2)
    assert m.n_cpus >= 1 and m.local_world_size == 2
    assert m.n_gpus == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert _has_infiniband(tmp_path / "absent") is False
    (tmp_path / "ib" / "mlx5_0").mkdir(parents=True)
    assert _has_infiniband(tmp_path / "ib") is True


# ---------------------------------------------------------------- sizes and bandwidth arithmetic

def test_bus_bandwidth_matches_nccl_tests_formula():
    assert bus_bandwidth(10.0, 2) == pytest.approx(10.0)
    assert bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert bus_bandwidth(10.0, 1) == 0.0
    assert bus_bandwidth(10.0, 4, "all_gather") == pytest.approx(7.5)


def test_size_range_and_parse_size():
    sizes = size_range("1K:64M", 4)
    assert sizes[0] == 1024 and sizes[-1] == 64 * 2**20 and len(sizes) == 9
    assert size_range("1K:8K", 2) == [1024, 2048, 4096, 8192]
    assert parse_size("3") == 3 and parse_size("2MiB") == 2 * 2**20
    for bad in ("64M:1K", "1K", "1X:2M", "1K:2M:3"):
        with pytest.raises(ConfigError):
            size_range(bad)


def test_local_copy_rows_are_labelled_and_have_no_bus_bandwidth():
    rows = measure_local_copy_bandwidth([1024, 2**20], iters=3, device=torch.device("cpu"))
    assert [r.size_bytes for r in rows] == [1024, 2**20]
    assert all(r.busbw_gbps is None and r.algbw_gbps > 0 and r.time_us > 0 for r in rows)
    assert "NOT an interconnect" in format_bandwidth(rows, "local_copy")


# ---------------------------------------------------------------- all-reduce check with simulated ranks

def simulated_all_reduce(n: int, drop_rank: int | None = None):
    """n threads act as ranks; reduce(rank) returns an all_reduce that really sums their tensors.

    ``drop_rank`` simulates a broken transport that loses one rank's contribution.
    """
    barrier, slots = threading.Barrier(n), {}

    def for_rank(r: int):
        def reduce(t: torch.Tensor) -> None:
            slots[r] = t.clone()
            barrier.wait()
            total = sum(slots[k] for k in range(n) if k != drop_rank)
            barrier.wait()
            t.copy_(total)
        return reduce
    return for_rank


def run_ranks(n: int, drop_rank: int | None = None):
    make, results = simulated_all_reduce(n, drop_rank), {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, check_all_reduce(r, n, torch.device("cpu"), all_reduce=make(r)))) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return [results[r] for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_check_passes_on_a_correct_reduce(n):
    checks = run_ranks(n)
    assert all(c.passed and not c.skipped for c in checks)
    assert len(checks[0].cases) == 3


def test_all_reduce_check_fails_on_a_broken_reduce():
    checks = run_ranks(3, drop_rank=2)
    assert not any(c.passed for c in checks)
    assert not any(checks[0].cases.values())
    identity = check_all_reduce(0, 2, torch.device("cpu"), all_reduce=lambda t: None)
    assert not identity.passed


# ---------------------------------------------------------------- orchestration and the script

def test_run_env_check_single_process_is_labelled():
    out = []
    result = run_env_check(DistEnv(), [1024, 4096], iters=2, echo=out.append)
    assert result["ok"] and result["all_reduce"]["skipped"] and result["alpha_beta"] is None
    assert result["bandwidth"]["kind"] == "local_copy" and len(result["bandwidth"]["rows"]) == 2
    assert set(result["report"]) == set(system_report()) == {"host", "versions", "libraries", "devices", "cpu"}
    assert any("SKIPPED" in s for s in out) and any("NOT an interconnect" in s for s in out)
    json.dumps(result)  # JSON-ready


def _load_script():
    return load_module(SCRIPT, "env_check_script")


def test_script_exits_non_zero_when_the_check_fails(monkeypatch):
    mod = _load_script()
    monkeypatch.setattr(mod, "run_env_check", lambda env, sizes, iters: {"ok": False})
    assert mod.main(["--sizes", "1K:4K"]) == 1
    monkeypatch.setattr(mod, "run_env_check", lambda env, sizes, iters: {"ok": True})
    assert mod.main(["--sizes", "1K:4K"]) == 0


def test_script_bad_sizes_is_a_user_error():
    proc = run_script("01_env_check.py", ["--sizes", "64M:1K"], timeout=60, check=False)
    assert proc.returncode == 2
    assert "--sizes" in proc.stderr and "Traceback" not in proc.stderr


def test_script_plain_python_writes_json(tmp_path):
    out = tmp_path / "env.json"
    run_script("01_env_check.py", ["--sizes", "1K:1M", "--json-out", str(out)], timeout=60)
    data = json.loads(out.read_text())
    assert data["world_size"] == 1 and data["bandwidth"]["kind"] == "local_copy"
    assert "torch" in data["report"]["versions"] and "deepspeed" in data["report"]["libraries"]


@pytest.mark.dist
def test_script_under_torchrun_two_gloo_ranks(tmp_path):
    out = tmp_path / "env.json"
    proc = run_script("01_env_check.py", ["--json-out", str(out)], nproc=2, timeout=90, torchrun=True)
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["backend"] == "gloo" and data["ok"]
    assert data["all_reduce"]["passed"] and not data["all_reduce"]["skipped"]
    assert all(data["all_reduce"]["cases"].values())
    rows = data["bandwidth"]["rows"]
    assert data["bandwidth"]["kind"] == "all_reduce"
    assert [r["size_bytes"] for r in rows] == size_range("1K:64M", 4)
    for r in rows:  # n = 2: busbw = algbw * 2(n-1)/n = algbw
        assert r["algbw_gbps"] > 0 and r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])
    assert "all-reduce check: PASS" in proc.stdout
    fit = data["alpha_beta"]     # the α-β line through the sweep, printed with its residual
    assert fit["world_size"] == 2 and fit["alpha_s"] > 0 and fit["bus_bytes_per_s"] > 0
    assert len(fit["samples"]) == len(rows) and fit["rms_residual"] >= 0 and "α-β fit (all_reduce" in proc.stdout
