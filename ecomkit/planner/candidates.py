"""The setups ``--recommend`` searches, and the exact launch line of each (chapter 06).

Why one list: a recommendation is only useful if the loop trains it, so each candidate is the user's
:class:`~ecomkit.config.TrainConfig` with its strategy fields replaced, validated as a script validates it. Full
fine-tuning (:data:`FULL`) and LoRA (:data:`LORA`) train different parameters and are ranked apart.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from ecomkit.config import MESH_STRATEGIES, StrategyName, TrainConfig
from ecomkit.models.bloom import HUB_IDS, PRESETS
from ecomkit.planner.job import PLANNER_FIELDS, Cluster, get_field
from ecomkit.planner.shapes import ModelShape

FULL = "full fine-tuning (every parameter trains)"
SCRIPTS = {StrategyName.DDP: "scripts/02_data_parallel.py", StrategyName.ZERO: "scripts/03_zero3.py",
           StrategyName.FSDP: "scripts/04_mixed_parallel.py", StrategyName.TP: "scripts/04_mixed_parallel.py",
           StrategyName.PP: "scripts/04_mixed_parallel.py", StrategyName.MIXED: "scripts/04_mixed_parallel.py"}
# Fields a candidate sets; everything else is the user's job unchanged.
STRATEGY_FIELDS = {"strategy": "ddp", "zero.stage": 3, "zero.offload_optimizer": False, "zero.offload_param": False,
                   "zero.activation_checkpointing": False, "parallel.dp": -1, "parallel.tp": 1, "parallel.pp": 1,
                   "parallel.fsdp_cpu_offload": False, "parallel.activation_checkpointing": False,
                   "parallel.pp_balance": "layers"}


@dataclass(frozen=True)
class Candidate:
    """One setup to try: a label, its group, and the TrainConfig fields it sets (dotted names)."""

    label: str
    settings: dict[str, Any] = field(default_factory=dict)
    group: str = FULL

    def config(self, base: TrainConfig) -> TrainConfig:
        cfg = copy.deepcopy(base)
        for name, value in {**STRATEGY_FIELDS, **self.settings}.items():
            set_field(cfg, name, value)
        return cfg


def set_field(cfg: Any, dotted: str, value: Any) -> None:
    *outer, last = dotted.split(".")
    obj = cfg
    for part in outer:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def _with_checkpointing(label: str, settings: dict[str, Any], key: str) -> list[Candidate]:
    return [Candidate(label, settings), Candidate(label + " + AC", {**settings, key: True})]


def full_candidates(cluster: Cluster, shape: ModelShape) -> list[Candidate]:
    """Every strategy the loop trains, on ``cluster``, that the model's shape allows."""
    n, zero_ac, mesh_ac = cluster.gpus, "zero.activation_checkpointing", "parallel.activation_checkpointing"
    out = [Candidate("DDP", {"strategy": "ddp"})]
    for stage in (1, 2, 3):
        z = {"strategy": "zero", "zero.stage": stage}
        out += _with_checkpointing(f"ZeRO-{stage}", z, zero_ac)
        out += _with_checkpointing(f"ZeRO-{stage} + offload opt", {**z, "zero.offload_optimizer": True}, zero_ac)
    out += _with_checkpointing("ZeRO-3 + offload opt+param", {"strategy": "zero", "zero.stage": 3,
                                                              "zero.offload_optimizer": True,
                                                              "zero.offload_param": True}, zero_ac)
    if n > 1:
        out += _with_checkpointing("FSDP2", {"strategy": "fsdp"}, mesh_ac)
        out += _with_checkpointing("FSDP2 + CPU offload", {"strategy": "fsdp", "parallel.fsdp_cpu_offload": True},
                                   mesh_ac)
    for tp in range(2, cluster.gpus_per_node + 1):   # TP inside a node: its all-reduces are on every layer's path
        if n % tp == 0 and shape.n_head % tp == 0:
            out += _with_checkpointing(f"TP {tp} × DP {n // tp}", {"strategy": "mixed", "parallel.tp": tp}, mesh_ac)
    for pp in range(2, n + 1):
        if n % pp == 0 and pp <= shape.n_layer:
            out += _pipelines(f"PP {pp} × DP {n // pp}", {"strategy": "mixed", "parallel.pp": pp})
    for tp, pp in three_d_degrees(cluster, shape):
        out += _pipelines(f"TP {tp} × PP {pp} × DP {n // (tp * pp)}",
                          {"strategy": "mixed", "parallel.tp": tp, "parallel.pp": pp})
    return out


def _pipelines(label: str, settings: dict[str, Any]) -> list[Candidate]:
    """A pipeline layout with its stages cut by block count and by compute, each without and with checkpointing.

    Why both: by compute the step is faster, but the first stages hold more blocks' activations; the plan says which
    fits.
    """
    out = []
    for balance, suffix in (("layers", ""), ("compute", " · stages by compute")):
        out += _with_checkpointing(label + suffix, {**settings, "parallel.pp_microbatches": settings["parallel.pp"],
                                                    "parallel.pp_balance": balance},
                                   "parallel.activation_checkpointing")
    return out


