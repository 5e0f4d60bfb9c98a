#!/usr/bin/env python
"""GPU benchmark, one command: the training loop on the real SeqGPT-560M after its warm-up, beside HF Trainer and the planner.

    python benchmarks/gpu_bench.py                      # on a GPU machine: artifact in benchmarks/results/
    python benchmarks/gpu_bench.py --dry-run --out DIR  # the same code paths on CPU (gloo, tiny model)
    benchmarks/gpu_check.sh --wheels DIR                # a bare GPU machine: install from wheels, check, run this

It installs nothing. It first checks what it needs and names what is missing
(a CUDA GPU, ``datasets`` for the chapter scripts, ``deepspeed`` for ZeRO-3,
liger-kernel and cut-cross-entropy for the fused losses); a row whose
requirement is missing is recorded as skipped with that reason, and the rest
still runs. Every training row runs ``untimed`` warm-up steps first (at least
8 on a GPU) and times the next ones (at least 30): the loop, not its warm-up.
Beside each row sits the planner's prediction for the same job on the same
GPU (``plan_bytes``, ``plan_step_s``; ``ecomkit.planner``), and the split that
``ecomkit.planner.gpu_efficiency`` fits the GPU's efficiency on.

In order (the budget skips what would start after it, so the figures the
goals need come first):

1. **All-reduce busbw**: chapter 01's check (``scripts/01_env_check.py``)
   under torchrun on every visible GPU (nccl), 1 MiB to 1 GiB. With one GPU
   there is nothing to reduce across.
2. **Attention paths on one GPU**: SeqGPT-560M's real shape (vocabulary
   250,880) initialised on the GPU, fp32 weights under bf16 autocast and the
   chunked loss as the loop trains, seq 1024 at micro-batch 8 and 16, random
   tokens: eager vs sdpa vs flex: tokens/s, MFU (6Ψ + 12·L·h·T FLOPs per token
   over the dense bf16 peak of ``ecomkit.hardware``), step time, peak memory.
3. **Loss kernels**: the same step with sdpa at micro-batch 8, the LM head +
   cross-entropy as ``--loss-kernel`` chunked, full, liger and cce: time and
   peak memory at vocabulary 250,880. ``ecomkit.models.loss.GPU_LOSS_KERNEL``
   (``--loss-kernel auto`` on this GPU kind) is ``fastest_loss_kernel`` of these rows.
4. **Head-dim padding**: sdpa folds ALiBi into one extra q/k channel and pads
   to a multiple of 8 (64 → 72, 128 → 136; see ``ecomkit.models.attention``):
   causal SDPA forward + backward at each width, same batch, heads and length.
5. **1,024-token rows** (``gpu_jobs.long_rows_part``): a file of long
   documents in windows of 1,024 tokens, through ``scripts/02_data_parallel.py``
   (ecomkit, plain and ``--compile``) and ``scripts/02_hf_trainer.py``
   (``group_by_length``, plain and compiled): real tokens/s, the loop's MFU.
   Goals: the loop's MFU >= 40 %; ecomkit at its best >= 1.2x HF Trainer at its
   best; the compiled run's first step (compilation) <= 60 s.
6. **The catalog job** (``gpu_jobs.packing_part``): the synthetic catalog's
   short rows (~90 tokens) bucketed (``--packing off``), packed into sequences
   of 1,024 tokens (``--packing on``), and through HF Trainer plain and
   compiled. Goals: packed >= 8x bucketed and >= 3x HF Trainer at its best.
7. **Strategies on all visible GPUs**: chapters 02 (DDP), 04 (FSDP2) and 03
   (ZeRO-3) under torchrun, one process per GPU, SeqGPT-560M, bf16, seq 1024;
   the same three with LoRA r=16 (frozen bf16 base); DDP QLoRA (nf4 base
   through bitsandbytes).

Everything is bounded by --budget-s (default 480 s, 8 minutes): a part or row
that would start after it is recorded as skipped, and a script is stopped at
it. ``--dry-run`` (automatic without a GPU) runs the same code on the CPU with
a tiny model in fp32, two gloo processes, few steps; flex, the fused losses and
the compiled runs are skipped there (no FlexAttention backward and no Triton on
a CPU; compiling takes minutes there). A dry run writes its artifact to --out
(default ``runs/gpu_bench_dryrun/``), never to benchmarks/results/;
tests/test_attention_gpu_bench.py runs it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import failure_reason, write_artifact  # noqa: E402
from gpu_jobs import (INSTALL_HINT, SCRIPTS, launch, long_rows_part, packing_part, plan_fields,  # noqa: E402
                      scaling_rows, strategy_part)


MFU_GOAL = 0.40
PARTS = ("all_reduce", "attention", "loss_kernel", "head_dim", "long_rows", "packing", "strategy")
ATTN_IMPLS = ("eager", "sdpa", "flex")
LOSS_KERNELS = ("chunked", "full", "liger", "cce")
HEAD_DIM_PAIRS = ((64, 72), (128, 136))  # (head dim, width sdpa runs it at)
FUSED_PACKAGES = {"liger_kernel": "liger", "cut_cross_entropy": "cce"}


# ---------------------------------------------------------------------- settings and preflight
def settings(args: argparse.Namespace, on_gpu: bool, n_gpus: int, gpu: str | None = None) -> dict[str, Any]:
    """Full size on GPUs; a tiny, few-step version on two gloo processes for the CPU dry run.

    ``plan_gpu``: the GPU the planner's predictions are for: this one (its kind), or in a dry run ``--plan-gpu``
    (an H200 by default: nothing is measured on it, the rows only exercise the planner's code path).
    """
    from ecomkit.hardware import gpu_kind

    plan_gpu = args.plan_gpu or (gpu_kind(gpu) if gpu else "h200")
    if on_gpu:
        return {"dry_run": False, "shape": "seqgpt-560m", "dtype": "bf16", "batches": args.batches or [8, 16],
                "seq": args.seq or 1024, "untimed": max(8, args.untimed or 8), "steps": max(30, args.steps or 30),
                "loss_batch": 8, "nproc": n_gpus, "sizes": "1M:1G", "ar_iters": 20, "pad_batch": 8, "pad_heads": 16,
                "script_model": "seqgpt-560m", "script_seq": args.seq or 1024, "script_batch": 8,
                "script_steps": 38, "script_untimed": 8, "job_steps": 38, "job_untimed": 8, "script_timeout_s": 300,
                "packed_seq": 1024, "catalog_rows": 4000, "long_seq": 1024, "long_docs": 120, "long_doc_rows": 40,
                "plan_gpu": plan_gpu}
    return {"dry_run": True, "shape": "tiny", "dtype": "fp32", "batches": args.batches or [2, 4], "seq": args.seq or 64,
            "untimed": args.untimed or 1, "steps": args.steps or 2, "loss_batch": 2, "nproc": 2, "sizes": "1K:64K",
            "ar_iters": 3, "pad_batch": 2, "pad_heads": 2, "script_model": "tiny", "script_seq": args.seq or 64,
            "script_batch": 4, "script_steps": 2, "script_untimed": 1, "job_steps": 3, "job_untimed": 1,
            "script_timeout_s": 240, "packed_seq": 256, "catalog_rows": 400, "long_seq": 256, "long_docs": 12,
            "long_doc_rows": 12, "plan_gpu": plan_gpu}


def preflight(on_gpu: bool, dry_run: bool) -> dict[str, Any]:
    """What this machine has, and a sentence for each missing thing (nothing is installed here)."""
    import torch

    found = {name: importlib.util.find_spec(name) is not None for name in (*INSTALL_HINT, *FUSED_PACKAGES)}
    missing = [f"{name} is not installed: {', '.join(s for s, (_, _, needs) in SCRIPTS.items() if name in needs)} "
               f"skipped ({INSTALL_HINT[name]})" for name in INSTALL_HINT if not found[name]]
    missing += [f"{name} is not installed: the {kernel} loss-kernel row skipped (pip install 'ecomkit[gpu]')"
                for name, kernel in FUSED_PACKAGES.items() if not found[name] and on_gpu]
    if not on_gpu and not dry_run:
        missing.insert(0, "no CUDA GPU visible (torch.cuda.is_available() is False): running the CPU dry run; "
                          "install the CUDA build of torch on a GPU machine for real numbers")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count(), "gpu": gpu, **found,
            "missing": missing}


# ---------------------------------------------------------------------- part 1: all-reduce
def all_reduce_part(st: dict[str, Any], on_gpu: bool, timeout_s: float) -> dict[str, Any]:
    """Chapter 01's bandwidth sweep on ``nproc`` ranks; the row keeps every size and the best busbw."""
    row: dict[str, Any] = {"part": "all_reduce", "nproc": st["nproc"], "backend": "nccl" if on_gpu else "gloo"}
    if st["nproc"] < 2:
        return {**row, "status": "skipped", "reason": "one GPU visible: an all-reduce needs two or more"}
    tmp = Path(tempfile.mkdtemp(prefix="gpu-bench-allreduce-"))
    try:
        proc = launch(st["nproc"], "01_env_check.py", ["--sizes", st["sizes"], "--iters", str(st["ar_iters"]),
                                                      "--json-out", str(tmp / "env.json")], timeout_s, tmp)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "reason": f"still running after {timeout_s:.0f} s"}
    if proc.returncode != 0 or not (tmp / "env.json").exists():
        return {**row, "status": "error", "reason": failure_reason(proc)[:800]}
    sizes = json.loads((tmp / "env.json").read_text())["bandwidth"]["rows"]
    best = max(sizes, key=lambda r: r["busbw_gbps"])
    return {**row, "status": "ok", "sizes": sizes, "best_busbw_gbps": best["busbw_gbps"],
            "best_at_bytes": best["size_bytes"]}


