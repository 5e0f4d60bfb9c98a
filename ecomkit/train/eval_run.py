"""Evaluate a saved model without training it: the run's evaluation, under any strategy, on the run's data.

"The metrics do not depend on the strategy" is a claim about the evaluation code, so it is checked on one set of
weights.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ecomkit.config import TrainConfig
from ecomkit.data.task_file import read_task_file
from ecomkit.dist import DistEnv, distributed_session, log
from ecomkit.train.loop import TrainingRun, validate_before_launch

EVALUATION_FILE = "evaluation.json"


def evaluate_in_session(cfg: TrainConfig, env: DistEnv) -> dict[str, Any]:
    """Build the run and run its final evaluation once, no step taken, in the prompt format the model was saved with."""
    info = read_task_file(cfg.model) if Path(cfg.model).is_dir() else None
    if info and info["prompt_format"] != cfg.prompt_format:
        if env.is_main:
            log.info("%s was trained with prompt format %r: evaluating in it (not --prompt-format %s)", cfg.model,
                     info["prompt_format"], cfg.prompt_format)
        cfg = dataclasses.replace(cfg, prompt_format=info["prompt_format"])
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
