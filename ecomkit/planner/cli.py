"""``python -m ecomkit.plan``: will this training job fit, how fast will it run, and what should I run? (chapter 06)

A plan is the job a training script would run (every TrainConfig flag, with the
scripts' names, defaults and validation, and ``--config my.yaml``) plus a
cluster (``--gpus``, ``--gpu``, ``--link``, ``--node``, ``--nodes``).

Examples::

    python -m ecomkit.plan --model ecomgpt-7b --gpus 4 --gpu rtx4090 --strategy zero --zero-stage 3 \\
        --zero-offload-optimizer --zero-offload-param --precision bf16 --seq-len 512 --micro-batch-size 4
    python -m ecomkit.plan --model ecomgpt-7b --gpus 8 --gpu a100-40g --precision bf16 --recommend
    python -m ecomkit.plan --model seqgpt-560m --gpus 4 --gpu rtx4090 --link pcie4-x16 --recommend --verify
    python -m ecomkit.plan --model ecomgpt-7b --gpus 16 --nodes 2 --link ib-200g --strategy mixed --tp 2 --pp 2
    python -m ecomkit.plan --n-params 7.5e9 --gpus 64          # the ZeRO paper's model-state table
    python -m ecomkit.plan --config my.yaml --gpus 8 --json

It prints the per-GPU memory table (parameters, gradients, optimizer states,
activations, temporary buffers), the verdict for the chosen GPU, the largest
micro-batch that fits, the predicted step time and speed-up over one GPU, and
the defaults it used. ``--recommend`` searches every strategy ecomkit trains
(the 3-D TP × PP × DP layouts among them) and prints the ranked table and the
launch line; ``--verify`` runs the top candidates scaled down on this machine.

The 3-D layout (``--strategy mixed`` with ``--dp/--tp/--pp``) is planned rank
by rank as chapter 04 trains it: pipeline stages outermost (``--parallel-pp-
balance``: by blocks or by compute), each stage's blocks split over its tp
ranks, the result sharded by FSDP2 over dp; ranks fill the mesh tp innermost.
With ``--nodes N`` a group of ranks inside one node (TP's, and dp or pp
groups that fit) is timed on the GPU's own link, the others on ``--link``.

The planner's older flags still work:
``--zero N``, ``--micro-batch``, ``--tp``/``--pp``, ``--checkpointing``,
``--offload-optimizer``, ``--offload-param``, ``--strategy zero2|fsdp2``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable

from ecomkit.config import TrainConfig, build_arg_parser, load_config_file
from ecomkit.config.cli import config_from_namespace
from ecomkit.errors import exit_on_user_error
from ecomkit.hardware import GIB, GPUS
from ecomkit.planner.links import LINKS, NODES
from ecomkit.planner.job import (CLUSTER_DEFAULTS, PLANNER_FIELDS, Cluster, apply_strategy_switches,
                                 cluster_defaults_used, defaults_used, expand_planner_aliases, given_fields,
                                 planned_seq_len,
                                 lora_plan, plan_job)
from ecomkit.planner.gpu_efficiency import efficiency_for
from ecomkit.planner.lora import max_lora_micro_batch
from ecomkit.planner.memory import DOMINANT_SHARE, max_micro_batch
from ecomkit.planner.model_states import render_zero_stage_table, zero_stage_table
from ecomkit.planner.recommend import STEP_TIE, mostly
from ecomkit.planner.report import ds_config, explain_parts, recommendation_json, render_recommendation
from ecomkit.planner.shapes import model_shape, shape_for_n_params
from ecomkit.planner.step_time import DEFAULT_EFFICIENCY, DEFAULT_OVERLAP, predict_step_time, speedups

CLUSTER_FLAGS = ("gpus", "gpu", "link", "node", "nodes")


def _planner_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster and planner (not training flags)")
    s = argparse.SUPPRESS
    g.add_argument("--gpus", type=int, metavar="N", default=s, help=f"GPUs in all, the world size (default {CLUSTER_DEFAULTS.gpus})")
    g.add_argument("--gpu", default=s, metavar="NAME", help=f"one of {', '.join(GPUS)} (default {CLUSTER_DEFAULTS.gpu})")
    g.add_argument("--link", default=s, metavar="NAME", help=f"GPU interconnect: {', '.join(LINKS)} (default: the "
                   "--gpu's own link, PCIe for cards without NVLink such as rtx4090, NVLink for SXM boards); with "
                   "--nodes > 1 the link between nodes: groups of ranks inside one node (TP's, and the dp or pp "
                   "groups of a 3-D layout that fit) use the --gpu's own link")
    g.add_argument("--node", default=s, metavar="NAME", help=f"server layout for CPU offload: {', '.join(NODES)} "
                   "(default: the usual system of --gpu)")
    g.add_argument("--nodes", type=int, metavar="N", default=s, help="servers the GPUs are spread over (default 1)")
    g.add_argument("--vocab-size", type=int, metavar="N", default=None, help="vocabulary of the toy presets (their tokenizer)")
    g.add_argument("--n-params", type=float, metavar="PSI", default=None,
                   help="plan model states for this many parameters (Ψ) by ZeRO stage: the ZeRO paper's table")
    g.add_argument("--zero-table", action="store_true", help="also print model states by ZeRO stage for --model")
    g.add_argument("--efficiency", type=float, metavar="X", default=None,
                   help="fraction of peak FLOP/s reached (default: the one fitted on this repository's GPU artifacts "
                        f"for --gpu, else {DEFAULT_EFFICIENCY}, an assumption that makes GPU times optimistic)")
    g.add_argument("--overlap", type=float, metavar="X", default=DEFAULT_OVERLAP, help="fraction of backward that hides comm")
    g.add_argument("--recommend", action="store_true",
                   help="search every strategy ecomkit trains for the fastest that fits the same global batch; "
                        f"step times within {STEP_TIE * 100:.0f}%% of the fastest are a tie, which goes to the simpler "
                        "layout (DDP, ZeRO-1/2, ZeRO-3/FSDP2, TP/PP, then TP × PP × DP; offload and checkpointing "
                        "add), then the smaller peak memory")
    g.add_argument("--top", type=int, metavar="N", default=8, help="with --recommend: rows of the table")
    g.add_argument("--explain", action="store_true",
                   help="print the memory parts of every candidate (with --recommend) or of the plan: parameters, "
                        "gradients, optimizer states, activations, logits, buffers (communication, gathered "
                        "weights, autocast copies, CUDA context), the step's total and the loading copy; the table's "
                        f"'peak mostly' column names a part that holds {DOMINANT_SHARE * 100:.0f}%% or more of the peak")
    g.add_argument("--verify", action="store_true",
                   help="with --recommend: train the top candidates scaled down on this machine (2 CPU processes) "
                        "and compare their model states with the plan; a twin OFF PLAN comes with what it means "
                        "for the verdicts above it and what to do")
    g.add_argument("--verify-top", type=int, metavar="N", default=3, help="with --verify: how many candidates")
    g.add_argument("--verify-dir", default=None, metavar="PATH",
                   help="with --verify: where the twins write their runs (default: a new temporary directory)")
    g.add_argument("--print-ds-config", action="store_true", help="print the DeepSpeed JSON of the (recommended) "
                   "ZeRO job and exit")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    old = p.add_argument_group("the planner's older flags (aliases)")
    old.add_argument("--checkpointing", "--activation-checkpointing", action="store_true", dest="plan_checkpointing",
                     help="activation checkpointing of the job's strategy (--zero- / --parallel-activation-"
                          "checkpointing)")
    old.add_argument("--offload-optimizer", action="store_true", dest="plan_offload_optimizer",
                     help="= --zero-offload-optimizer")
    old.add_argument("--offload-param", action="store_true", dest="plan_offload_param",
                     help="= --zero-offload-param (ZeRO-3), --parallel-fsdp-cpu-offload (FSDP2)")
    old.add_argument("--zero", metavar="{0,1,2,3}", dest="plan_zero", help="= --strategy zero --zero-stage N")
    old.add_argument("--micro-batch", metavar="N", dest="plan_micro_batch", help="= --micro-batch-size N")


def build_parser() -> argparse.ArgumentParser:
    parser = build_arg_parser(__doc__, extra=_planner_flags)
    parser.prog = "python -m ecomkit.plan"
    return parser


@dataclass
class Job:
    """What the command line described: the training config, the cluster, and which fields the user set."""

    cfg: TrainConfig
    cluster: Cluster
    given: set[str]
    args: argparse.Namespace

    @property
    def vocab_size(self) -> int | None:
        return self.args.vocab_size


def read_job(argv: list[str] | None) -> Job:
    """Parse like the scripts parse (preset → ``--config`` → flags), then the cluster; validated."""
    argv = expand_planner_aliases(sys.argv[1:] if argv is None else list(argv))
    ns = build_parser().parse_args(argv)
    cfg = config_from_namespace(ns)
    ns.seq_len_note = planned_seq_len(cfg)[1]   # --seq-len auto: planned at the model's limit, said so in the plan
    apply_strategy_switches(cfg, ns.plan_checkpointing, ns.plan_offload_optimizer, ns.plan_offload_param)
    config_dests = {d for d in vars(ns) if hasattr(cfg, d.split("__")[0])}
    given = given_fields(config_dests, load_config_file(ns.config) if ns.config else {})
    cluster = Cluster(**{k: getattr(ns, k) for k in CLUSTER_FLAGS if hasattr(ns, k)}).validate()
    cluster_given = {k for k in CLUSTER_FLAGS if hasattr(ns, k)}
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, ensure_ascii=False))
        raise SystemExit(0)
    return Job(cfg, cluster, given | {f"cluster.{k}" for k in cluster_given}, ns)


def config_given(job: Job) -> set[str]:
    return {g for g in job.given if not g.startswith("cluster.")}


def run_plan(job: Job) -> dict[str, Any]:
    a = job.args
    plan = plan_job(job.cfg, job.cluster, job.vocab_size, base_bits=job.cfg.lora_base_bits)
    if getattr(a, "seq_len_note", None):
        plan.notes.append(a.seq_len_note)
    lora = lora_plan(job.cfg, job.cfg.lora_base_bits)
    if lora is not None:
        plan.notes.append("step time below: the time model is full fine-tuning's (LoRA skips the frozen weights' "
                          "gradient matmuls and most gradient communication), so it is an upper bound")
    efficiency, note = plan_efficiency(job)
    if note:
        plan.notes.append(note)
    time_kw = {**job.cluster.time_links(), "efficiency": efficiency, "overlap": a.overlap}
    step = predict_step_time(plan.inputs, **time_kw)
    scale = speedups(plan.inputs, [plan.inputs.world_size], **time_kw)[0] if plan.inputs.world_size > 1 else None
    cluster_given = {g.removeprefix("cluster.") for g in job.given if g.startswith("cluster.")}
    most = max_micro_batch(plan.inputs) if lora is None else max_lora_micro_batch(plan.inputs, lora)
    return {"plan": plan, "max_micro_batch": most, "step": step, "speedup": scale, "efficiency": efficiency,
            "defaults": defaults_used(job.cfg, config_given(job)), "preset": a.preset,
            "cluster_defaults": cluster_defaults_used(job.cluster, cluster_given)}


def plan_efficiency(job: Job) -> tuple[float, str | None]:
    """``--efficiency`` as given, else the GPU's fitted one (or the default, with why it is optimistic)."""
    if job.args.efficiency is not None:
        return job.args.efficiency, None
    return efficiency_for(job.cluster.gpu)