# ---------------------------------------------------------------------- parts 2 and 3: one training step, in process
def build_random_model(shape: str, device, dtype):
    """Random init directly on ``device`` (a 560M model initialised on the CPU would take most of a minute)."""
    import torch
    from transformers import BloomForCausalLM

    from ecomkit.models.bloom import preset_config

    torch.manual_seed(0)
    with torch.device(device):
        model = BloomForCausalLM(preset_config(shape))
    return model.to(dtype)


def loss_kernel_why_not(kernel: str, device) -> str | None:
    """The reason ``--loss-kernel kernel`` cannot run here, or None."""
    if kernel in ("liger", "cce"):
        module = next(m for m, k in FUSED_PACKAGES.items() if k == kernel)
        if device.type != "cuda":
            return f"{kernel} runs Triton kernels: CUDA only"
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'ecomkit[gpu]')"
    return None


def train_case(part: str, impl: str, kernel: str, batch: int, st: dict[str, Any], device) -> dict[str, Any]:
    """Train ``untimed + steps`` steps as the loop does (fp32 weights, autocast, the loss kernel); time the last."""
    import torch

    from ecomkit.errors import EcomkitError
    from ecomkit.hardware import device_peak_flops
    from ecomkit.fast.attention import install_attention
    from ecomkit.models.bloom import count_parameters, flops_per_token
    from ecomkit.models.loss import TokenLoss, lm_loss_sum
    from ecomkit.planner.memory import PlanInput

    seq = st["seq"]
    row: dict[str, Any] = {"part": part, "attn": impl, "loss_kernel": kernel, "batch": batch, "seq": seq,
                           "dtype": st["dtype"], "nproc": 1, "model": st["shape"]}
    model = build_random_model(st["shape"], device, torch.float32)
    try:
        install_attention(model, impl)
    except EcomkitError as exc:  # ConfigError included: e.g. flex on CPU
        return {**row, "status": "skipped", "reason": str(exc)}
    why_not = loss_kernel_why_not(kernel, device)
    if why_not:
        return {**row, "status": "skipped", "reason": why_not}
    loss_fn = TokenLoss(kernel, 1024)
    cfg, n_params = model.config, count_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), device=device, generator=gen)
    mask = torch.ones_like(ids)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=st["dtype"] == "bf16")

    def step() -> torch.Tensor:
        with autocast:   # the loss the loop calls on the last hidden states (TokenLoss, as --loss-kernel picks)
            loss = lm_loss_sum(model, loss_fn, ids, mask, ids)
        (loss / (batch * (seq - 1))).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()      # read once, after the timed steps: no host sync per step

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        for _ in range(st["untimed"]):
            step()
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        losses = [step() for _ in range(st["steps"])]
        sync()
        step_s = (time.perf_counter() - t0) / st["steps"]
    except torch.OutOfMemoryError:
        return {**row, "status": "out of memory"}
    tokens_s = batch * seq / step_s
    peak = device_peak_flops(device, st["dtype"])
    fpt = flops_per_token(n_params, cfg.n_layer, cfg.hidden_size, seq)  # no padding here: real length = seq
    inp = PlanInput(model=st["shape"], world_size=1, strategy="ddp", precision=st["dtype"], micro_batch=batch,
                    seq_len=seq, attn=impl if impl in ("eager", "sdpa") else "sdpa", gpu=st["plan_gpu"],
                    loss_chunk_tokens=0 if kernel == "full" else 1024,
                    vocab_size=cfg.vocab_size if st["shape"] in ("tiny", "small") else None)
    out = {**row, "status": "ok", "params": n_params, "step_time_s": step_s, "tokens_per_s": tokens_s,
           "flops_per_token": fpt, "achieved_tflops": tokens_s * fpt / 1e12, "mfu": tokens_s * fpt / peak if peak else None,
           "peak_mem_bytes": int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
           "final_loss": float(losses[-1]) / (batch * (seq - 1)), **plan_fields(inp, st["plan_gpu"])}
    out["plan_step_over_measured"] = out["plan_step_s"] / step_s
    if out["peak_mem_bytes"]:
        out["plan_bytes_over_measured"] = out["plan_bytes"] / out["peak_mem_bytes"]
    return out


