"""``--verify``: run the planner's top candidates as scaled-down twins on this machine, before any GPU hour is spent.

Why: a twin is the recommended job on the ``tiny`` preset, launched like a notebook launches its script with the launch
line's own flags, so it runs the real code path; its measured model states per rank are compared with the planner's, and
the measured ordering of the twins with the planned one.
"""

from __future__ import annotations

import copy
import math
import tempfile
from pathlib import Path
from typing import Any

from ecomkit.config import TrainConfig, apply_overrides
from ecomkit.errors import EcomkitError
from ecomkit.launch import read_json, run_torchrun
from ecomkit.planner.candidates import SCRIPTS, job_flags
from ecomkit.planner.job import Cluster, plan_input_from_config
from ecomkit.planner.memory import plan_memory

TWIN_MODEL = "tiny"
TWIN_SEQ_LEN = 32
TWIN_STEPS = 3
MAX_PROCS = 2               # what this machine runs side by side
MIB = 2**20
TIE = 0.02                  # model states within 2 % of each other are the same rank in an ordering
PLAN_GAP = 0.10             # a twin whose measured model states are more than 10 % off its plan is flagged
TWIN_FIELDS = ("n_rows", "max_steps", "warmup_steps", "eval_interval", "eval_batches", "output_dir", "progress",
               "save_model", "fault.checkpoint_interval")


