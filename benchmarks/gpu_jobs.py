"""gpu_bench's script runs: the chapter scripts on the GPU(s), each with the planner's prediction beside it.

Every run is a training script as a user runs it (``scripts/02_data_parallel.py``,
``scripts/02_hf_trainer.py``, ...), one process per GPU, ``untimed`` warm-up
steps left out of its figures (``--untimed-steps``), the rest timed. Each row
carries, beside what the run measured, what ``python -m ecomkit.plan`` predicts
for the same flags on the same GPU (:func:`planned`): the training step's bytes
and the step time, the latter also split into its compute term at efficiency 1
and the rest, which is what ``ecomkit.planner.gpu_efficiency`` fits on.

Parts (``gpu_bench.py`` calls them):

- the catalog job (:func:`packing_part`): short rows bucketed, packed, and through HF Trainer
  (``group_by_length``), plain and compiled;
- 1,024-token rows (:func:`long_rows_part`): a file of long documents, split into windows of ``seq``
  tokens as ``--task lm`` does; ecomkit plain and ``--compile``, HF Trainer plain and compiled. The compiled
  ecomkit run's first step gives the compile time (:func:`compile_row`);
- the strategies on every visible GPU (:func:`strategy_part`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
from common import failure_reason  # noqa: E402

INSTALL_HINT = {"datasets": "pip install datasets", "deepspeed": "pip install deepspeed", "peft": "pip install peft",
                "bitsandbytes": "pip install 'bitsandbytes>=0.50.2,<0.51'"}
SCRIPTS = {  # name -> (script, strategy flags, packages it needs beyond torch/transformers)
    "ddp": ("02_data_parallel.py", ["--strategy", "ddp"], ("datasets",)),
    "fsdp2": ("04_mixed_parallel.py", ["--strategy", "fsdp"], ("datasets",)),
    "zero3": ("03_zero3.py", ["--strategy", "zero", "--zero-stage", "3"], ("datasets", "deepspeed")),
    # LoRA beside full fine-tuning, same job (r=16 on BLOOM's four Linears; frozen base in bf16)
    "ddp+lora": ("02_data_parallel.py", ["--strategy", "ddp", "--peft", "lora", "--lora-r", "16"], ("datasets", "peft")),
    "fsdp2+lora": ("04_mixed_parallel.py", ["--strategy", "fsdp", "--peft", "lora", "--lora-r", "16"],
                   ("datasets", "peft")),
    "zero3+lora": ("03_zero3.py", ["--strategy", "zero", "--zero-stage", "3", "--peft", "lora", "--lora-r", "16"],
                   ("datasets", "deepspeed", "peft")),
    # QLoRA: the same LoRA job on a 4-bit (nf4) base through bitsandbytes; ecomkit trains it under DDP only
    "ddp+qlora4": ("02_data_parallel.py", ["--strategy", "ddp", "--peft", "lora", "--lora-r", "16",
                                           "--lora-base-bits", "4"], ("datasets", "peft", "bitsandbytes")),
}
# Flags of the scripts that are not training-config fields (the planner does not take them).
SCRIPT_ONLY_FLAGS = {"--hf-sampling": 1, "--trl-packing": 0}


# ---------------------------------------------------------------------- launching
def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launch(nproc: int, script: str, args: list[str], timeout_s: float, tmp: Path) -> subprocess.CompletedProcess:
    """The script in one process (``python``), or under torchrun with ``nproc`` (one per GPU)."""
    # --standalone: torchrun binds its own free port and holds it (a port chosen here first could be taken
    # by another process before torchrun binds it)
    head = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                "--nproc_per_node", str(nproc)]
    return subprocess.run([*head, str(REPO / "scripts" / script), *args], cwd=REPO, env={**_env(), "TMPDIR": str(tmp)},
                          capture_output=True, text=True, timeout=timeout_s)


def run_script(row: dict[str, Any], nproc: int, script: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run one script; ``row`` plus ``status`` and its summary (``_summary``) and metrics rows (``_metrics``)."""
    out = Path(tempfile.mkdtemp(prefix="gpu-bench-run-"))
    t0 = time.perf_counter()
    try:
        proc = launch(nproc, script, [*args, "--output-dir", str(out)], timeout_s, out)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "reason": f"still running after {timeout_s:.0f} s"}
    if proc.returncode != 0 or not (out / "summary.json").exists():
        return {**row, "status": "error", "returncode": proc.returncode, "reason": failure_reason(proc)[:800]}
    metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return {**row, "status": "ok", "wall_s": time.perf_counter() - t0,
            "_summary": json.loads((out / "summary.json").read_text()), "_metrics": metrics}


