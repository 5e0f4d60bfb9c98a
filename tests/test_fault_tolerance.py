"""Chapter 07's machinery beyond what notebook 07 runs: TensorBoard's event files against metrics.jsonl, resume at
another world size from async checkpoints, diagnose in one process, the resume comparison's rules.

Notebook 07 (run by make test through nbmake) launches and asserts, on 2 processes: a rank killed mid-run
resuming under ``torchrun --max-restarts`` (the redone step logged twice, bit-identical losses and replicas);
SIGTERM on the agent then SIGUSR1 on one rank, the same command rerun to the end (every step once, the same
losses and replicas, TensorBoard's scalars from the three launches equal to metrics.jsonl); a stalled rank
failing within the timeout with the collective, gloo's words, py-spy's stacks and the straggler named. Those
launches are not repeated here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_script
from ecomkit.dist import DistEnv
from ecomkit.faults.diagnose import compare_resumed_run, diagnose, losses_by_step
from ecomkit.reporting import read_tensorboard_scalars

COMMON = ["--precision", "fp32", "--max-steps", "8", "--n-rows", "300", "--seq-len", "64", "--eval-interval", "0", "--eval-batches", "1", "--no-progress",
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