def twin_config(cfg: TrainConfig, nproc: int, out_dir: Path) -> TrainConfig:
    """The job scaled down: tiny model, short sequences, fp32, a few steps; degrees capped at ``nproc``."""
    twin = copy.deepcopy(cfg)
    twin.model, twin.seq_len, twin.precision = TWIN_MODEL, TWIN_SEQ_LEN, "fp32"
    twin.n_rows, twin.max_steps, twin.warmup_steps = 200, TWIN_STEPS, 1
    twin.eval_interval, twin.eval_batches, twin.progress, twin.save_model = 0, 1, False, True
    twin.fault.checkpoint_interval = 0
    twin.output_dir = str(out_dir)
    par = twin.parallel
    par.tp = min(par.tp, nproc)
    par.pp = min(par.pp, max(1, nproc // par.tp))   # a 3-D job's twin keeps its tp × pp within the processes
    if par.pp > 1 and (twin.micro_batch_size * twin.grad_accum) % par.pp_microbatches:
        par.pp_microbatches = par.pp
    return twin


def measured_states(out_dir: Path) -> list[int] | None:
    """Model-state bytes per rank as the run counted them, or None where the script writes no per-rank file."""
    if (out_dir / "memory.json").is_file():
        return [int(r.get("total", 0)) for r in read_json(out_dir / "memory.json")["per_rank"]]
    if (out_dir / "parallel_layout.json").is_file():
        return [int(r["memory"]["total"]) for r in read_json(out_dir / "parallel_layout.json")["ranks"]]
    return None


def planned_states(twin: TrainConfig, nproc: int, vocab_size: int | None) -> int:
    """The planner's model-state bytes of the twin's worst rank, wherever they live (on CPU all is host memory).

    ``vocab_size``: the vocabulary the run sized the model by (its tokenizer's; read from ``final/config.json``).
    """
    inp = plan_input_from_config(twin, Cluster(gpus=nproc), vocab_size=vocab_size)
    plan = plan_memory(inp, device="cpu")
    return plan.model_states + plan.cpu_bytes


def run_twin(row: dict[str, Any], nproc: int, root: Path, given: set[str]) -> dict[str, Any]:
    cfg = apply_overrides(TrainConfig(), copy.deepcopy(row["config"]), "recommended config")
    out_dir = root / row["candidate"].replace(" ", "_").replace("+", "p").replace("×", "x")
    twin = twin_config(cfg, nproc, out_dir)
    script = SCRIPTS[twin.strategy]
    flags = job_flags(twin, set(given) | set(TWIN_FIELDS))
    result: dict[str, Any] = {"candidate": row["candidate"], "script": script, "nproc": nproc,
                              "command": f"torchrun --standalone --nproc_per_node {nproc} {script} " + " ".join(flags)}
    try:
        run_torchrun(script, flags, nproc=nproc, live=False, timeout=600)
        summary = read_json(out_dir / "summary.json")
    except EcomkitError as exc:
        return {**result, "ok": False, "error": str(exc).splitlines()[0]}
    first, final = summary.get("first_loss"), summary.get("final_loss")
    trained = summary.get("steps") == TWIN_STEPS and first is not None and math.isfinite(final)
    saved = (out_dir / "final" / "config.json").is_file()
    measured = measured_states(out_dir)
    vocab = read_json(out_dir / "final" / "config.json").get("vocab_size") if saved else None
    planned = planned_states(twin, nproc, vocab)
    return {**result, "ok": bool(trained and saved), "trained": trained, "saved": saved, "first_loss": first,
            "final_loss": final, "steps": summary.get("steps"), "error": "" if trained and saved else
            f"steps {summary.get('steps')}/{TWIN_STEPS}, saved {saved}",
            "measured_bytes": max(measured) if measured else None, "planned_bytes": planned,
            "measured_mib": f"{max(measured) / MIB:.2f}" if measured else None, "planned_mib": f"{planned / MIB:.2f}"}


def _order(values: dict[str, int]) -> list[list[str]]:
    """Names from smallest to largest, ties (within :data:`TIE`) grouped."""
    groups: list[list[str]] = []
    last = None
    for name, v in sorted(values.items(), key=lambda kv: kv[1]):
        if last is not None and v <= last * (1 + TIE):
            groups[-1].append(name)
        else:
            groups.append([name])
            last = v
    return groups


def orders_agree(planned: dict[str, int], measured: dict[str, int]) -> bool:
    """True when no pair the plan orders clearly (beyond :data:`TIE`) is measured the other way round."""
    names = list(planned)
    for a in names:
        for b in names:
            if planned[a] * (1 + TIE) < planned[b] and measured[a] > measured[b] * (1 + TIE):
                return False
    return True


def plan_gap(twin: dict[str, Any]) -> float | None:
    """measured / planned − 1 of a twin's model states (None when the script counts none)."""
    measured, planned = twin.get("measured_bytes"), twin.get("planned_bytes")
    return measured / planned - 1 if measured and planned else None


def ordering_check(planned: dict[str, int], measured: dict[str, int]) -> tuple[bool | None, str]:
    """(does the measured ordering match the planned one, the sentence that says so).

    None with fewer than two twins measured or with equal model states, where "matches" would say nothing.
    """
    if len(measured) < 2:
        return None, "not checked: fewer than two twins counted their model states"
    if len(_order(planned)) == 1:
        return None, (f"not checked: the plan gives every twin the same model states (within {TIE:.0%}), so "
                      "the ordering compares equal values")
    if len(_order(measured)) == 1:
        return None, (f"not checked: every twin measured the same model states (within {TIE:.0%}) where the plan "
                      "orders them, so the measurement cannot confirm the planned ordering")
    agree = orders_agree(planned, measured)
    return agree, "matches" if agree else "does NOT match"


def twin_checks(twins: list[dict[str, Any]]) -> dict[str, Any]:
    """The twins against their plan: each gap, those more than :data:`PLAN_GAP` off, and the ordering check."""
    for t in twins:
        t["plan_gap"] = plan_gap(t)
    measured = {t["candidate"]: t["measured_bytes"] for t in twins if t.get("measured_bytes")}
    planned = {t["candidate"]: t["planned_bytes"] for t in twins if t["candidate"] in measured}
    matches, note = ordering_check(planned, measured)
    return {"planned_order": _order(planned), "measured_order": _order(measured), "order_matches": matches,
            "order_note": note, "plan_gap_limit": PLAN_GAP,
            "off_plan": [t["candidate"] for t in twins if t["plan_gap"] is not None and abs(t["plan_gap"]) > PLAN_GAP]}


def verify_report(report: dict[str, Any], top: int = 3, given: set[str] | None = None,
                  root: str | Path | None = None) -> dict[str, Any]:
    """Run the top ``top`` fitting candidates of the full fine-tuning group as twins; the ``verify`` section."""
    group = next(iter(report["groups"].values()))
    rows = [r for r in group["rows"] if r["fits"] and r.get("config")][:top]
    nproc = min(report["cluster"]["gpus"], MAX_PROCS)
    root = Path(root) if root else Path(tempfile.mkdtemp(prefix="ecomkit-twins-"))
    twins = [run_twin(r, nproc, root, given or set()) for r in rows]
    return {"twin_model": TWIN_MODEL, "nproc": nproc, "backend": "gloo", "steps": TWIN_STEPS, "twins": twins,
            "output_root": str(root), "all_ok": all(t["ok"] for t in twins) and bool(twins), **twin_checks(twins)}


__all__ = ["twin_config", "run_twin", "verify_report", "orders_agree", "ordering_check", "twin_checks", "plan_gap",
           "measured_states", "planned_states", "PLAN_GAP", "TWIN_MODEL", "TWIN_STEPS"]