def in_process_part(part: str, cases: list[tuple[str, str, int]], st: dict[str, Any], device, deadline: float
                    ) -> list[dict[str, Any]]:
    """``train_case`` for each (attention, loss kernel, micro-batch); one failing must not lose the others."""
    import torch

    rows = []
    for impl, kernel, batch in cases:
        base = {"part": part, "attn": impl, "loss_kernel": kernel, "batch": batch}
        if time.monotonic() > deadline:
            rows.append({**base, "status": "skipped", "reason": "time budget spent"})
        else:
            try:
                rows.append(train_case(part, impl, kernel, batch, st, device))
            except Exception as exc:  # noqa: BLE001
                rows.append({**base, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:600]})
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        show(rows[-1])
    return rows


def attention_part(st: dict[str, Any], device, impls: list[str], deadline: float) -> list[dict[str, Any]]:
    """Each attention at each micro-batch, the chunked loss; speed and memory relative to eager at that batch."""
    rows = in_process_part("attention", [(i, "chunked", b) for b in st["batches"] for i in impls], st, device, deadline)
    for r in rows:
        eager = next((e for e in rows if e["attn"] == "eager" and e["batch"] == r["batch"] and e["status"] == "ok"), None)
        if eager and r["status"] == "ok":
            r["speedup_vs_eager"] = r["tokens_per_s"] / eager["tokens_per_s"]
            if r.get("peak_mem_bytes") and eager.get("peak_mem_bytes"):
                r["memory_vs_eager"] = r["peak_mem_bytes"] / eager["peak_mem_bytes"]
    return rows


