"""Evaluate a saved model without training it: the run's evaluation, under any strategy, on the run's data.

Why: "the metrics do not depend on the strategy" is a claim about the
evaluation code, so it is checked on *one* set of weights. A model saved by a
run (``<output-dir>/final``) is loaded by the strategy the config names (ZeRO-3
partitions it under ``deepspeed.zero.Init``, FSDP2 shards it on the meta
device), and the same held-out examples are scored as at the end of training:
loss, candidate scoring and generation, with ``predictions.jsonl``.
"""

from __future__ import annotations

import json
from typing import Any

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, distributed_session
from ecomkit.train.loop import TrainingRun, validate_before_launch

EVALUATION_FILE = "evaluation.json"


def evaluate_in_session(cfg: TrainConfig, env: DistEnv) -> dict[str, Any]:
    """Build the run (data, model from ``cfg.model``, strategy) and run its final evaluation once; no step is taken."""
    run = TrainingRun(cfg, env).build()
    try:
        result = {"strategy": run.strategy.name, "world_size": env.world_size, "model": cfg.model,
                  **run.evaluate(final=True)}
        if env.is_main:
            (run.out_dir / EVALUATION_FILE).write_text(json.dumps(result, indent=2, ensure_ascii=False),
                                                       encoding="utf-8")
        return result
    finally:
        run.close()
        del run


def run_evaluation(cfg: TrainConfig) -> dict[str, Any]:
    """Set up the process group, evaluate ``cfg.model``, tear down. Returns the evaluation (all ranks)."""
    validate_before_launch(cfg)
    with distributed_session(timeout_s=cfg.timeout_s, seed=cfg.seed) as env:
        return evaluate_in_session(cfg, env)
