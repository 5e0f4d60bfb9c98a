#!/usr/bin/env python
"""Full fine-tuning beside LoRA r = 8, 16, 64 on the same job, 2 processes, under DDP, ZeRO-3 and FSDP2.

The job: the `tiny` BLOOM preset. First a base is built the way SeqGPT-560M is used, a model already
tuned for extraction and classification that users adapt to their own labels: full fine-tuning under
DDP on :func:`ecomkit.data.toy_tasks.base_schema_rows` (another schema and other labels than the task,
other examples), saved once, so ZeRO-3 loads it under ``zero.Init`` and FSDP2 on the meta device. Every
variant then fine-tunes that base on the colour task (:func:`ecomkit.data.toy_tasks.write_colour_task`)
with the same data, seed, batch and steps (learning rate: one for full fine-tuning, one for LoRA, LoRA's
usual higher one). Each variant is its own ``torchrun --nproc_per_node 2
scripts/03_lora.py --variants <one>`` launch, because the CPU peak memory is the process's peak RSS
and would otherwise carry over from the previous variant; variants run interleaved by strategy.

Per run (from its summary.json, written by the training loop and its probes):
- peak memory per rank (CPU: peak RSS of the process; GPU: max allocated), and the model-state bytes
  (params + grads + optimizer states) the rank holds at the peak (chapter 03's memory probe);
- step time (median of the steady steps; the collective counter is on in every variant, so every
  step pays the same counting overhead), gradient bytes communicated per step (all-reduce +
  reduce-scatter payload, rank 0) and all collective bytes per step;
- trainable parameters, and the task metric by generation (``ecomkit.train.gen_eval``): span F1 of the
  colour extraction beside the dictionary baseline, sentiment accuracy beside the majority label, each
  also for the base alone (the step-0 evaluation of the same run), and the held-out loss.

    python benchmarks/bench_lora.py [--steps 300] [--model tiny] [--ranks 8 16 64]   # ~10 min on 2 idle cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import failure_reason, write_artifact  # noqa: E402
from ecomkit.data.toy_tasks import write_base_task, write_colour_task  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STRATEGIES = ("ddp", "zero3", "fsdp")


def launch(script: str, args: list[str], out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "scripts" / script), *args, "--output-dir", str(out), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(out.parent)}
    env.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)


def evaluations(run: Path) -> list[dict[str, Any]]:
    """The run's evaluation rows with generation scores, in step order (step 0: the base alone)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if "gen_decoded" in r]


