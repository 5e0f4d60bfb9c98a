"""A run whose build fails part-way releases what it made: ``TrainingRun.build`` closes the strategy before it
re-raises, so a DDP job's ``--ddp-allreduce shm`` segment in /dev/shm (tens of MiB) and its references do not
outlive the failure. In process, one rank, no process group."""

from __future__ import annotations

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.train import loop


def test_a_build_that_fails_after_the_strategy_closes_it(monkeypatch, tmp_path):
    closed = []
    build_strategy = loop.build_strategy

    def recording(cfg, env):
        strategy = build_strategy(cfg, env)
        close = strategy.close
        monkeypatch.setattr(strategy, "close", lambda: (closed.append(strategy.name), close()))
        return strategy

    def failing_writer(*args, **kwargs):
        raise RuntimeError("metrics writer failed")

    monkeypatch.setattr(loop, "build_strategy", recording)
    monkeypatch.setattr(loop, "MetricsWriter", failing_writer)
    cfg = TrainConfig(model="tiny", n_rows=100, seq_len=32, micro_batch_size=4, max_steps=1, precision="fp32",
                      output_dir=str(tmp_path / "run"))
    run = loop.TrainingRun(cfg, DistEnv(rank=0, world_size=1, local_world_size=1, device=torch.device("cpu")))
    with pytest.raises(RuntimeError, match="metrics writer failed"):
        run.build()
    assert closed == ["ddp"] and run.strategy is None   # the strategy was closed once, and dropped