def common_args(st: dict[str, Any], precision: str, steps: int, untimed: int) -> list[str]:
    return ["--model", st["script_model"], "--micro-batch-size", str(st["script_batch"]), "--max-steps", str(steps),
            "--untimed-steps", str(untimed), "--precision", precision, "--eval-interval", "0", "--eval-batches", "1",
            "--final-eval-samples", "8", "--warmup-steps", "2", "--no-save-model", "--no-progress",
            "--report-to", "none"]


def measured(row: dict[str, Any]) -> dict[str, Any]:
    """The figures of a finished run, from its summary and its steady metrics rows (MFU: their mean)."""
    s, rows = row.pop("_summary"), row.pop("_metrics")
    train = [r for r in rows if r.get("type") == "train"]
    untimed = (s.get("config") or {}).get("untimed_steps", 1)
    mfus = [r["mfu"] for r in train[untimed:] if r.get("mfu") is not None]
    seq_len = s.get("seq_len") or (s.get("config") or {}).get("seq_len")
    return {**row, "world_size": s.get("world_size"), "params": s.get("params"), "seq_len": seq_len,
            "packing": s.get("packing"), "samples_per_s": s.get("samples_per_s"), "tokens_per_s": s.get("tokens_per_s"),
            "step_time_s": s.get("step_time_s"), "steady_steps": s.get("steady_steps"),
            "fill_rate": s.get("fill_rate") or (1 - s["padding_rate"] if s.get("padding_rate") is not None else None),
            "peak_mem_bytes": s.get("peak_mem_bytes"), "mfu": statistics.mean(mfus) if mfus else None,
            "final_loss": s.get("final_loss"), "trainable_params": s.get("trainable_params"),
            "first_step_s": train[0]["step_time_s"] if train else None,
            "loss_kernel": (s.get("config") or {}).get("loss_kernel"), "attn": (s.get("config") or {}).get("attn")}


# ---------------------------------------------------------------------- the planner beside each row
def toy_vocab(model: str, params: int | None) -> int | None:
    """A toy preset's vocabulary from its parameter count (linear in it: tied embedding and head); None otherwise."""
    from ecomkit.models.bloom import PRESETS
    from ecomkit.planner.shapes import model_shape

    if params is None or model not in PRESETS or PRESETS[model].vocab_size is not None:
        return None
    p0, p1 = model_shape(model, 1000).n_params, model_shape(model, 2000).n_params
    return round(1000 + (params - p0) * 1000 / (p1 - p0))


def plan_fields(inp: Any, gpu: str, link: Any = None) -> dict[str, Any]:
    """The planner's bytes and step time for ``inp`` (a PlanInput): predicted, and split for the efficiency fit.

    ``link``: the GPUs' interconnect (the planner's default for ``gpu`` when None; one GPU sends nothing).
    """
    from ecomkit.planner.gpu_efficiency import efficiency_for
    from ecomkit.planner.memory import plan_memory
    from ecomkit.planner.step_time import predict_step_time

    plan = plan_memory(inp)
    efficiency, _ = efficiency_for(gpu)
    kw = {"link": link} if link is not None else {}
    at_one = predict_step_time(plan.inputs, efficiency=1.0, **kw)
    step = predict_step_time(plan.inputs, efficiency=efficiency, **kw)
    context = plan.temporary.get("cuda_context", 0)
    return {"plan_gpu": gpu, "plan_bytes": plan.total - context, "plan_step_s": step.total_s,
            "plan_efficiency": efficiency, "plan_compute_s": at_one.compute_s,
            "plan_other_s": at_one.total_s - at_one.compute_s}