def loss_kernel_part(st: dict[str, Any], device, kernels: list[str], deadline: float) -> list[dict[str, Any]]:
    """The same step under each --loss-kernel (sdpa); the kernel ``--loss-kernel auto`` would take from them."""
    from ecomkit.hardware import device_kind
    from ecomkit.models.loss import GPU_LOSS_KERNEL
    from ecomlab.derive.loss_kernel import fastest_loss_kernel

    rows = in_process_part("loss_kernel", [("sdpa", k, st["loss_batch"]) for k in kernels], st, device, deadline)
    if any(r["status"] == "ok" and r["loss_kernel"] == "chunked" for r in rows) and device.type == "cuda":
        kind, pick = device_kind(device), fastest_loss_kernel(rows)
        now = GPU_LOSS_KERNEL.get(kind)
        rows.append({"part": "loss_kernel_pick", "status": "ok", "kernel": pick, "gpu_kind": kind,
                     "case": "fastest within the chunked loss's memory (--loss-kernel auto on this GPU kind)",
                     "table": f"ecomkit.models.loss.GPU_LOSS_KERNEL[{kind!r}] = {now!r}: "
                              + ("matches this run" if now == pick else f"differs from this run's {pick!r}; update it "
                                 "when this artifact is committed")})
    return rows


