"""A training run loads only what it uses (issue 55 item 1), measured with ``python -X importtime``.

- A 2-process DDP run of ``scripts/02_data_parallel.py`` on the catalog: how many ecomkit modules and lines it
  loads (main before this change: 106 modules, 19,294 lines), and none of another strategy's, LoRA's, the
  compression hooks', nor the lab's (planner, measure, claims, plots, envcheck's lint, faults' diagnosis).
- A ZeRO run and a LoRA run on a user's CSV with packing: each loads its own modules and no one else's.
- Strategies are found by name (``ecomkit.parallel.STRATEGIES``): every entry resolves and sits on the
  parallel floor; what the loop and the strategies find by name sits at or below their own floor.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from import_cost import REPO, python_import, run_script

from ecomkit import find, metrics
from ecomkit.config import StrategyName, TrainConfig
from ecomkit.config.validate import forward_loss_unsupported
from ecomkit.dist import DistEnv
from ecomkit.faults import HEALTH, add_fault_tolerance_callbacks
from ecomkit.parallel import DDP_HOOKS, LORA, QUANT, STATE_BYTES, STRATEGIES, build_strategy
from ecomkit.fast import attention
from ecomkit.train import loop, preempt

SCRIPT = REPO / "scripts" / "02_data_parallel.py"
QUICK = ["--max-steps", "3", "--eval-interval", "0", "--final-eval-samples", "8", "--no-save-model",
         "--no-progress", "--report-to", "none"]
# Issue 55's bound for a DDP run on the catalog (main before it: 106 modules, 19,294 lines).
TARGET_MODULES, TARGET_LINES = 45, 8_000
# Training loads no part of envcheck (chapter 01's checks), the planner, nor faults' diagnosis.
NEVER_IN_TRAINING = ("ecomkit.planner", "ecomkit.plan", "ecomkit.envcheck",
                     "ecomkit.faults.diagnose", "ecomkit.faults.reproduce", "ecomkit.faults.known_errors")
# A user's file (its reading, column maps, row checks), the writers, the padding study, and a saved model's files:
# a run on the catalog with a preset reads none of them.
USER_DATA = ("ecomkit.data.loaders", "ecomkit.data.columns", "ecomkit.data.file_rows", "ecomkit.data.writers",
             "ecomkit.data.padding", "ecomkit.models.checkpoint_files")
OTHER_STRATEGIES = ("ecomkit.parallel.zero", "ecomkit.parallel.mixed", "ecomkit.parallel.pipeline",
                    "ecomkit.parallel.fsdp", "ecomkit.parallel.tensor", "ecomkit.parallel.dims",
                    "ecomkit.parallel.accelerate_path", "ecomkit.parallel.comm_count")
# Loaded only when a run writes or reads a checkpoint, is preempted, compiles, takes --attn flex, clips by
# sentiment, or scores an nlu task; the prompts, their token ids and task nlu's targets only when a row has a
# prompt (task nlu, instruction pairs).
ON_REQUEST = ("ecomkit.faults.callbacks", "ecomkit.faults.checkpoint", "ecomkit.faults.safe_load", preempt.SAVE,
              "ecomkit.fast.compile", "ecomkit.fast.flex", loop.CLIP, "ecomkit.train.nlu_accuracy",
              "ecomkit.train.task_metrics", "ecomkit.data.formats", "ecomkit.data.prompt_ids", "ecomkit.data.targets")
OPTIONAL = ("ecomkit.parallel.compression", "ecomkit.fast.shm_allreduce", LORA, QUANT, HEALTH, "ecomkit.train.gen_eval",
            "ecomkit.train.generate", "ecomkit.train.hf_trainer", "ecomkit.train.sweep", metrics.REPORTING,
            metrics.TASK_SUMMARY)


def floors() -> list[list[str]]:
    """The import-linter layers of pyproject.toml, top first, each a list of package names."""
    layers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    return [[name.strip() for name in layer.replace(":", "|").split("|")] for layer in layers]


def floor_of(module: str) -> int:
    """The index of ``module``'s floor counted from the bottom (ground is 0)."""
    top = module.split(".")[1]
    return next(i for i, layer in enumerate(reversed(floors())) if top in layer)


