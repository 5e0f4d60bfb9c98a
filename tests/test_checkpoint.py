"""Checkpoints: DCP round trip, atomic directories, keep-last-k, async, kill mid-write, safe loading."""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from ecomkit.config import TrainConfig
from ecomkit.errors import ConfigError
from ecomkit.faults import checkpoints_requested
from ecomkit.faults.callbacks import effective_checkpoint_interval
from ecomkit.faults.checkpoint import (
    TMP_PREFIX,
    TRAINER_STATE,
    CheckpointWriter,
    apply_model_optimizer_state,
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_dcp,
    model_optimizer_state,
    remove_stale_temp_dirs,
    restore_rng_state,
    step_dir_name,
)
from ecomkit.faults.safe_load import UnsafeCheckpointError, load_weights_file

REPO = Path(__file__).resolve().parents[1]


def trained_pair(seed: int = 0, steps: int = 2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(torch.randn(5, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def save_pair(root: Path, step: int, model, opt, **writer_kw) -> CheckpointWriter:
    writer = CheckpointWriter(root, **writer_kw)
    writer.save(step, model_optimizer_state(model, opt), {TRAINER_STATE: {"step": step}})
    writer.wait()
    return writer


def assert_same(model_a, opt_a, model_b, opt_b) -> None:
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_a.state[a][key], opt_b.state[b][key])
    assert opt_a.param_groups[0]["lr"] == opt_b.param_groups[0]["lr"]


def load_into_fresh(path: Path):
    model, opt = trained_pair(seed=123, steps=1)  # different values: the load must overwrite them
    state = model_optimizer_state(model, opt)
    load_dcp(path, state)
    apply_model_optimizer_state(model, opt, state)
    return model, opt


@pytest.mark.parametrize("use_async", [False, True])
def test_round_trip_restores_model_and_optimizer_exactly(tmp_path, use_async):
    model, opt = trained_pair()
    save_pair(tmp_path, 3, model, opt, use_async=use_async)
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == step_dir_name(3)
    assert_same(model, opt, *load_into_fresh(path))
    assert not list(tmp_path.glob(TMP_PREFIX + "*"))


def test_keep_last_k_prunes_old_checkpoints(tmp_path):
    model, opt = trained_pair()
    writer = CheckpointWriter(tmp_path, keep_last=2)
    for step in (2, 4, 6):
        writer.save(step, model_optimizer_state(model, opt), {TRAINER_STATE: {"step": step}})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 6]


def test_half_written_and_foreign_dirs_are_ignored_and_temp_dirs_cleaned(tmp_path):
    model, opt = trained_pair()
    save_pair(tmp_path, 2, model, opt)
    (tmp_path / f"{TMP_PREFIX}{step_dir_name(4)}").mkdir()
    (tmp_path / f"{TMP_PREFIX}{step_dir_name(4)}" / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / step_dir_name(9)).mkdir()  # a final name without metadata (copied by hand, say)
    (tmp_path / "notes").mkdir()
    assert latest_checkpoint(tmp_path).name == step_dir_name(2)
    removed = remove_stale_temp_dirs(tmp_path)
    assert [p.name for p in removed] == [f"{TMP_PREFIX}{step_dir_name(4)}"]


KILLED_WRITER = textwrap.dedent("""
    import sys, time
    import torch
    from torch.distributed.checkpoint import filesystem
    sys.path.insert(0, {tests!r})
    from test_checkpoint import save_pair, trained_pair

    root = {root!r}
    model, opt = trained_pair(seed=0)
    save_pair(__import__("pathlib").Path(root), 1, model, opt)
    model2, opt2 = trained_pair(seed=7)

    def finish_slowly(self, *args, **kwargs):   # data files are written; metadata and rename not yet
        print("WRITING", flush=True)
        time.sleep(60)

    filesystem._FileSystemWriter.finish = finish_slowly
    save_pair(__import__("pathlib").Path(root), 2, model2, opt2)
""")


def test_process_killed_mid_save_leaves_previous_checkpoint_loadable(tmp_path):
    root = tmp_path / "ckpt"
    code = KILLED_WRITER.format(tests=str(REPO / "tests"), root=str(root))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 60
        line = ""
        while "WRITING" not in line and time.time() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"writer exited early: {proc.stderr.read()[-3000:]}")
        assert "WRITING" in line
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    half = root / f"{TMP_PREFIX}{step_dir_name(2)}"
    assert any(half.glob("*.distcp")), "the second save had written its data files when killed"
    assert not (root / step_dir_name(2)).exists()
    latest = latest_checkpoint(root)
    assert latest is not None and latest.name == step_dir_name(1)
    expected = trained_pair(seed=0)
    assert_same(*expected, *load_into_fresh(latest))