def calibration(rows: list[dict[str, Any]], device, dry_run: bool) -> dict[str, Any] | None:
    """The planner's GPU efficiency fitted on this run's rows, checked on the rows it was not fitted on."""
    from ecomkit.hardware import device_kind
    from ecomkit.planner.gpu_efficiency import GPU_EFFICIENCY
    from ecomlab.derive.gpu_efficiency import MAX_ERROR, calibrate

    cal = calibrate(rows)
    if cal is None:
        return None
    kind = "dry run (CPU): not a GPU's efficiency" if dry_run else device_kind(device)
    now = None if dry_run else GPU_EFFICIENCY.get(kind)
    verdict = (f"kept: the held-out rows within {MAX_ERROR:.0%}" if cal.ok else
               f"not kept: a held-out row is off by more than {MAX_ERROR:.0%}")
    line = (f"planner efficiency for {kind}: {cal.efficiency:.3f}, fitted on {cal.fitted_on} rows, worst error "
            f"{cal.worst_error:.0%} on the {cal.validated_on} others ({verdict})")
    if not dry_run and cal.ok:
        line += ("; GPU_EFFICIENCY matches" if now is not None and abs(now - cal.efficiency) <= 1e-3 * cal.efficiency
                 else f"; ecomkit.planner.gpu_efficiency.GPU_EFFICIENCY[{kind!r}] is {now}: update it when this "
                      "artifact is committed")
    return {"gpu_kind": kind, "efficiency": cal.efficiency, "fitted_on": cal.fitted_on,
            "validated_on": cal.validated_on, "worst_error": cal.worst_error, "ok": cal.ok, "line": line}


# ---------------------------------------------------------------------- part 4: head-dim padding
def head_dim_part(st: dict[str, Any], device) -> list[dict[str, Any]]:
    """Causal SDPA forward + backward at each head dim and at the width sdpa pads it to; ratio = padding's cost."""
    import torch
    import torch.nn.functional as F

    from ecomlab.timing import timed

    dtype = torch.bfloat16 if st["dtype"] == "bf16" else torch.float32
    rows = []
    for head_dim, padded in HEAD_DIM_PAIRS:
        times = {}
        for width in (head_dim, padded):
            q, k, v = (torch.randn(st["pad_batch"], st["pad_heads"], st["seq"], width, device=device, dtype=dtype,
                                   requires_grad=True) for _ in range(3))

            def fwd_bwd() -> None:
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

            times[width] = timed(fwd_bwd, repeats=5 if device.type == "cuda" else 2,
                                 warmup=2 if device.type == "cuda" else 1, device=device)
        rows.append({"part": "head_dim", "status": "ok", "head_dim": head_dim, "padded_to": padded,
                     "batch": st["pad_batch"], "heads": st["pad_heads"], "seq": st["seq"], "dtype": st["dtype"],
                     "ms": times[head_dim] * 1e3, "padded_ms": times[padded] * 1e3,
                     "cost_ratio": times[padded] / times[head_dim]})
        show(rows[-1])
    return rows


# ---------------------------------------------------------------------- report
def _label(r: dict[str, Any]) -> str:
    part = r["part"]
    if part in ("attention", "loss_kernel"):
        return f"{r.get('attn')}/{r.get('loss_kernel')} ×{r.get('batch')}"
    if part == "strategy":
        return f"{r.get('strategy')}×{r.get('nproc')}"
    if part == "head_dim":
        return f"d={r.get('head_dim')}"
    return {"all_reduce": "all-reduce"}.get(part) or str(r.get("case") or r.get("kernel"))


def _planned(r: dict[str, Any]) -> str:
    if r.get("plan_step_s") is None:
        return ""
    mem = f", {r['plan_bytes'] / 2**30:.1f} GiB" if r.get("plan_bytes") else ""
    return f"  [planner ({r['plan_gpu']}): {1000 * r['plan_step_s']:.3g} ms/step{mem}]"