def loaded(modules, prefixes) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


# ---------------------------------------------------------------------- the registry
def test_every_registered_strategy_resolves_and_sits_on_the_parallel_floor():
    parallel = floor_of("ecomkit.parallel")
    targets = {spec.factory for spec in STRATEGIES.values()} | set(DDP_HOOKS.values()) | {
        t for spec in STRATEGIES.values() for t in (spec.run_callbacks, spec.checkpoint_callback) if t}
    for target in targets:
        assert find(target) is not None and target.startswith("ecomkit.parallel."), target
    assert set(STRATEGIES) == set(StrategyName)
    assert [floor_of(m) < parallel for m in (LORA, QUANT)] == [True, True]   # models: below the strategies
    assert floor_of(STATE_BYTES) == parallel and callable(find(f"{STATE_BYTES}:model_state_bytes"))
    for module, name in ((metrics.REPORTING, "open_sinks"), (metrics.TASK_SUMMARY, "task_lines")):  # metrics finds
        assert floor_of(module) == floor_of("ecomkit.metrics") and callable(find(f"{module}:{name}"))
    assert find(f"{HEALTH}:HealthMonitor").__module__ == HEALTH              # faults find their own module
    for module in (loop.PACKING, loop.GENERATION, loop.SCORING, loop.VERDICT, loop.CLIP, preempt.SAVE):   # at or below
        assert floor_of(module) <= floor_of("ecomkit.train") and find(f"{module}:__name__") == module
    assert find(f"{attention.SDPA}:BloomSdpaAttention").ecomkit_attn == "sdpa"   # --attn sdpa, found by fast


def test_the_health_monitor_is_found_when_a_flag_asks_for_it_and_only_then():
    """``faults.health`` loads by name (``HEALTH``): off by default, once when asked, never added twice."""
    def monitors(callbacks):
        return [c for c in callbacks if type(c).__name__ == "HealthMonitor"]
    cfg = TrainConfig()
    assert not monitors(add_fault_tolerance_callbacks(cfg))
    for field, value in (("health_interval", 2), ("hang_dump_s", 30.0)):
        asked = TrainConfig()
        setattr(asked.fault, field, value)
        once = add_fault_tolerance_callbacks(asked)
        assert len(monitors(once)) == 1 and len(monitors(add_fault_tolerance_callbacks(asked, once))) == 1


@pytest.mark.parametrize("strategy,parallel", [("ddp", {}), ("accelerate", {}), ("zero", {}), ("fsdp", {}),
                                               ("tp", {}), ("pp", {}), ("mixed", {"tp": 2}), ("mixed", {"pp": 2})])
def test_a_strategy_takes_the_chunked_loss_where_the_config_rule_says(strategy, parallel):
    """``--loss-kernel auto`` is resolved before any strategy exists (train/resolve.py), from the config's rule;
    each strategy's own ``supports_chunked_loss`` must agree with it."""
    cfg = TrainConfig(strategy=strategy, precision="fp32")
    for name, value in parallel.items():
        setattr(cfg.parallel, name, value)
    cfg.validate(2)
    built = build_strategy(cfg, DistEnv(rank=0, world_size=2, local_world_size=2, device=torch.device("cpu")))
    assert built.supports_chunked_loss == (forward_loss_unsupported(cfg) is None)


# ---------------------------------------------------------------------- what runs load
@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    ranks = run_script(SCRIPT, [*QUICK, "--output-dir", str(out)], nproc=2, workdir=out)
    assert len(ranks) == 2
    return ranks


@pytest.mark.dist
def test_a_ddp_run_loads_its_strategy_by_name_and_no_one_elses(ddp_run):
    for rank in ddp_run:
        assert "ecomkit.parallel.ddp" in rank.modules   # found by name, and counted: -X importtime sees it
        # STATE_BYTES: only a memory report needs it in DDP (ZeRO's state module counts its partitions with it)
        assert not loaded(rank.modules, NEVER_IN_TRAINING + OTHER_STRATEGIES + OPTIONAL + USER_DATA + (STATE_BYTES,))
        assert not rank.lab   # the measurement lab (ecomlab): measure, claims, plots, derive