def planned(row: dict[str, Any], args: list[str], gpu: str) -> dict[str, Any]:
    """``row`` with the planner's prediction for the script ``args`` on ``nproc`` × ``gpu``, and the ratios."""
    from ecomkit.planner.cli import read_job
    from ecomkit.planner.job import plan_input_from_config

    if row.get("status") != "ok":
        return row
    flags, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
        elif a in SCRIPT_ONLY_FLAGS:
            skip = SCRIPT_ONLY_FLAGS[a]
        else:
            flags.append(a)
    flags += ["--seq-len", str(row["seq_len"]), "--gpus", str(row["nproc"]), "--gpu", gpu]
    if str(row.get("script", "")).startswith("02_hf_trainer"):
        flags += ["--loss-kernel", "full"]        # Trainer computes the full logits
    try:
        job = read_job(flags)
        inp = plan_input_from_config(job.cfg, job.cluster, toy_vocab(row["model"], row.get("params")))
        # the cluster's interconnect as the plan command prices it (the GPU's default link unless --link is given)
        link = job.cluster.interconnect
        fields = plan_fields(inp, gpu, link)
    except Exception as exc:  # noqa: BLE001 - a job the planner cannot plan keeps its measurement
        return {**row, "plan_error": f"{type(exc).__name__}: {exc}"[:300]}
    out = {**row, **fields}
    if row.get("step_time_s"):
        out["plan_step_over_measured"] = fields["plan_step_s"] / row["step_time_s"]
    if row.get("peak_mem_bytes"):
        out["plan_bytes_over_measured"] = fields["plan_bytes"] / row["peak_mem_bytes"]
    return out


# ---------------------------------------------------------------------- the catalog job and 1,024-token rows
PACKING_CASES = {  # name -> (script, flags, compiled): the catalog's short rows, bucketed, packed, HF Trainer
    "catalog bucketed": ("02_data_parallel.py", ["--packing", "off"], False),
    "catalog packed": ("02_data_parallel.py", ["--packing", "on", "--seq-len", "PACKED_SEQ"], False),
    "catalog HF Trainer": ("02_hf_trainer.py", ["--hf-sampling", "group_by_length"], False),
    "catalog HF Trainer compiled": ("02_hf_trainer.py", ["--hf-sampling", "group_by_length", "--compile"], True),
}
PACKED_GOALS = {"catalog bucketed": 8.0, "catalog HF Trainer": 3.0}   # packed / each, real tokens/s
LONG_CASES = {  # the same job on 1,024-token rows: ecomkit and HF Trainer, each plain and compiled
    "long ecomkit": ("02_data_parallel.py", ["--packing", "off"], False),
    "long ecomkit compiled": ("02_data_parallel.py", ["--packing", "off", "--compile"], True),
    "long HF Trainer": ("02_hf_trainer.py", ["--hf-sampling", "group_by_length"], False),
    "long HF Trainer compiled": ("02_hf_trainer.py", ["--hf-sampling", "group_by_length", "--compile"], True),
}
LONG_GOAL = 1.2          # ecomkit at its best / HF Trainer at its best, real tokens/s on 1,024-token rows
COMPILE_GOAL_S = 60.0    # --compile's first step on seqgpt-560m


def job_case(part: str, name: str, cases: dict, st: dict[str, Any], pre: dict[str, Any], precision: str,
             timeout_s: float, extra: list[str]) -> dict[str, Any]:
    """One run of ``cases[name]`` on one GPU: measured after its warm-up steps, the planner beside it."""
    script, flags, compiled = cases[name]
    row: dict[str, Any] = {"part": part, "case": name, "script": script, "nproc": 1, "model": st["script_model"],
                           "micro_batch": st["script_batch"], "precision": precision, "compiled": compiled}
    if not pre["datasets"]:
        return {**row, "status": "skipped", "reason": f"datasets not installed ({INSTALL_HINT['datasets']})"}
    if compiled and st["dry_run"]:
        return {**row, "status": "skipped", "reason": "dry run: compiling takes minutes on a CPU (the GPU run "
                "compiles; tests/test_compile.py covers --compile on CPU)"}
    flags = [str(st["packed_seq"]) if f == "PACKED_SEQ" else f for f in flags]
    args = [*common_args(st, precision, st["job_steps"], st["job_untimed"]), *extra, *flags]
    done = run_script(row, 1, script, args, timeout_s)
    return planned(measured(done), args, st["plan_gpu"]) if done["status"] == "ok" else done


