"""Chapter 07 end to end: a killed rank resumes under torchrun --max-restarts, resume at another world size,
a stalled rank fails within the timeout, stragglers are named, diagnose passes."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from conftest import preempt_then_finish, run_script
from ecomkit.dist import DistEnv
from ecomkit.faults.diagnose import compare_resumed_run, diagnose, losses_by_step, run_stall_demo
from ecomkit.reporting import read_tensorboard_scalars

PY_SPY = Path(sys.executable).with_name("py-spy")
COMMON = ["--max-steps", "8", "--n-rows", "300", "--seq-len", "64", "--eval-interval", "0", "--eval-batches", "1", "--no-progress",
          "--no-save-model"]


def metrics_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref")
    run_script("02_data_parallel.py", COMMON + ["--output-dir", str(out)], nproc=2, timeout=240)
    return out


def assert_same_run(out: Path, ref: Path) -> None:
    """Same samples at every step (same per-step loss), same final parameters (replica checksums)."""
    assert sorted(losses_by_step(metrics_rows(out))) == list(range(1, 9))
    comparison = compare_resumed_run(metrics_rows(ref), metrics_rows(out), summary(ref), summary(out))
    assert comparison.losses_match(rel=1e-6, abs_tol=1e-7), comparison.loss_pairs
    assert comparison.same_parameters, (comparison.reference_checksums, comparison.resumed_checksums)
    assert comparison.identical()


@pytest.mark.dist
def test_rank_killed_mid_run_resumes_under_max_restarts(uninterrupted, tmp_path):
    """The issue's command, plus a fixed interval: rank 1 dies at step 5, torchrun restarts, the job resumes."""
    out = tmp_path / "killed"
    proc = run_script("02_data_parallel.py", COMMON + ["--output-dir", str(out), "--fail-at-step", "5",
                                                       "--fail-rank", "1", "--fault-checkpoint-interval", "2"],
                      nproc=2, torchrun_args=["--max-restarts", "1"], timeout=300)
    log = proc.stdout + proc.stderr
    assert "[rank 1] fault injection: exiting abruptly at step 5" in log
    assert "resumed from" in log and "step_00000004" in log
    assert summary(out)["checkpoint"]["resumed_from_step"] == 4
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if '"train"' in x]
    assert steps.count(5) == 2, "step 5 was logged before the kill and redone after the resume"
    assert_same_run(out, uninterrupted)


@pytest.mark.dist
def test_preempted_by_sigterm_then_sigusr1_resumes_bit_identical(uninterrupted, tmp_path):
    """No checkpoint interval: SIGTERM on the torchrun agent, then SIGUSR1 on rank 1 of the rerun, then the
    same command to the end; every step once, the same losses and replicas as the run left alone."""
    out = tmp_path / "preempted"
    records = preempt_then_finish("02_data_parallel.py", COMMON + ["--output-dir", str(out)], out,
                                  [(signal.SIGTERM, None), (signal.SIGUSR1, 1)])
    assert records[0]["signals"] == ["SIGTERM", "SIGTERM"]  # the agent forwarded it to both workers
    steps = [r["step"] for r in metrics_rows(out) if r.get("type") == "train"]
    assert steps == list(range(1, 9)), "no step lost or repeated"
    assert [(r["step"], r["loss"]) for r in metrics_rows(out) if r.get("type") == "train"] == \
        [(r["step"], r["loss"]) for r in metrics_rows(uninterrupted) if r.get("type") == "train"]
    assert summary(out)["preemption"]["save_s"] == [r["save_s"] for r in records]
    assert_same_run(out, uninterrupted)
    # TensorBoard (the default --report-to) got the same losses from all three launches, in order
    assert read_tensorboard_scalars(out)["loss"] == [(r["step"], r["loss"]) for r in metrics_rows(out)
                                                     if r.get("type") == "train"]


@pytest.mark.dist
def test_tensorboard_event_files_hold_the_metrics_rows(uninterrupted):
    """A 2-process run's TensorBoard scalars, read back with EventAccumulator, equal metrics.jsonl's numbers."""
    scalars = read_tensorboard_scalars(uninterrupted)
    rows = metrics_rows(uninterrupted)
    train = [r for r in rows if r.get("type") == "train"]
    assert scalars["loss"] == [(r["step"], r["loss"]) for r in train] and len(train) == 8
    for key in ("lr", "grad_norm", "tokens_per_s", "step_time_s", "data_s", "fwd_bwd_s", "optim_s", "peak_mem_bytes"):
        assert scalars[key] == [(r["step"], float(r[key])) for r in train], key
    assert scalars["eval_loss"] == [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]