@pytest.mark.dist
def test_a_ddp_run_that_writes_no_checkpoint_loads_no_checkpoint_code(ddp_run):
    """Preemption is on, but the checkpoint code loads only at a signal; no --compile, no nlu figures."""
    for rank in ddp_run:
        assert not loaded(rank.modules, ON_REQUEST)


def test_the_loop_loads_what_a_flag_asks_for_only_when_it_asks():
    """Importing the training loop loads no checkpoint, compile, candidate-scoring or baseline-verdict module."""
    assert not loaded(python_import("ecomkit.train.loop").modules, ON_REQUEST)


@pytest.mark.dist
def test_a_ddp_run_loads_at_most_45_modules_and_8000_lines(ddp_run):
    for rank in ddp_run:
        assert len(rank.modules) <= TARGET_MODULES and rank.lines <= TARGET_LINES, (len(rank.modules), rank.lines)


@pytest.mark.slow
def test_a_zero_run_loads_deepspeed_s_strategy_and_no_other(tmp_path):
    out = tmp_path / "zero"
    [cost] = run_script(SCRIPT, [*QUICK, "--strategy", "zero", "--zero-stage", "2", "--precision", "fp32",
                                 "--output-dir", str(out)])
    assert {"ecomkit.parallel.zero.strategy", "ecomkit.parallel.zero.config"} <= cost.modules
    others = [m for m in OTHER_STRATEGIES if m != "ecomkit.parallel.zero"] + ["ecomkit.parallel.ddp"]
    assert not loaded(cost.modules, NEVER_IN_TRAINING + tuple(others) + OPTIONAL) and not cost.lab


@pytest.mark.slow
def test_a_lora_run_on_a_csv_with_packing_loads_those_parts_and_no_strategy_but_its_own(tmp_path):
    data = tmp_path / "reviews.csv"
    data.write_text("title,category\n" + "".join(f"华为 手机 {i} 号,手机\n小米 耳机 {i},耳机\n" for i in range(60)),
                    encoding="utf-8")
    out = tmp_path / "lora"
    [cost] = run_script(SCRIPT, [*QUICK, "--task", "nlu", "--data", str(data), "--peft", "lora", "--packing", "on",
                                 "--gen-eval-samples", "0", "--output-dir", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["packing"] and summary["peft"] == "lora"
    assert {LORA, loop.PACKING, "ecomkit.data.loaders", "ecomkit.parallel.ddp"} <= cost.modules
    assert not loaded(cost.modules, NEVER_IN_TRAINING + OTHER_STRATEGIES + ("ecomkit.parallel.compression",))
    assert not cost.lab


def test_the_mixed_strategies_module_loads_no_other_strategy():
    """FSDP2, TP and PP share chapter 04's module (``parallel.mixed``): importing it loads none of the others'."""
    cost = python_import("ecomkit.parallel.mixed")
    assert not loaded(cost.modules, NEVER_IN_TRAINING + ("ecomkit.parallel.zero", "ecomkit.parallel.ddp",
                                                         "ecomkit.parallel.accelerate_path", "ecomkit.train",
                                                         "ecomkit.parallel.compression"))


def test_the_ddp_step_reads_in_at_most_ten_files_and_2500_lines():
    """Issue 55 item 3: one DDP step, script to optimizer, in the files docs/architecture.md lists."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    section = doc.split("<!-- ddp-step-files -->")[1]
    files = [line.split("`")[1] for line in section.splitlines() if line.startswith("- `")]
    lines = sum(len((REPO / f).read_text(encoding="utf-8").splitlines()) for f in files)
    assert len(files) <= 10 and lines <= 2_500, (files, lines)
    assert {"scripts/02_data_parallel.py", "ecomkit/train/loop.py", "ecomkit/parallel/ddp.py",
            "ecomkit/parallel/base.py", "ecomkit/models/optim.py"} <= set(files)
    assert all(Path(REPO / f).is_file() for f in files)