def jobs(part: str, cases: dict, st: dict[str, Any], pre: dict[str, Any], precision: str, deadline: float,
         extra: list[str], show) -> list[dict[str, Any]]:
    rows = []
    for name in cases:
        left = deadline - time.monotonic()
        rows.append(job_case(part, name, cases, st, pre, precision, min(st["script_timeout_s"], left), extra)
                    if left >= 30 else {"part": part, "case": name, "status": "skipped", "reason": "time budget spent"})
        show(rows[-1])
    return rows


def ratio_rows(part: str, rows: list[dict[str, Any]], goals: list[tuple[tuple[str, ...], tuple[str, ...], float]],
               dry_run: bool = False) -> list[dict[str, Any]]:
    """Per (numerator cases, denominator cases, goal): the best of each side's real tokens/s, divided.

    A dry run's ratio is the code path's, on a tiny model on a CPU: its verdict is n/a.
    """
    rate = {r["case"]: r["tokens_per_s"] for r in rows if r["status"] == "ok" and r.get("tokens_per_s")}
    out = []
    for num, den, goal in goals:
        top, bottom = [c for c in num if c in rate], [c for c in den if c in rate]
        if top and bottom:
            a, b = max(top, key=rate.get), max(bottom, key=rate.get)
            out.append({"part": f"{part}_ratio", "status": "ok", "case": f"{a} / {b}", "ratio": rate[a] / rate[b],
                        "goal": goal, "verdict": "n/a (dry run)" if dry_run else
                        "PASS" if rate[a] / rate[b] >= goal else "MISS"})
    return out


def packing_part(st: dict[str, Any], pre: dict[str, Any], precision: str, deadline: float, show) -> list[dict]:
    """The catalog job bucketed, packed into sequences of ``packed_seq``, through HF Trainer; then the ratios."""
    rows = jobs("packing", PACKING_CASES, st, pre, precision, deadline, ["--n-rows", str(st["catalog_rows"])], show)
    hf = ("catalog HF Trainer", "catalog HF Trainer compiled")
    return rows + ratio_rows("packing", rows, [(("catalog packed",), ("catalog bucketed",), PACKED_GOALS["catalog bucketed"]),
                                               (("catalog packed",), hf, PACKED_GOALS["catalog HF Trainer"])],
                             st["dry_run"])


def long_documents(path: Path, n_docs: int, rows_per_doc: int, seed: int = 0) -> Path:
    """A ``.jsonl`` of ``{"text": ...}`` documents, each ``rows_per_doc`` catalog rows' text run together."""
    from ecomkit.data.catalog import generate_catalog

    rows = generate_catalog(n_docs * rows_per_doc, seed)
    with open(path, "w", encoding="utf-8") as fh:
        for d in range(n_docs):
            part = rows[d * rows_per_doc:(d + 1) * rows_per_doc]
            text = "\n".join(" ".join(str(r[k]) for k in ("title", "spec", "review") if r.get(k)) for r in part)
            fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return path


def compile_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """--compile's cost: the compiled ecomkit run's first step minus its steady step (compilation + warm-up)."""
    row: dict[str, Any] = {"part": "compile", "case": "compile time", "run": "long ecomkit compiled",
                           "goal_s": COMPILE_GOAL_S}
    run = next((r for r in rows if r.get("case") == "long ecomkit compiled"), None)
    if run is None or run["status"] != "ok":
        return {**row, "status": "skipped", "reason": "the compiled run did not finish" if run else "not run",
                **({"run_status": run["status"]} if run else {})}
    compile_s = run["first_step_s"] - run["step_time_s"]
    return {**row, "status": "ok", "model": run["model"], "first_step_s": run["first_step_s"],
            "steady_step_s": run["step_time_s"], "compile_s": compile_s,
            "verdict": "PASS" if compile_s <= COMPILE_GOAL_S else "MISS"}