def run_variant(label: str, base: Path, common: list[str], work: Path) -> dict[str, Any]:
    out = work / label.replace(":", "_")
    t0 = time.perf_counter()
    proc = launch("03_lora.py", [*common, "--model", str(base), "--tokenizer", str(base), "--variants", label], out)
    run = out / label
    if proc.returncode != 0 or not (run / "summary.json").exists():
        return {"variant": label, "status": f"failed (exit {proc.returncode}): {failure_reason(proc)[:300]}"}
    s = json.loads((run / "summary.json").read_text())
    states = s["model_states_per_rank"][0]
    first, last = evaluations(run)[0], evaluations(run)[-1]
    probe = s["lora_probe"][0]
    return {"variant": label, "status": "ok", "strategy": label.split(":")[0], "peft": s["peft"],
            "trainable_params": s["trainable_params"], "params": s["params"],
            "peak_mib_per_rank": s["peak_mem_bytes"] / 2**20,
            "model_state_mib_per_rank": (states["params"] + states["grads"] + states["optimizer"]) / 2**20,
            "step_ms": 1000 * s["step_time_median_s"],
            "grad_comm_kib_per_step": (probe["grad_comm_payload_bytes_per_step"] or 0) / 1024,
            "comm_kib_per_step": (probe["comm_payload_bytes_per_step"] or 0) / 1024,
            "base_eval_loss": first.get("eval_loss"), "eval_loss": last.get("eval_loss"),
            "base_span_f1": first["gen_span_f1"], "span_f1": last["gen_span_f1"], "dict_span_f1": last["dict_span_f1"],
            "base_acc": first["gen_acc"], "acc": last["gen_acc"], "majority_acc": last["gen_majority_acc"],
            "frozen_base_unchanged": all(r["frozen_checksum_before"] == r["frozen_checksum_after"]
                                         for r in s["lora_probe"]),
            "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--base-steps", type=int, default=800, help="steps of the base model's full fine-tuning")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3, help="full fine-tuning's learning rate")
    ap.add_argument("--lora-lr", type=float, default=1e-2, help="LoRA's learning rate")
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    shared = ["--task", "nlu", "--seq-len", str(args.seq_len), "--micro-batch-size", "16", "--eval-batches", "2",
              "--eval-nlu-samples", "16", "--gen-max-new-tokens", "12", "--gen-batch-size", "12",
              "--warmup-steps", "20"]
    base_train, base_dev = write_base_task(work / "base_data")
    print(f"base: {args.model}, {args.base_steps} steps of full fine-tuning on the base schema under DDP ...", flush=True)
    proc = launch("02_data_parallel.py", [*shared, "--model", args.model, "--data", str(base_train), "--eval-data",
                                          str(base_dev), "--max-steps", str(args.base_steps), "--eval-interval", "0",
                                          "--gen-eval-samples", "0", "--lr", "6e-3"], work / "base")
    if proc.returncode != 0:
        sys.exit(f"the base run failed: {failure_reason(proc)}")
    base = work / "base" / "final"
    train, dev = write_colour_task(work / "task_data")
    common = [*shared, "--data", str(train), "--eval-data", str(dev), "--max-steps", str(args.steps),
              "--eval-interval", str(args.steps), "--gen-eval-samples", "48"]
    labels = [f"{s}:{what}" for what in ["full", *[f"lora{r}" for r in args.ranks]] for s in STRATEGIES]
    rows = []
    for label in labels:
        lr = args.lr if label.endswith(":full") else args.lora_lr
        rows.append(run_variant(label, base, [*common, "--lr", str(lr)], work))
        r = rows[-1]
        print(f"  {label}: {r['status']}" + (f" ({r['wall_s']:.0f} s)" if r["status"] == "ok" else ""), flush=True)
    columns = ["variant", "trainable_params", "peak_mib_per_rank", "model_state_mib_per_rank", "step_ms",
               "grad_comm_kib_per_step", "comm_kib_per_step", "base_span_f1", "span_f1", "dict_span_f1", "base_acc", "acc",
               "majority_acc", "base_eval_loss", "eval_loss", "frozen_base_unchanged"]
    notes = [f"model {args.model} (base: {args.base_steps} steps of full fine-tuning on another schema, "
             f"toy_tasks.base_schema_rows), then {args.steps} steps on the colour task, seq {args.seq_len}, "
             f"micro-batch 16 × 2 ranks, lr {args.lr} (full) / {args.lora_lr} (LoRA), LoRA alpha = 2r on BLOOM's four Linears; "
             "2 processes × 1 thread, gloo; one launch per variant",
             "peak MiB: CPU peak RSS per rank (includes the Python/torch runtime); model-state MiB: params + grads + "
             "optimizer states a rank holds (chapter 03's probe); comm: payload bytes per step on rank 0",
             "task metric by generation on 48 held-out examples (extraction and sentiment, alternating): span F1 beside the "
             "dictionary baseline, accuracy beside the majority label; base_*: the same run's step-0 evaluation "
             "(the base alone, before any update)"]
    for s in STRATEGIES:
        full = next((r for r in rows if r["variant"] == f"{s}:full" and r["status"] == "ok"), None)
        for r in rows:
            if full and r["status"] == "ok" and r["variant"].startswith(f"{s}:lora"):
                notes.append(f"{r['variant']}: model states {r['model_state_mib_per_rank'] / full['model_state_mib_per_rank']:.2f}× "
                             f"full's, gradient bytes {r['grad_comm_kib_per_step'] / max(full['grad_comm_kib_per_step'], 1e-9):.3f}× "
                             f"full's, step time {r['step_ms'] / full['step_ms']:.2f}×")
    write_artifact("bench_lora", rows, extra={"settings": vars(args), "columns": columns, "notes": notes,
                                              "headers": ["variant", "trainable", "peak MiB/rank", "states MiB/rank",
                                                          "ms/step", "grad KiB/step", "comm KiB/step", "base F1",
                                                          "span F1", "dict F1", "base acc", "acc", "majority acc",
                                                          "base eval loss", "eval loss", "base unchanged"]})


if __name__ == "__main__":
    main()