def defaults_line(result: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in result["defaults"].items())
    cluster = ", ".join(f"{k}={v}" for k, v in result["cluster_defaults"].items())
    source = f"--preset {result['preset']}" if result.get("preset") else "TrainConfig(), as the scripts' parser gives them"
    return (f"defaults used ({source}): {shown}\n"
            f"cluster defaults used: {cluster or 'none'}")


def render(result: dict[str, Any], explain: bool = False) -> str:
    plan, step = result["plan"], result["step"]
    lines = [plan.verdict(), "", plan.table(), "",
             f"largest micro-batch that fits: {result['max_micro_batch']}", "",
             "predicted step time per GPU (s)",
             f"  compute              {step.compute_s:8.3f}",
             f"  communication        {step.comm_s:8.3f}  (exposed after overlap: {step.comm_exposed_s:.3f})",
             f"  optimizer            {step.optimizer_s:8.3f}",
             f"  CPU offload          {step.offload_s:8.3f}",
             f"  total                {step.total_s:8.3f}  ({step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU)"]
    if result["speedup"]:
        s = result["speedup"]
        lines.append(f"speed-up over 1 GPU (same global batch; one GPU accumulates {plan.inputs.dp}× more): "
                     f"{s['speedup']:.2f}× ({s['efficiency']:.0%} scaling efficiency)")
    lines += [f"note: {n}" for n in plan.notes]
    if plan.inputs.loss_chunk_tokens and not plan.inputs.loss_chunk():
        lines.append(f"note: loss_chunk_tokens={plan.inputs.loss_chunk_tokens} is not used by {plan.inputs.strategy}: "
                     "its loop builds the full logits (the chunked loss runs under ddp, zero and fsdp2 without "
                     "tp or pp)")
    if mostly(plan):
        lines.append(f"note: the peak is mostly {mostly(plan)}")
    if explain:
        row = {"candidate": plan.inputs.strategy, "memory_parts": plan.parts(), "train_bytes": plan.total,
               "load_bytes": plan.load_bytes}
        lines += ["", *explain_parts([row])]
    lines += ["", defaults_line(result)]
    return "\n".join(lines)


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    plan, step = result["plan"], result["step"]
    inputs = asdict(plan.inputs)
    inputs["model"] = plan.shape.name
    return {"inputs": inputs, "psi": plan.shape.n_params, "breakdown_bytes": plan.breakdown(),
            "memory_parts": plan.parts(), "mostly": mostly(plan),
            "total_bytes": plan.total, "cpu_bytes": plan.cpu_bytes, "gpu": plan.gpu.name,
            "gpu_bytes": plan.gpu.memory_bytes, "fits": plan.fits, "max_micro_batch": result["max_micro_batch"],
            "step_time": {**asdict(step), "total_s": step.total_s}, "speedup": result["speedup"],
            "efficiency": result["efficiency"], "notes": list(plan.notes),
            "total_gib": plan.total / GIB, "load_bytes": plan.load_bytes, "peak_bytes": plan.peak,
            "defaults_used": result["defaults"], "cluster_defaults_used": result["cluster_defaults"]}