@pytest.mark.dist
def test_async_checkpoint_resumes_at_world_size_one(uninterrupted, tmp_path):
    """2 processes with async saves die at step 4 (no restarts); 1 process with grad_accum 2 finishes the run."""
    out = tmp_path / "ws"
    proc = run_script("02_data_parallel.py", COMMON + ["--output-dir", str(out), "--fail-at-step", "4", "--fail-rank",
                                                       "1", "--fault-checkpoint-interval", "2",
                                                       "--fault-async-checkpoint"], nproc=2, timeout=240, check=False)
    assert proc.returncode != 0
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert ckpts and ckpts[0] == "step_00000002"  # step 4's async save may or may not have been committed
    run_script("02_data_parallel.py", COMMON + ["--output-dir", str(out), "--grad-accum", "2",
                                                "--fault-checkpoint-interval", "2"], nproc=0, timeout=240)
    s = summary(out)
    assert s["world_size"] == 1 and s["checkpoint"]["resumed_from_step"] in (2, 4)
    assert_same_run(out, uninterrupted)


@pytest.mark.dist
def test_stalled_rank_fails_within_timeout_naming_collective_and_straggler(tmp_path):
    timeout = 10
    result = run_stall_demo(["--timeout-s", str(timeout), "--output-dir", str(tmp_path / "stall"), "--n-rows", "300",
                             "--stall-at-step", "2", "--slow-ms", "150", "--fault-health-interval", "1"],
                            live=False, timeout=240)
    assert result.returncode != 0
    assert result.stall_to_exit_s is not None and result.stall_to_exit_s < timeout + 30, result.output[-3000:]
    assert result.explanation is not None, result.output[-3000:]
    assert f"timed out after {timeout} s" in result.explanation and "`all_reduce`" in result.explanation
    assert f"Timed out waiting {timeout * 1000}ms" in result.explanation  # gloo's own words, kept
    assert "health: straggler: rank 1" in result.output
    # py-spy is in the test extra: its dumps taken during the hang must show where each rank was
    assert PY_SPY.exists(), f"{PY_SPY} is missing: install the test extra (pip install -e '.[test]')"
    assert result.stack_shows(0, "all_reduce") and result.stack_shows(1, "StallInjector.on_step_end"), result.stacks


def test_diagnose_single_process(tmp_path):
    """The 2-process run of scripts/07_troubleshoot.py is executed by notebook 07; here the same code in-process."""
    result = diagnose(DistEnv(), tmp_path, echo=lambda _s: None)
    assert result["ok"] and result["collectives"]["skipped"]
    assert result["checkpoint"]["identical_after_load"] and result["checkpoint"]["shared_dir_visible_to_all"]
    assert not list((tmp_path / "checkpoint_check").glob(".tmp-*"))


def test_compare_resumed_run_last_logged_loss_wins_and_checksums_decide():
    ref_rows = [{"type": "train", "step": s, "loss": 3.0 - s / 10} for s in (1, 2, 3)] + [{"type": "eval", "step": 3}]
    got_rows = [{"type": "train", "step": 1, "loss": 2.9}, {"type": "train", "step": 2, "loss": 9.9},  # killed
                {"type": "train", "step": 2, "loss": 2.8}, {"type": "train", "step": 3, "loss": 2.7}]  # resumed
    ref = {"final_loss": 2.7, "replica_checksums": ["ab", "ab"]}
    got = {"final_loss": 2.7, "replica_checksums": ["ab"], "checkpoint": {"resumed_from_step": 1, "restore_s": 0.2}}
    c = compare_resumed_run(ref_rows, got_rows, ref, got)
    assert c.steps_logged == [1, 2, 2, 3] and c.missing_steps == [] and c.resumed_from_step == 1
    assert c.max_loss_diff == pytest.approx(0.0, abs=1e-12) and c.identical()  # 9.9 was redone
    assert not compare_resumed_run(ref_rows, got_rows[:2], ref, got).losses_match()  # step 3 missing, step 2 off
    assert not compare_resumed_run(ref_rows, got_rows, ref, {**got, "replica_checksums": ["cd"]}).identical()
