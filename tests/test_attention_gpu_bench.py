"""benchmarks/gpu_bench.py: its CPU dry run (tiny model, two gloo processes) runs every part's code path.

On a GPU every training row runs at least 8 untimed and 30 timed steps, within an 8-minute default budget
(checked on the settings); here the same code runs a few steps of a tiny model, and the planner's prediction
sits beside every training row. The dry run runs in this process, and its launches (``gpu_jobs.launch``: a
script under ``python``, or torchrun for 2 processes) start from the suite's preloaded server
(:mod:`fastlaunch`), as every launch of the suite does. ``launch`` itself runs a script under ``python`` in
``test_launch_runs_a_one_process_script_under_python``, and under torchrun in tests/test_gpu_check.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_bench  # noqa: E402
import gpu_jobs  # noqa: E402

PLAN_KEYS = ("plan_gpu", "plan_bytes", "plan_step_s", "plan_compute_s", "plan_other_s")


def forked_launch(nproc: int, script: str, args: list[str], timeout_s: float, tmp: Path) -> subprocess.CompletedProcess:
    """``gpu_jobs.launch``'s run through the suite's launcher: the same script, arguments and environment."""
    return run_script(script, args, nproc=0 if nproc == 1 else nproc, timeout=int(timeout_s), check=False,
                      extra_env={**gpu_jobs._env(), "TMPDIR": str(tmp)})


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-bench")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu_jobs, "launch", forked_launch)
        patch.setattr(gpu_bench, "launch", forked_launch)
        assert gpu_bench.main(["--dry-run", "--strategies", "ddp", "--out", str(out)]) == 0
    (path,) = out.glob("gpu_bench-*-cpu*.json")  # written by benchmarks/common.write_artifact
    doc = json.loads(path.read_text())
    parts: dict[str, list[dict]] = {}
    for r in doc["rows"]:
        parts.setdefault(r["part"], []).append(r)
    return doc, parts


def test_launch_runs_a_one_process_script_under_python(tmp_path):
    one = gpu_jobs.launch(1, "01_env_check.py", ["--help"], 120, tmp_path)
    assert one.returncode == 0 and "usage:" in one.stdout, one.stderr[-2000:]
    assert one.args[:2] == [sys.executable, str(REPO / "scripts" / "01_env_check.py")]


@pytest.mark.dist
def test_gpu_bench_dry_run_writes_a_complete_artifact(dry_run):
    doc, parts = dry_run
    assert doc["bench"] == "gpu_bench" and doc["extra"]["dry_run"] is True and doc["load_before"] is not None
    assert doc["extra"]["preflight"]["missing"] == []  # this environment has datasets and deepspeed
    (ar,) = parts["all_reduce"]
    assert ar["status"] == "ok" and ar["backend"] == "gloo" and ar["nproc"] == 2 and ar["best_busbw_gbps"] > 0
    # attention at two micro-batches, the chunked loss as the loop trains
    for batch in (2, 4):
        rows = {r["attn"]: r for r in parts["attention"] if r["batch"] == batch}
        assert rows["eager"]["status"] == rows["sdpa"]["status"] == "ok"
        for r in (rows["eager"], rows["sdpa"]):
            assert r["tokens_per_s"] > 0 and r["mfu"] is None and r["loss_kernel"] == "chunked"
        # same seed, same data, same steps: the two paths must train identically
        assert abs(rows["sdpa"]["final_loss"] - rows["eager"]["final_loss"]) <= 1e-5 * abs(rows["eager"]["final_loss"])
        assert rows["flex"]["status"] == "skipped" and "CPU" in rows["flex"]["reason"]
    kernels = {r["loss_kernel"]: r for r in parts["loss_kernel"]}
    assert kernels["chunked"]["status"] == kernels["full"]["status"] == "ok"
    assert abs(kernels["full"]["final_loss"] - kernels["chunked"]["final_loss"]) <= 1e-5 * kernels["full"]["final_loss"]
    assert all(kernels[k]["status"] == "skipped" and "CUDA only" in kernels[k]["reason"] for k in ("liger", "cce"))
    assert "loss_kernel_pick" not in parts         # auto's measurement is a GPU's, never a dry run's
    assert [(r["head_dim"], r["padded_to"]) for r in parts["head_dim"]] == [(64, 72), (128, 136)]
    assert all(r["ms"] > 0 and r["padded_ms"] > 0 for r in parts["head_dim"])


@pytest.mark.dist
def test_dry_run_jobs_pair_ecomkit_with_hf_trainer_and_the_planner(dry_run):
    doc, parts = dry_run
    long = {r["case"]: r for r in parts["long_rows"]}
    assert long["long ecomkit"]["status"] == long["long HF Trainer"]["status"] == "ok", long
    assert long["long ecomkit"]["seq_len"] == 256 and long["long ecomkit"]["tokens_per_s"] > 0
    for name in ("long ecomkit compiled", "long HF Trainer compiled"):
        assert long[name]["status"] == "skipped" and "dry run" in long[name]["reason"]
    (compile_row,) = parts["compile"]
    assert compile_row["status"] == "skipped"
    (ratio,) = parts["long_rows_ratio"]
    assert ratio["case"] == "long ecomkit / long HF Trainer" and ratio["verdict"] == "n/a (dry run)"
    cases = {r["case"]: r for r in parts["packing"]}           # the catalog job: bucketed, packed, HF Trainer
    assert set(cases) == set(gpu_jobs.PACKING_CASES)
    ran = [cases[c] for c in ("catalog bucketed", "catalog packed", "catalog HF Trainer")]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in ran), cases
    assert cases["catalog packed"]["fill_rate"] > cases["catalog bucketed"]["fill_rate"] - 0.1
    assert cases["catalog packed"]["seq_len"] == 256 and {r["case"] for r in parts["packing_ratio"]} == {
        "catalog packed / catalog bucketed", "catalog packed / catalog HF Trainer"}
    (ddp,) = parts["strategy"]
    assert ddp["status"] == "ok", ddp
    assert ddp["samples_per_s"] > 0 and ddp["world_size"] == 2
    (scaling,) = doc["extra"]["scaling"]  # what ecomlab.claims reads from a GPU report
    assert (scaling["model"], scaling["strategy"], scaling["gpus"]) == ("tiny", "ddp", 2)
    assert scaling["samples_per_s"] == ddp["samples_per_s"]
    assert doc["extra"]["goal"]["verdict"].startswith("n/a")
    cal = doc["extra"]["calibration"]         # the planner's efficiency fit runs on the rows, labelled a dry run's
    assert cal["fitted_on"] + cal["validated_on"] == 12 and cal["gpu_kind"].startswith("dry run")
    # the planner's prediction beside every training row that ran, ecomkit's and HF Trainer's alike
    trained = [r for p in ("attention", "loss_kernel", "long_rows", "packing", "strategy") for r in parts[p]
               if r["status"] == "ok"]
    assert len(trained) == 12
    for r in trained:
        assert all(r.get(k) is not None for k in PLAN_KEYS) and "plan_error" not in r, r
        assert r["plan_gpu"] == "h200" and r["plan_step_s"] > 0 and r["plan_compute_s"] > 0 and r["plan_bytes"] > 0
        assert r["plan_step_over_measured"] > 0


def test_gpu_settings_time_the_loop_not_its_warm_up():
    """On a GPU: >= 8 untimed and >= 30 timed steps for every training row, micro-batch 8 and 16, 8 minutes."""
    args = gpu_bench.parse_args([])
    st = gpu_bench.settings(args, on_gpu=True, n_gpus=1, gpu="NVIDIA H200")
    assert st["untimed"] >= 8 and st["steps"] >= 30 and st["batches"] == [8, 16] and st["shape"] == "seqgpt-560m"
    for steps, untimed in (("job_steps", "job_untimed"), ("script_steps", "script_untimed")):
        assert st[untimed] >= 8 and st[steps] - st[untimed] >= 30
    assert st["plan_gpu"] == "h200" and st["long_seq"] == 1024 and st["packed_seq"] == 1024
    assert args.budget_s == 480
    fewer = gpu_bench.settings(gpu_bench.parse_args(["--untimed", "2", "--steps", "5"]), on_gpu=True, n_gpus=1)
    assert fewer["untimed"] == 8 and fewer["steps"] == 30     # a GPU row never times its warm-up


def test_compile_time_is_the_compiled_runs_first_step_over_its_steady_step():
    run = {"case": "long ecomkit compiled", "status": "ok", "model": "seqgpt-560m", "first_step_s": 41.5,
           "step_time_s": 0.5}
    row = gpu_jobs.compile_row([run])
    assert row["status"] == "ok" and row["compile_s"] == 41.0 and row["verdict"] == "PASS"
    assert gpu_jobs.compile_row([{**run, "first_step_s": 90.0}])["verdict"] == "MISS"
    assert gpu_jobs.compile_row([{**run, "status": "timeout"}])["status"] == "skipped"


def test_ratios_take_each_sides_best_and_a_toy_vocabulary_is_read_back_from_the_parameter_count():
    rows = [{"case": c, "status": "ok", "tokens_per_s": t} for c, t in (("a", 10.0), ("b", 4.0), ("c", 5.0))]
    (r,) = gpu_jobs.ratio_rows("x", rows, [(("a",), ("b", "c"), 1.5)])
    assert r["case"] == "a / c" and r["ratio"] == 2.0 and r["verdict"] == "PASS"
    from ecomkit.planner.shapes import model_shape

    assert gpu_jobs.toy_vocab("tiny", model_shape("tiny", 4003).n_params) == 4003
    assert gpu_jobs.toy_vocab("seqgpt-560m", 559_214_592) is None


def test_preflight_names_what_is_missing(monkeypatch):
    """Without deepspeed the ZeRO-3 row is skipped with the install line; nothing is installed."""
    real = gpu_bench.importlib.util.find_spec
    monkeypatch.setattr(gpu_bench.importlib.util, "find_spec", lambda name: None if name == "deepspeed" else real(name))
    pre = gpu_bench.preflight(on_gpu=False, dry_run=False)
    assert pre["deepspeed"] is False
    assert any(m.startswith("no CUDA GPU visible") for m in pre["missing"])
    assert any("deepspeed is not installed: zero3, zero3+lora skipped (pip install deepspeed)" == m for m in pre["missing"])
    st = gpu_bench.settings(gpu_bench.parse_args(["--dry-run"]), on_gpu=False, n_gpus=0)
    row = gpu_jobs.strategy_case("zero3", st, pre, "sdpa", "fp32", timeout_s=1, nproc=2)
    assert row["status"] == "skipped" and "pip install deepspeed" in row["reason"]