def zero_table(job: Job) -> tuple[str, list[dict[str, Any]]]:
    a = job.args
    shape = shape_for_n_params(int(a.n_params)) if a.n_params else model_shape(job.cfg.model, job.vocab_size)
    precision = "fp32" if job.cfg.precision == "fp32" else "bf16"
    rows = zero_stage_table(shape, job.cluster.gpus, precision)
    return render_zero_stage_table(shape, job.cluster.gpus, rows, precision), rows


@exit_on_user_error
def main(argv: list[str] | None = None, verify: Callable[..., Any] | None = None) -> None:
    """The command; ``verify`` is the twin runner (``ecomkit.plan`` passes ``ecomkit.planner.twins``)."""
    job = read_job(argv)
    a = job.args
    if a.n_params or a.zero_table:
        text, rows = zero_table(job)
        if a.n_params:
            print(json.dumps(rows, indent=2) if a.json else text)
            return
        if not a.json:
            print(text + "\n")
    if a.recommend or a.verify:
        efficiency, note = plan_efficiency(job)
        time_kw = {"efficiency": efficiency, "overlap": a.overlap}
        report = recommendation_json(job.cfg, job.cluster, config_given(job), job.vocab_size, time_kw)
        report["efficiency_note"] = note
        if a.print_ds_config:
            print(json.dumps(report["ds_config"], indent=2) if report.get("ds_config") else
                  "the recommended setup is not a DeepSpeed ZeRO job: no DeepSpeed JSON")
            return
        if a.verify:
            if verify is None:
                raise SystemExit("--verify runs through `python -m ecomkit.plan` (it launches training scripts).")
            report["verify"] = verify(report, top=a.verify_top, given=config_given(job), root=a.verify_dir)
        print(json.dumps(report, indent=2, default=str) if a.json else render_recommendation(report, a.top,
                                                                                              a.explain))
        return
    if a.print_ds_config:
        ds = ds_config(job.cfg, job.cluster)
        print(json.dumps(ds, indent=2) if ds else f"--strategy {job.cfg.strategy} is not a DeepSpeed job: no JSON")
        return
    result = run_plan(job)
    print(json.dumps(to_json(result), indent=2) if a.json else render(result, a.explain))


if __name__ == "__main__":
    main()


__all__ = ["build_parser", "read_job", "run_plan", "render", "to_json", "main", "Job", "PLANNER_FIELDS"]
