"""Preemption under ZeRO-3 (DeepSpeed's own checkpoint; SIGTERM on the torchrun agent) and FSDP2 (DCP; SIGUSR1
on one rank only), then the same command rerun: the losses and final weights are those of the uninterrupted
run, bit for bit, and every step is logged exactly once. DDP gets both signals in a row in notebook 07,
which asserts the same. One launch per interruption keeps the time
down: the signal path is the same for every strategy, the save and resume are what differ. Unit tests at the end."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import preempt_then_finish, run_script
from ecomkit.config import TrainConfig, parse_signal_names
from ecomkit.errors import ConfigError
from ecomkit.faults.checkpoint import TRAINER_STATE
from ecomkit.faults.safe_load import METADATA
from ecomkit.train.preempt import (PreemptionCallback, PreemptionSignals, add_preemption_callbacks, clear_record,
                                   read_record)
from ecomkit.train.preempt_save import write_record

# fp32 pinned: 02's default, precision auto, is chosen by timing GEMMs at start-up, so the uninterrupted and the
# resumed launches could train at different precisions under a loaded machine (docs/testing.md).
COMMON = ["--precision", "fp32", "--model", "tiny", "--max-steps", "8", "--n-rows", "300", "--seq-len", "64",
          "--eval-interval", "0", "--eval-batches", "1", "--no-progress"]
SIGTERM_AGENT, SIGUSR1_RANK1 = (signal.SIGTERM, None), (signal.SIGUSR1, 1)
STRATEGIES = {
    "zero3": ("03_zero3.py", ["--strategy", "zero", "--zero-stage", "3"], [SIGTERM_AGENT]),
    "fsdp2": ("02_data_parallel.py", ["--strategy", "fsdp"], [SIGUSR1_RANK1]),
}


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in rows(out) if r.get("type") == "train"]


@pytest.fixture(scope="module", params=sorted(STRATEGIES))
def strategy_runs(request, tmp_path_factory):
    script, extra, plan = STRATEGIES[request.param]
    ref = tmp_path_factory.mktemp(f"{request.param}-ref")
    run_script(script, COMMON + extra + ["--output-dir", str(ref)], nproc=2, timeout=300)
    out = tmp_path_factory.mktemp(f"{request.param}-preempted")
    records = preempt_then_finish(script, COMMON + extra + ["--output-dir", str(out)], out, plan)
    return request.param, ref, out, records


@pytest.mark.dist
def test_preempted_runs_resume_bit_identical(strategy_runs):
    name, ref, out, records = strategy_runs
    got, want = train_losses(out), train_losses(ref)
    assert [s for s, _ in got] == list(range(1, 9)), f"{name}: a step was lost or repeated: {got}"
    assert got == want, f"{name}: {got} != {want}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["preemption"]["resumed_from_step"] == records[-1]["step"]
    assert summary["preemption"]["save_s"] == [r["save_s"] for r in records]
    assert not read_record(out / "checkpoints"), "a finished run removes the record: the next rerun starts fresh"
    a, b = load_file(ref / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"{name}: final weights differ"


# ---------------------------------------------------------------------- no launch
def test_signal_names_parse_and_bad_ones_are_config_errors():
    assert parse_signal_names("SIGTERM, usr1") == [signal.SIGTERM, signal.SIGUSR1]
    assert parse_signal_names("") == []
    cfg = TrainConfig()
    cfg.fault.preempt_signals = "SIGKILL"
    with pytest.raises(ConfigError, match="--fault-preempt-signals"):
        cfg.validate(1)
    cfg.fault.preempt_signals = "SIGNOPE"
    with pytest.raises(ConfigError, match="SIGNOPE"):
        cfg.validate(1)


def test_handler_records_signals_and_keeps_the_stack_dump(capfd):
    import faulthandler
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)  # as dist installs it
    before = signal.getsignal(signal.SIGTERM)   # what restore() must put back (SIG_DFL in a fresh process)
    sigs = PreemptionSignals([signal.SIGUSR1, signal.SIGTERM], rank=3)
    try:
        assert sigs.install()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert sigs.received == ["SIGUSR1", "SIGTERM"] and sigs.first == "SIGUSR1"
        err = capfd.readouterr().err
        assert "most recent call first" in err, "SIGUSR1 still prints the stacks (from the Python handler)"
        assert "[rank 3] SIGUSR1 received" in err
        sigs.saving = True  # a second signal while the checkpoint is written is counted, not acted on
        os.kill(os.getpid(), signal.SIGTERM)
        assert sigs.received == ["SIGUSR1", "SIGTERM", "SIGTERM"]
        assert "[rank 3] SIGTERM received again while the checkpoint is written: ignored" in capfd.readouterr().err
        sigs.restore()
        assert signal.getsignal(signal.SIGTERM) is before
        assert faulthandler.unregister(signal.SIGUSR1)   # the C-level dump for hung ranks is back
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    finally:
        sigs.restore()  # also cancels the stuck-rank timer the first signal armed
        faulthandler.unregister(signal.SIGUSR1)


def test_a_signalled_rank_that_is_stuck_exits_as_the_signal_would(tmp_path):
    """A rank that never reaches the end of its step (a hung peer) still ends on SIGTERM, after the grace."""
    import subprocess
    code = ("import os, signal, time\n"
            "import ecomkit.train.preempt as p\n"
            "p.STUCK_AFTER_S = 0.5\n"
            "s = p.PreemptionSignals([signal.SIGTERM]); s.install()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "did not finish within 0 s of SIGTERM" in proc.stderr or "did not finish within 1 s" in proc.stderr


def test_record_is_written_whole_and_keeps_the_history(tmp_path):
    assert read_record(tmp_path) == {}
    write_record(tmp_path, {"step": 3, "checkpoint": "a", "save_s": 0.1})
    write_record(tmp_path, {"step": 7, "checkpoint": "b", "save_s": 0.2})
    rec = read_record(tmp_path)
    assert rec["step"] == 7 and [h["step"] for h in rec["history"]] == [3, 7]
    assert not list(tmp_path.glob("*.tmp"))
    (tmp_path / "preempted.json").write_text("{half")
    assert read_record(tmp_path) == {}
    clear_record(tmp_path)
    clear_record(tmp_path)
    assert not (tmp_path / "preempted.json").exists()


def test_the_checkpoint_callback_is_made_at_the_signal_or_for_a_record_to_resume(tmp_path):
    """A run that reads no record gets no checkpoint callback until a signal (so it loads no checkpoint code); a
    record naming a complete checkpoint makes one that resumes from it."""
    cfg = TrainConfig(output_dir=str(tmp_path))
    [callback] = add_preemption_callbacks(cfg, [])
    assert isinstance(callback, PreemptionCallback) and callback.checkpoint is None
    step = tmp_path / "checkpoints" / "step_00000003"
    step.mkdir(parents=True)
    for name in (METADATA, TRAINER_STATE):
        (step / name).write_text("{}")
    write_record(tmp_path / "checkpoints", {"step": 3, "checkpoint": str(step), "save_s": 0.1})
    checkpoint, callback = add_preemption_callbacks(cfg, [])
    assert type(checkpoint).__name__ == "CheckpointCallback" and callback.checkpoint is checkpoint
    assert checkpoint.resuming and checkpoint.resume_from == step

