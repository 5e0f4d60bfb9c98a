"""``--ddp-allreduce shm``: DDP's gradient all-reduce through shared memory on one CPU host.

Unit tests check the refusals; the ``dist`` test trains the same 2-process DDP job with the process group's
all-reduce and with shared memory, and asserts the two runs end with bit-identical replicas and the same losses
(the transport may change how fast gradients move, never what they are), and that no segment is left in /dev/shm.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import run_script
from ecomkit.config import CompressionConfig, TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.errors import ConfigError
from ecomkit.fast.shm_allreduce import check_shm_allreduce, segment_name

COMMON = ["--precision", "fp32", "--model", "tiny", "--n-rows", "300", "--seq-len", "32", "--eval-interval", "0", "--eval-batches", "1",
          "--warmup-steps", "1", "--no-progress", "--no-save-model", "--bucket-cap-mb", "0.25", "--max-steps", "6",
          "--precision", "fp32"]


def test_validate_refuses_shm_outside_ddp_and_beside_compression():
    with pytest.raises(ConfigError, match="does not use DDP"):
        TrainConfig(strategy="zero", ddp_allreduce="shm").validate(2)
    with pytest.raises(ConfigError, match="one communication hook"):
        TrainConfig(ddp_allreduce="shm", compression=CompressionConfig(method="bf16")).validate(2)
    with pytest.raises(ConfigError, match="Did you mean 'shm'"):
        TrainConfig(ddp_allreduce="shmm").validate(2)
    TrainConfig(ddp_allreduce="shm").validate(2)   # plain DDP: accepted


def test_machine_checks_name_what_to_change(monkeypatch):
    local = DistEnv(rank=0, world_size=2, local_world_size=2, backend="gloo", device=torch.device("cpu"))
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    check_shm_allreduce(local)
    with pytest.raises(ConfigError, match="one host"):
        check_shm_allreduce(DistEnv(rank=0, world_size=4, local_world_size=2, device=torch.device("cpu")))
    with pytest.raises(ConfigError, match="nccl"):
        check_shm_allreduce(DistEnv(rank=0, world_size=2, local_world_size=2, device=torch.device("cuda")))
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    with pytest.raises(ConfigError, match="max-restarts 2"):
        check_shm_allreduce(local)


def test_segment_name_follows_the_ops_naming(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert segment_name(1).endswith("_127.0.0.1_29500_1")
    assert segment_name(1).startswith("deepspeed_allreduce_buffer_")


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _rows(folder: Path) -> list[dict]:
    return [r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if r.get("type") == "train"]


@pytest.mark.dist
def test_shm_allreduce_trains_bit_identically_to_the_process_group(tmp_path):
    pytest.importorskip("deepspeed")
    before = set(Path("/dev/shm").glob("deepspeed_allreduce_buffer_*"))
    for mode in ("process_group", "shm"):
        run_script("02_data_parallel.py", COMMON + ["--ddp-allreduce", mode, "--output-dir", str(tmp_path / mode)],
                   nproc=2)
    plain, shm = _summary(tmp_path / "process_group"), _summary(tmp_path / "shm")
    assert shm["config"]["ddp_allreduce"] == "shm"
    assert len(set(shm["replica_checksums"])) == 1                 # replicas agree with each other ...
    assert shm["replica_checksums"] == plain["replica_checksums"]  # ... and with gloo's, to the bit
    assert [r["loss"] for r in _rows(tmp_path / "shm")] == [r["loss"] for r in _rows(tmp_path / "process_group")]
    assert set(Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")) == before   # each rank removed its segment