def long_rows_part(st: dict[str, Any], pre: dict[str, Any], precision: str, deadline: float, show) -> list[dict]:
    """The same job on rows of ``long_seq`` tokens: ecomkit and HF Trainer, plain and compiled; ratios, compile."""
    data = long_documents(Path(tempfile.mkdtemp(prefix="gpu-bench-long-")) / "documents.jsonl", st["long_docs"],
                          st["long_doc_rows"])
    rows = jobs("long_rows", LONG_CASES, st, pre, precision, deadline,
                ["--data", str(data), "--task", "lm", "--seq-len", str(st["long_seq"])], show)
    eco, hf = ("long ecomkit", "long ecomkit compiled"), ("long HF Trainer", "long HF Trainer compiled")
    return rows + ratio_rows("long_rows", rows, [(eco, hf, LONG_GOAL)], st["dry_run"]) + [compile_row(rows)]


# ---------------------------------------------------------------------- strategies on all GPUs
def strategy_case(name: str, st: dict[str, Any], pre: dict[str, Any], attn: str, precision: str,
                  timeout_s: float, nproc: int) -> dict[str, Any]:
    """One chapter script under torchrun with ``nproc`` processes (one per GPU); read back its summary and metrics."""
    script, flags, needs = SCRIPTS[name]
    row: dict[str, Any] = {"part": "strategy", "strategy": name, "script": script, "nproc": nproc,
                           "model": st["script_model"], "seq_len": st["script_seq"], "micro_batch": st["script_batch"],
                           "precision": precision}
    absent = [n for n in needs if not pre[n]]
    if absent:
        return {**row, "status": "skipped", "reason": f"{', '.join(absent)} not installed ("
                + "; ".join(INSTALL_HINT[n] for n in absent) + ")"}
    args = [*common_args(st, precision, st["script_steps"], st["script_untimed"]), "--seq-len", str(st["script_seq"]),
            "--attn", attn, "--n-rows", "2000", *flags]
    done = run_script(row, nproc, script, args, timeout_s)
    return planned(measured(done), args, st["plan_gpu"]) if done["status"] == "ok" else done


def strategy_part(st: dict[str, Any], pre: dict[str, Any], names: list[str], attn: str, precision: str,
                  deadline: float, on_gpu: bool, show) -> list[dict[str, Any]]:
    """Each strategy on all GPUs; on a multi-GPU machine DDP also on one GPU first, the baseline of its scaling."""
    cases = [(name, st["nproc"]) for name in names]
    if on_gpu and st["nproc"] > 1 and "ddp" in names:
        cases.insert(0, ("ddp", 1))
    rows = []
    for name, nproc in cases:
        left = deadline - time.monotonic()
        if left < 30:
            rows.append({"part": "strategy", "strategy": name, "nproc": nproc, "status": "skipped",
                         "reason": "time budget spent"})
        else:
            rows.append(strategy_case(name, st, pre, attn, precision, min(st["script_timeout_s"], left), nproc))
        show(rows[-1])
    return rows


def scaling_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The strategy rows in the shape ecomlab.claims reads (``scaling``/``memory``: model, strategy, gpus, ...)."""
    return [{"model": r.get("model"), "strategy": r["strategy"], "gpus": r.get("nproc"), "status": r["status"],
             "samples_per_s": r.get("samples_per_s"), "tokens_per_s": r.get("tokens_per_s"),
             "micro_batch": r.get("micro_batch"), "seq_len": r.get("seq_len"), "precision": r.get("precision"),
             "peak_bytes": r.get("peak_mem_bytes")} for r in rows if r["part"] == "strategy"]


__all__ = ["SCRIPTS", "INSTALL_HINT", "PACKING_CASES", "LONG_CASES", "packing_part", "long_rows_part",
           "strategy_case", "strategy_part", "scaling_rows", "compile_row", "long_documents", "planned",
           "plan_fields", "ratio_rows", "toy_vocab"]