def _line(r: dict[str, Any]) -> str:
    label = _label(r)
    if r["status"] != "ok":
        return f"  {label:<26} {r['status']}: {r.get('reason', '')[:200]}"
    part = r["part"]
    if part == "all_reduce":
        return f"  {label:<26} best busbw {r['best_busbw_gbps']:.2f} GB/s at {r['best_at_bytes']:,} bytes ({r['nproc']} ranks)"
    if part == "head_dim":
        return f"  {label:<26} {r['ms']:.3f} ms, padded to {r['padded_to']}: {r['padded_ms']:.3f} ms ({r['cost_ratio']:.2f}×)"
    if part.endswith("_ratio"):
        return f"  {label}: {r['ratio']:.2f}x (goal >= {r['goal']}x) {r['verdict']}"
    if part == "compile":
        return (f"  compile: first step {r['first_step_s']:.1f} s, steady {r['steady_step_s']:.3f} s: about "
                f"{r['compile_s']:.1f} s compiling (goal <= {r['goal_s']:.0f} s) {r['verdict']}")
    if part == "loss_kernel_pick":
        return f"  fastest within the chunked loss's memory: {r['kernel']} ({r['table']})"
    mfu = f"MFU {r['mfu']:.1%}" if r.get("mfu") is not None else "MFU n/a"
    mem = f", {r['peak_mem_bytes'] / 2**30:.1f} GiB" if r.get("peak_mem_bytes") and part != "strategy" else ""
    fill = f", fill {r['fill_rate']:.0%}" if r.get("fill_rate") is not None else ""
    return (f"  {label:<26} {r['tokens_per_s']:>12,.0f} tokens/s, {1000 * r['step_time_s']:.0f} ms/step, "
            f"{mfu}{fill}{mem}{_planned(r)}")


def show(r: dict[str, Any]) -> None:
    print(_line(r), flush=True)


