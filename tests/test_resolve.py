"""``auto`` resolved once (issue 55 item 2): a sealed configuration, the run length from measured steps, the step's
metrics as one table with named columns, MFU computed once.

- ``TrainingRun.build`` leaves the flags as given and trains on a sealed copy (``ecomkit/train/resolve.py``);
  writing to it raises, and no loop or strategy module writes to a config (a static check).
- ``--max-train-minutes``: a run whose length auto sized from the data is shortened once its steps are measured
  (:func:`ecomkit.config.recipe.capped_length`), its lr schedule too, and says so; one short run shows it.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import logging
import re
from pathlib import Path

import pytest
import torch

from ecomkit.config import TrainConfig, parse_config
from ecomkit.config.recipe import NLU_FILE_MIN_STEPS, capped_length
from ecomkit.dist import DistEnv, log
from ecomkit.models.optim import build_scheduler, set_schedule_length
from ecomkit.train import loop
from ecomkit.train.loop import StepTensors, TrainingRun

REPO = Path(__file__).resolve().parents[1]
ONE = DistEnv(rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))
# Modules that build the flags of runs they start (a sweep's variants, ZeRO's probe): they write configs before a run.
BUILDS_FLAGS = {"ecomkit/train/sweep.py", "ecomkit/parallel/zero/variants.py", "ecomkit/parallel/zero/probe.py"}


# ---------------------------------------------------------------------- the sealed configuration
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    flags = TrainConfig(model="tiny", n_rows=200, micro_batch_size=4, max_steps=2, eval_interval=0,
                        final_eval_samples=4, save_model=False, progress=False, report_to="none",
                        output_dir=str(tmp_path_factory.mktemp("built")))
    given = flags.to_dict()
    run = TrainingRun(flags, ONE).build()
    yield flags, given, run
    run.close()


def test_a_build_leaves_the_flags_as_given_and_trains_on_a_sealed_copy(built):
    flags, given, run = built
    assert flags.to_dict() == given                               # main resolved eight autos in place, in cfg
    assert "auto" not in {run.cfg.precision, run.cfg.attn, run.cfg.loss_kernel, run.cfg.lr, run.cfg.seq_len,
                          run.cfg.packing, run.cfg.warmup_steps, run.cfg.eval_interval}
    assert run.strategy.cfg is run.cfg                            # the strategy holds the resolved config
    for target, name in ((run.cfg, "lr"), (run.cfg, "precision"), (run.cfg.zero, "stage"), (run.cfg.parallel, "tp")):
        with pytest.raises(dataclasses.FrozenInstanceError, match="resolved configuration is frozen"):
            setattr(target, name, getattr(target, name))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.resolved.grad_accum = 2


def test_every_resolved_setting_keeps_its_reason_and_the_report_a_line_each(built):
    _, _, run = built
    recipe = run.resolved.to_dict()
    assert {"precision", "seq_len", "packing", "global_batch", "max_steps", "lr", "warmup_steps", "eval_interval",
            "attn", "loss_kernel"} <= set(recipe)
    assert all(set(v) == {"value", "reason", "given"} and v["reason"] for v in recipe.values())
    assert recipe["max_steps"] == {"value": 2, "reason": "--max-steps given", "given": True}
    report = run.startup_report().splitlines()
    assert report[0] == "***** Running training *****"
    for label in ("strategy", "model", "data", "lengths", "precision", "seq_len", "packing", "batch", "steps", "lr",
                  "warm-up", "attention", "loss", "evaluation"):
        assert sum(line.split()[0] == label or line.startswith(f"  {label} ") for line in report[1:]) == 1, label
    precision = next(line for line in report if line.startswith("  precision "))
    assert re.fullmatch(rf"  precision +{run.cfg.precision} +(given|auto: .{{3,60}})", precision), precision
    verbose = {name: why for name, _, why in run.resolved.rows(verbose=True)}   # --verbose: the full reasons
    assert verbose["packing"] == recipe["packing"]["reason"] and verbose["steps"] == "--max-steps given"


def test_no_loop_or_strategy_module_writes_to_a_config():
    """A static check beside the sealed copy: no assignment to an attribute of ``cfg`` / ``self.cfg`` / ``run.cfg``
    in ecomkit/train or ecomkit/parallel, except where a module builds the flags of the runs it starts."""
    def rooted_at_cfg(node: ast.AST) -> bool:
        while isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "cfg":
                return True
            if (isinstance(node.value, ast.Attribute) and node.value.attr == "cfg"
                    and isinstance(node.value.value, ast.Name)):
                return True
            node = node.value
        return False

    writes = []
    for path in [*(REPO / "ecomkit" / "train").rglob("*.py"), *(REPO / "ecomkit" / "parallel").rglob("*.py")]:
        name = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                       if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            calls_setattr = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                             and node.func.id == "setattr" and node.args and isinstance(node.args[0], ast.Name)
                             and node.args[0].id == "cfg")
            if (any(rooted_at_cfg(t) for t in targets) or calls_setattr) and name not in BUILDS_FLAGS:
                writes.append(f"{name}:{node.lineno}")
    assert not writes, writes


# ---------------------------------------------------------------------- the run length, from measured steps
def test_a_run_that_would_pass_the_cap_is_shortened_to_it_and_never_below_its_floor():
    assert capped_length(3000, 40, 20.0, 0.5, 15.0) == 40 + int((900 - 20) / 0.5) == 1800
    assert capped_length(1000, 40, 20.0, 0.5, 15.0) is None                  # 1,000 steps fit in 15 min
    assert capped_length(3000, 40, 20.0, 5.0, 15.0) == NLU_FILE_MIN_STEPS   # the floor holds
    assert capped_length(3000, 40, 20.0, 0.5, 15.0, min_steps=10) == 1800
    assert capped_length(3000, 700, 1000.0, 0.5, 15.0, min_steps=10) == 700   # past the cap: stop now
    assert capped_length(3000, 40, 20.0, 0.5, 0.0) is None                   # 0: no cap


def test_shortening_moves_the_cosine_s_end_and_a_checkpoint_keeps_it():
    cfg = TrainConfig(lr=1.0, warmup_steps=2, min_lr_ratio=0.1)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(opt, cfg, 100)
    for _ in range(5):
        opt.step()
        scheduler.step()
    set_schedule_length(type("Wrapped", (), {"scheduler": scheduler})(), 10)   # Accelerate's wrapper: unwrapped
    for _ in range(5):
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)   # the end of a 10-step schedule, not of 100
    state = json.loads(json.dumps(scheduler.state_dict()))    # checkpoints write it as JSON
    again = build_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), cfg, 100)
    again.load_state_dict(state)
    assert again.lr_lambdas[0].total_steps == 10


def test_a_short_run_sized_by_epochs_is_cut_at_the_measured_pace_and_says_so(tmp_path, monkeypatch, caplog):
    data = tmp_path / "titles.csv"
    data.write_text("title,category\n" + "".join(f"华为 手机 {i} 号,手机\n小米 耳机 {i},耳机\n" for i in range(100)),
                    encoding="utf-8")
    monkeypatch.setattr("ecomkit.config.recipe.NLU_FILE_MIN_STEPS", 6)   # the floor and the check, scaled down:
    monkeypatch.setattr(loop, "LENGTH_CHECK_STEPS", 2)                   # measured after step 3, cut to 6
    flags, _ = parse_config(["--task", "nlu", "--data", str(data), "--micro-batch-size", "8", "--warmup-steps", "0",
                             "--max-train-minutes", "0.0001", "--gen-eval-samples", "0", "--final-eval-samples", "4",
                             "--no-save-model", "--no-progress", "--report-to", "none",
                             "--output-dir", str(tmp_path / "run")])
    log.addHandler(caplog.handler)   # ecomkit's logger does not propagate
    try:
        with caplog.at_level(logging.WARNING, logger="ecomkit"):
            summary = loop.run_training(flags)
    finally:
        log.removeHandler(caplog.handler)
    planned = summary["recipe"]["max_steps"]["value"]
    assert planned > 6 and summary["length_cut"]["planned_steps"] == planned
    assert summary["steps"] == summary["length_cut"]["steps"] == 6 < planned   # the floor, at a cap of 6 ms
    assert summary["length_cut"]["after_steps"] == 3 and summary["length_cut"]["measured_step_s"] > 0
    assert "run shortened to 6 of its" in caplog.text and "--max-train-minutes" in caplog.text
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["type"] == "train"][-1]
    assert last["lr"] == pytest.approx(summary["config"]["lr"] * flags.min_lr_ratio)   # the schedule ended there


# ---------------------------------------------------------------------- the step's metrics
def test_a_log_interval_reads_one_table_with_named_columns_and_mfu_uses_the_run_s_peak():
    run = TrainingRun.__new__(TrainingRun)
    run.env, run.replication, run.head_flops, run.stop_agreed = ONE, 1, 0.0, False
    run.peak, run.mfu_note, run.stop_flag = 1e12, None, lambda: False
    steps = [({"step_time_s": 2.0}, StepTensors(torch.tensor(30.0), torch.tensor(10.0), torch.tensor(1.5), False,
                                                (100, 4, 128, 2500))),
             ({"step_time_s": 1.0}, StepTensors(torch.tensor(8.0), 4.0, 0.5, False, (50, 2, 64, 1250)))]
    run._finish_steps(steps, lambda length: 1000.0 + length)
    first, second = (row for row, _ in steps)
    assert loop.SUMMED == ("loss_sum", "tokens", "rows", "positions", "squared", "stop")
    assert (first["loss"], first["tokens"], first["samples"], first["padded_tokens"]) == (3.0, 100, 4, 128)
    assert (second["loss"], second["grad_norm"], second["tokens_per_s"]) == (2.0, 0.5, 50.0)
    flops = 100 * (1000.0 + 2500 / 100) / 2.0
    assert first["model_flops_per_s"] == pytest.approx(flops) and first["mfu"] == pytest.approx(flops / 1e12)


def test_a_copy_of_the_sealed_configuration_is_a_new_writable_one(built):
    """A ZeRO probe or a sweep variant starts from a copy of the run's configuration (chapter 06's calibration does)."""
    cfg = built[2].cfg
    before = cfg.zero.stage
    probe = copy.deepcopy(cfg)
    probe.zero.stage = before + 1
    assert (probe.zero.stage, cfg.zero.stage) == (before + 1, before)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.zero.stage = before + 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        probe.sealed().zero.stage = before