class Payload:
    """Unpickling calls Path.touch(marker): proof that code from the file ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_crafted_metadata_is_refused_and_runs_nothing(tmp_path):
    model, opt = trained_pair()
    save_pair(tmp_path, 1, model, opt)
    path = latest_checkpoint(tmp_path)
    marker = tmp_path / "pwned"
    with open(path / ".metadata", "wb") as fh:
        pickle.dump(Payload(marker), fh)
    with pytest.raises(UnsafeCheckpointError, match="pathlib.Path.touch|Path.touch|refusing"):
        load_into_fresh(path)
    assert not marker.exists()
    # why the safe reader exists: upstream DCP unpickles .metadata with pickle.load
    with pytest.raises(BaseException):  # DCP's CheckpointException is a BaseException
        dcp.load(model_optimizer_state(*trained_pair()), checkpoint_id=str(path), no_dist=True)
    assert marker.exists()


def test_pickled_object_entry_in_dcp_checkpoint_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    dcp.save({"w": torch.ones(3), "extra": Payload(marker)}, checkpoint_id=str(tmp_path / "c"), no_dist=True)
    assert not marker.exists()
    state = {"w": torch.zeros(3), "extra": None}
    with pytest.raises(UnsafeCheckpointError, match="extra"):
        load_dcp(tmp_path / "c", state)
    assert not marker.exists()


def test_single_weight_files_load_safely(tmp_path):
    from safetensors.torch import save_file

    torch.save({"w": torch.arange(3.0)}, tmp_path / "ok.pt")
    assert torch.equal(load_weights_file(tmp_path / "ok.pt")["w"], torch.arange(3.0))
    save_file({"w": torch.arange(2.0)}, str(tmp_path / "ok.safetensors"))
    assert torch.equal(load_weights_file(tmp_path / "ok.safetensors")["w"], torch.arange(2.0))
    marker = tmp_path / "pwned"
    torch.save({"w": torch.zeros(1), "x": Payload(marker)}, tmp_path / "bad.pt")
    with pytest.raises(UnsafeCheckpointError, match="bad.pt"):
        load_weights_file(tmp_path / "bad.pt")
    assert not marker.exists()


def test_rng_states_round_trip_through_json():
    state = capture_rng_state()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_checkpoint_interval_auto_only_when_a_restart_can_use_it(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    cfg = TrainConfig()
    assert cfg.fault.checkpoint_interval == -1
    assert not checkpoints_requested(cfg) and effective_checkpoint_interval(cfg, 60) == 0
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    assert effective_checkpoint_interval(cfg, 60) == 3
    assert effective_checkpoint_interval(cfg, 8) == 1
    assert effective_checkpoint_interval(cfg, 100_000) == 100
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    cfg.fail_at_step = 5
    assert effective_checkpoint_interval(cfg, 60) == 3
    cfg.fault.checkpoint_interval = 0
    assert effective_checkpoint_interval(cfg, 60) == 0
    cfg.fault.checkpoint_interval = 7
    assert effective_checkpoint_interval(cfg, 60) == 7


def test_fault_config_validation():
    """The fault settings are part of TrainConfig.validate(), which runs before any process group exists."""
    cfg = TrainConfig()
    cfg.fault.checkpoint_interval = -5
    with pytest.raises(ConfigError, match="--fault-checkpoint-interval"):
        cfg.validate(world_size=1)
    cfg = TrainConfig(strategy="zero")
    cfg.fault.checkpoint_interval = 10
    with pytest.raises(ConfigError, match="not supported with --strategy zero"):
        cfg.validate(world_size=1)
    cfg.fault.checkpoint_interval, cfg.fail_at_step = -1, 3
    assert not checkpoints_requested(cfg)  # auto stays off where DCP does not apply
    cfg = TrainConfig()
    cfg.fault.straggler_factor = 1.0
    with pytest.raises(ConfigError, match="--fault-straggler-factor"):
        cfg.validate(world_size=1)