def verdict(rows: list[dict[str, Any]], on_gpu: bool) -> dict[str, Any]:
    """The MFU goal, read from the loop on 1,024-token rows (else the best measured row)."""
    ok = [r for r in rows if r["part"] in ("attention", "strategy", "long_rows") and r["status"] == "ok"
          and r.get("mfu") is not None]
    if not on_gpu or not ok:
        return {"mfu_goal": MFU_GOAL, "best_mfu": None, "verdict": "n/a (no GPU: MFU needs a device peak)"}
    loop = [r for r in ok if r["part"] == "long_rows" and "ecomkit" in str(r.get("case"))]
    best = max(loop or ok, key=lambda r: r["mfu"])
    return {"mfu_goal": MFU_GOAL, "best": best.get("case") or best.get("attn") or best.get("strategy"),
            "best_mfu": best["mfu"], "verdict": "PASS" if best["mfu"] >= MFU_GOAL else "MISS",
            "from": "the loop on 1,024-token rows" if loop else "the best measured row"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model, two gloo processes (automatic without a GPU)")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                    help="which parts to run (default: all)")
    ap.add_argument("--attn", nargs="+", default=list(ATTN_IMPLS), choices=ATTN_IMPLS, help="attention paths of part 2")
    ap.add_argument("--loss-kernels", nargs="+", default=list(LOSS_KERNELS), choices=LOSS_KERNELS,
                    help="--loss-kernel values of part 3")
    ap.add_argument("--strategies", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS),
                    help="chapter scripts of part 7, one process per GPU")
    ap.add_argument("--script-attn", default="sdpa", choices=ATTN_IMPLS, help="--attn of the strategy scripts")
    ap.add_argument("--batches", type=int, nargs="+", default=None, metavar="N",
                    help="micro-batches of part 2 (default: 8 16 on GPU, 2 4 in the dry run)")
    ap.add_argument("--seq", type=int, default=0, metavar="N", help="sequence length of parts 2-4 and 7 "
                    "(0: 1024 on GPU, 64 in the dry run)")
    ap.add_argument("--untimed", type=int, default=0, metavar="N", help="untimed steps of parts 2-3 (GPU: at least 8)")
    ap.add_argument("--steps", type=int, default=0, metavar="N", help="timed steps of parts 2-3 (GPU: at least 30)")
    ap.add_argument("--plan-gpu", default=None, metavar="NAME", help="the GPU the planner predicts for (default: "
                    "this one; h200 in the dry run)")
    ap.add_argument("--budget-s", type=float, default=480.0, metavar="S",
                    help="parts and rows that would start later are skipped, scripts stopped (default 480: 8 minutes)")
    ap.add_argument("--out", default=None, metavar="DIR", help="artifact folder (default: benchmarks/results/ on GPU, "
                                                "runs/gpu_bench_dryrun/ in the dry run)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    on_gpu = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    pre = preflight(on_gpu, args.dry_run)
    st = settings(args, on_gpu, pre["gpus"], pre["gpu"] if on_gpu else None)
    deadline = time.monotonic() + args.budget_s
    precision = "bf16" if on_gpu else "fp32"
    print(f"{'GPU ' + str(pre['gpu']) if on_gpu else 'DRY RUN (CPU)'}: {pre['gpus']} visible GPU(s) | model "
          f"{st['shape']} {st['dtype']}, micro-batches {st['batches']} × seq {st['seq']}, {st['untimed']} untimed + "
          f"{st['steps']} timed steps; scripts {st['job_untimed']} untimed + {st['job_steps'] - st['job_untimed']} "
          f"timed; planner for {st['plan_gpu']}; budget {args.budget_s:.0f} s", flush=True)
    for line in pre["missing"]:
        print(f"  missing: {line}", flush=True)
    rows: list[dict[str, Any]] = []
    if "all_reduce" in args.parts:
        print("1. all-reduce bandwidth:", flush=True)
        rows.append(all_reduce_part(st, on_gpu, max(30.0, min(300.0, deadline - time.monotonic()))))
        show(rows[-1])
    if "attention" in args.parts:
        print("2. attention paths, one device (chunked loss):", flush=True)
        rows += attention_part(st, device, args.attn, deadline)
    if "loss_kernel" in args.parts:
        print(f"3. loss kernels, one device (sdpa, micro-batch {st['loss_batch']}):", flush=True)
        rows += loss_kernel_part(st, device, args.loss_kernels, deadline)
    if "head_dim" in args.parts:
        print("4. head-dim padding (causal SDPA forward + backward):", flush=True)
        rows += head_dim_part(st, device)
    if "long_rows" in args.parts:
        print(f"5. {st['long_seq']}-token rows on one device: ecomkit and HF Trainer, plain and compiled:", flush=True)
        rows += long_rows_part(st, pre, precision, deadline, show)
        show(rows[-1])
    if "packing" in args.parts:
        print(f"6. the catalog job on one device: bucketed, packed into {st['packed_seq']}-token sequences, HF "
              "Trainer plain and compiled:", flush=True)
        rows += packing_part(st, pre, precision, deadline, show)
    if "strategy" in args.parts:
        print(f"7. strategies, {st['nproc']} processes (--attn {args.script_attn}, model {st['script_model']}):",
              flush=True)
        rows += strategy_part(st, pre, args.strategies, args.script_attn, precision, deadline, on_gpu, show)
    for r in rows:
        if r["part"].endswith("_ratio"):
            show(r)
    goal = verdict(rows, on_gpu)
    cal = calibration(rows, device, not on_gpu)
    if cal:
        print(cal["line"], flush=True)
    out = Path(args.out) if args.out else (REPO / "benchmarks" / "results" if on_gpu else REPO / "runs" / "gpu_bench_dryrun")
    scaling = scaling_rows(rows)
    write_artifact("gpu_bench", rows, {"dry_run": not on_gpu, "settings": st, "preflight": pre, "goal": goal,
                                       "cuda": torch.version.cuda, "scaling": scaling, "memory": scaling,
                                       "budget_s": args.budget_s, "calibration": cal}, results_dir=out)
    print(f"MFU goal >= {MFU_GOAL:.0%}: {goal['verdict']}"
          + (f" (best: {goal['best']} {goal['best_mfu']:.1%}, {goal['from']})" if goal.get("best_mfu") is not None else ""))
    return 1 if any(r["status"] in ("error", "timeout") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
