"""Chapter 02 acceptance: real 2-process gloo DDP against 1 process, accumulation, saving, Accelerate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import main_in_process, run_script

from ecomkit.config import TrainConfig
from ecomkit.errors import ConfigError

COMMON = ["--precision", "fp32", "--model", "tiny", "--n-rows", "600", "--seq-len", "64", "--max-steps", "5", "--eval-interval", "0",
          "--eval-batches", "1", "--warmup-steps", "2", "--no-progress"]


def losses(out: Path) -> list[float]:
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("type") == "train"]


def assert_summary_divides_totals(out: Path, world_size: int) -> None:
    """The summary's throughput is the run's own rows' totals over its steady wall time (step 1 is warm-up)."""
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in rows if r.get("type") == "train"][1:]
    s = json.loads((out / "summary.json").read_text())
    own_wall = sum(r["step_time_s"] for r in steady)
    assert s["steady_steps"] == len(steady) == 4
    if world_size == 1:
        assert s["slowest_rank_steady_s"] is None and s["steady_wall_s"] == pytest.approx(own_wall, rel=1e-12)
    else:  # rank 0 writes the rows; the job runs at the slowest rank's pace (all_reduce MAX)
        assert s["steady_wall_s"] == s["slowest_rank_steady_s"] >= own_wall * (1 - 1e-12)
    wall = s["steady_wall_s"]
    assert s["samples_per_s"] == pytest.approx(sum(r["samples"] for r in steady) / wall, rel=1e-12)
    assert s["tokens_per_s"] == pytest.approx(sum(r["tokens"] for r in steady) / wall, rel=1e-12)
    assert s["step_time_s"] == pytest.approx(wall / 4, rel=1e-12)
    times = sorted(r["step_time_s"] for r in steady)
    assert s["step_time_median_s"] == pytest.approx((times[1] + times[2]) / 2, rel=1e-12)
    assert times[2] <= s["step_time_p90_s"] <= times[3]
    padded = sum(r["padded_tokens"] for r in steady)
    assert padded >= sum(r["tokens"] for r in steady)
    assert s["padding_rate"] == pytest.approx(1 - sum(r["tokens"] for r in steady) / padded, abs=1e-12)
    assert all(r["samples"] == s["global_batch"] for r in steady)


def assert_close_rel(a: list[float], b: list[float], rel: float = 1e-4) -> None:
    assert len(a) == len(b) == 5
    for x, y in zip(a, b):
        assert abs(x - y) <= rel * abs(y), (a, b)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    run_script("02_data_parallel.py", COMMON + ["--micro-batch-size", "8", "--output-dir", str(out), "--no-save-model"])
    return out


@pytest.mark.dist
def test_two_process_ddp_matches_one_process_and_replicas_agree(single_run, tmp_path):
    out = tmp_path / "ddp"
    # several LM-head loss chunks per micro-batch here, one (nothing recomputed) in the 1-process run
    run_script("02_data_parallel.py", COMMON + ["--micro-batch-size", "4", "--loss-chunk-tokens", "50",
                                                "--output-dir", str(out)], nproc=2)
    assert_close_rel(losses(out), losses(single_run))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch"] == 8
    assert_summary_divides_totals(out, world_size=2)
    assert_summary_divides_totals(single_run, world_size=1)
    checks = summary["replica_checksums"]
    assert len(checks) == 2 and checks[0] == checks[1]
    # the saved model reloads without ecomkit and generates text
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tok = AutoTokenizer.from_pretrained(out / "final")
    ids = tok("商品:", return_tensors="pt")["input_ids"]
    gen = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape[1] > ids.shape[1]
    assert isinstance(tok.decode(gen[0]), str)


def test_grad_accumulation_matches_big_micro_batch(single_run, tmp_path):
    out = tmp_path / "accum"
    run_script("02_data_parallel.py", COMMON + ["--micro-batch-size", "2", "--grad-accum", "4",
                                                "--output-dir", str(out), "--no-save-model"])
    assert_close_rel(losses(out), losses(single_run))


@pytest.mark.dist
def test_accelerate_path_runs_with_two_processes(single_run, tmp_path):
    out = tmp_path / "acc"
    run_script("02_data_parallel.py", COMMON + ["--strategy", "accelerate", "--micro-batch-size", "4",
                                                "--output-dir", str(out), "--no-save-model"], nproc=2)
    assert_close_rel(losses(out), losses(single_run))


@pytest.mark.dist
def test_ranks_failing_at_startup_fail_the_job_with_their_message(tmp_path):
    proc = run_script("02_data_parallel.py", COMMON + ["--output-dir", str(tmp_path), "--model", "tinny"],
                      nproc=2, check=False, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("error: Unknown model 'tinny'") == 1   # reported once, by rank 0 (ecomkit.errors)
    assert "[rank 1] error" not in proc.stderr


@pytest.mark.dist
def test_one_rank_dying_before_its_first_step_fails_the_job_instead_of_hanging(tmp_path):
    proc = run_script("02_data_parallel.py", COMMON + ["--output-dir", str(tmp_path), "--fail-at-step", "0",
                                                       "--fail-rank", "1"], nproc=2, check=False, timeout=120)
    assert proc.returncode != 0
    assert "[rank 1] fault injection: exiting abruptly at step 0" in proc.stdout + proc.stderr


@pytest.mark.parametrize("args, match", [
    (["--lr", "-0.1"], "must be > 0"),
    (["--global-batch-size", "10", "--micro-batch-size", "4"], "not divisible"),
    (["--strategy", "magic"], "Unknown strategy"),
    (["--data", "nowhere.jsonl"], "does not exist"),
])
def test_bad_input_fails_before_process_group(args, match, tmp_path, monkeypatch, capsys):
    code, err = main_in_process("02_data_parallel.py", args + ["--output-dir", str(tmp_path)], monkeypatch, capsys)
    assert code == 2 and match in err and "Traceback" not in err


def test_bad_input_exits_2_with_one_paragraph_from_the_command_line(tmp_path):
    proc = run_script("02_data_parallel.py", ["--lr", "-0.1", "--output-dir", str(tmp_path)], check=False)
    assert proc.returncode == 2
    assert "must be > 0" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.dist
@pytest.mark.slow
def test_compiled_ddp_matches_one_eager_process(single_run, tmp_path):
    """--compile: torch.compile of the DDP-wrapped model trains the same losses as one uncompiled process."""
    out = tmp_path / "compiled"
    # one inductor compile process per rank (TORCHINDUCTOR_COMPILE_THREADS=1, set by conftest)
    run_script("02_data_parallel.py", COMMON + ["--micro-batch-size", "4", "--compile", "--output-dir", str(out),
                                                "--no-save-model"], nproc=2, timeout=600)
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["compile"] is True and s["world_size"] == 2
    assert_close_rel(losses(out), losses(single_run), rel=2e-4)


@pytest.mark.parametrize("strategy", ["zero", "fsdp", "tp"])
def test_compile_is_refused_where_ecomkit_does_not_compile(strategy):
    with pytest.raises(ConfigError, match=f"--compile cannot run with --strategy {strategy}"):
        TrainConfig(strategy=strategy, compile=True).validate(2)