def three_d_degrees(cluster: Cluster, shape: ModelShape) -> list[tuple[int, int]]:
    """(tp, pp) pairs of the dp × tp × pp layouts: TP inside a node, stages across, dp whatever is left (>= 1)."""
    n = cluster.gpus
    return [(tp, pp) for tp in range(2, cluster.gpus_per_node + 1) for pp in range(2, n // tp + 1)
            if shape.n_head % tp == 0 and cluster.gpus_per_node % tp == 0 and n % (tp * pp) == 0
            and pp <= shape.n_layer]


LORA = "LoRA adapters (trains other parameters than full fine-tuning: ranked on its own)"


def lora_candidates(cluster: Cluster, shape: ModelShape) -> list[Candidate]:
    """The strategies ecomkit trains LoRA with (DDP, ZeRO-1/2/3, FSDP2; no TP/PP), checkpointing off and on.

    No offload: the adapters' optimizer states are tiny, and the time model would charge CPU Adam for every parameter.
    """
    zero_ac, mesh_ac, lora = "zero.activation_checkpointing", "parallel.activation_checkpointing", {"peft": "lora"}
    out = [Candidate("LoRA · DDP", {**lora, "strategy": "ddp"}, LORA)]
    for stage in (1, 2, 3):
        for c in _with_checkpointing(f"LoRA · ZeRO-{stage}", {**lora, "strategy": "zero", "zero.stage": stage},
                                     zero_ac):
            out.append(Candidate(c.label, c.settings, LORA))
    if cluster.gpus > 1:
        for c in _with_checkpointing("LoRA · FSDP2", {**lora, "strategy": "fsdp"}, mesh_ac):
            out.append(Candidate(c.label, c.settings, LORA))
    return out


def _flag(dotted: str) -> str:
    return "--" + dotted.replace(".", "-").replace("_", "-")


def job_flags(cfg: TrainConfig, given: set[str]) -> list[str]:
    """The scripts' flags that make a script run ``cfg``: every field the plan read, and those the user set.

    All planner fields are written out (a script's own defaults must not change the job), except the sections the
    strategy does not read.
    """
    skip = {"global_batch_size"}                  # grad_accum is written out instead
    if cfg.strategy != StrategyName.ZERO:         # a section the job's strategy does not read
        skip |= {n for n in PLANNER_FIELDS if n.startswith("zero.")}
    if cfg.strategy not in MESH_STRATEGIES:
        skip |= {n for n in PLANNER_FIELDS if n.startswith("parallel.")}
    if cfg.peft == "none":
        skip |= {n for n in PLANNER_FIELDS if n.startswith("lora_")}
    names = [n for n in PLANNER_FIELDS if n not in skip]
    names += sorted(set(given) - set(PLANNER_FIELDS))
    out: list[str] = []
    for name in names:
        try:
            value = get_field(cfg, name)
        except AttributeError:
            continue
        if isinstance(value, bool):
            out.append(_flag(name) if value else "--no-" + _flag(name)[2:])
        elif value is None:
            continue
        elif isinstance(value, dict):
            out += [_flag(name), json.dumps(value, ensure_ascii=False)]
        else:
            out += [_flag(name), str(value)]
    return out


def checkpoint_note(model: str) -> str | None:
    """Where the user's checkpoint goes in a launch line built from a preset (None for a folder or hub id).

    Why: run as printed, the line trains the preset's shape from a random init.
    """
    if model not in PRESETS:
        return None
    real = HUB_IDS.get(model)
    where = (f"--model {real} (or the folder you downloaded it to, e.g. ./models/{real.split('/')[-1]})" if real
             else "--model <your checkpoint folder or hub id>")
    return (f"--model {model} above is ecomkit's random-init preset of that shape; to fine-tune your checkpoint, "
            f"put it there: {where}")


def launch_line(cfg: TrainConfig, cluster: Cluster, given: set[str], launcher: str = "torchrun") -> str:
    """``torchrun …`` (or ``deepspeed …`` for ZeRO) that trains ``cfg`` on ``cluster`` with the scripts' flags."""
    script = SCRIPTS[StrategyName(cfg.strategy)]
    flags = job_flags(cfg, given)
    if launcher == "deepspeed":
        head = ["deepspeed", "--num_gpus", str(cluster.gpus_per_node)]
        if cluster.nodes > 1:
            head += ["--num_nodes", str(cluster.nodes), "--hostfile", "hostfile"]
    elif cluster.nodes > 1:
        head = ["torchrun", "--nnodes", str(cluster.nodes), "--nproc_per_node", str(cluster.gpus_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", "$MASTER_ADDR:29500"]
    else:
        head = ["torchrun", "--standalone", "--nproc_per_node", str(cluster.gpus)]
    return " ".join(shlex.quote(a) if not a.startswith("$") else a for a in [*head, script, *flags])


__all__ = ["Candidate", "FULL", "LORA", "lora_candidates", "SCRIPTS", "STRATEGY_FIELDS", "full_candidates", "three_d_degrees", "job_flags", "launch_line", "checkpoint_note",
           "set_field"]
