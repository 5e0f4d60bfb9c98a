#!/usr/bin/env python
"""GPU benchmark, one command: all-reduce bandwidth, 1-GPU attention paths, head-dim padding, strategies on all GPUs.

    python benchmarks/gpu_bench.py                      # on a GPU machine: artifact in benchmarks/results/
    python benchmarks/gpu_bench.py --dry-run --out DIR  # the same code paths on CPU (gloo, tiny model)

It installs nothing. It first checks what it needs and names what is missing
(a CUDA GPU, ``datasets`` for the chapter scripts, ``deepspeed`` for ZeRO-3);
a part whose requirement is missing is recorded as skipped with that reason,
and the rest still runs.

1. **All-reduce busbw**: chapter 01's check (``scripts/01_env_check.py``)
   under torchrun on every visible GPU (nccl), 1 MiB to 1 GiB, busbw as
   nccl-tests defines it. With one GPU there is nothing to reduce across.
2. **Attention paths on one GPU**: a SeqGPT-560M-shaped BLOOM (hidden 1024,
   24 blocks, 16 heads, vocabulary 250,880) initialised on the GPU in bf16,
   batch 8 × seq 1024, random tokens, eager vs sdpa vs flex: tokens/s, MFU
   (6Ψ + 12·L·h·T FLOPs per token over the dense bf16 peak of
   ``ecomkit.hardware``), step time, peak memory. Goal: MFU >= 40 % on an
   H100/H200 for the best path.
3. **Head-dim padding**: sdpa folds ALiBi into one extra q/k channel and pads
   to a multiple of 8 (64 → 72, 128 → 136; see ``ecomkit.models.attention``).
   Timed here: causal SDPA forward + backward at head dim 64 vs 72 and 128 vs
   136, same batch, heads and length, so the ratio is what the padding costs.
4. **Strategies on all visible GPUs**: chapters 02 (DDP), 04 (FSDP2) and 03
   (ZeRO-3) under torchrun with one process per GPU, SeqGPT-560M, bf16,
   seq 1024: samples/s, tokens/s and MFU as the training loop measures them;
   then the same three with LoRA r=16 (``--peft lora``: frozen bf16 base),
   so full fine-tuning and LoRA peak memory and speed sit side by side.
   Then DDP LoRA on a 4-bit (nf4) base through bitsandbytes (QLoRA,
   ``--lora-base-bits 4``, ``ecomkit.models.quant``; ecomkit trains it under
   DDP only), planned by ``python -m ecomkit.plan --peft lora --lora-base-bits 4``.
5. **The catalog job, packed or not**, on one GPU: the synthetic catalog's short
   rows (~90 tokens) bucketed (``--packing off``), packed into sequences of
   1,024 tokens (``--packing on``), and through HF Trainer (``group_by_length``),
   micro-batch 8 each, 8 untimed steps then 30 timed: real tokens/s, fill rate.
   Goals: packed >= 8x bucketed and >= 3x HF Trainer.

Everything is bounded by --budget-s (default 540 s): a part that would start
after the budget is recorded as skipped. ``--dry-run`` (automatic without a
GPU) runs the same code on the CPU with a tiny model in fp32, two gloo
processes, few steps; flex is skipped there (torch has no FlexAttention
backward on CPU). A dry run writes its artifact to --out (default
``runs/gpu_bench_dryrun/``), never to benchmarks/results/;
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

MFU_GOAL = 0.40
PARTS = ("all_reduce", "attention", "head_dim", "strategy", "packing")
ATTN_IMPLS = ("eager", "sdpa", "flex")
HEAD_DIM_PAIRS = ((64, 72), (128, 136))  # (head dim, width sdpa runs it at)
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
INSTALL_HINT = {"datasets": "pip install datasets", "deepspeed": "pip install deepspeed", "peft": "pip install peft",
                "bitsandbytes": "pip install 'bitsandbytes>=0.50.2,<0.51'"}


# ---------------------------------------------------------------------- settings and preflight
def settings(args: argparse.Namespace, on_gpu: bool, n_gpus: int) -> dict[str, Any]:
    """Full size on GPUs; a tiny, few-step version on two gloo processes for the CPU dry run."""
    if on_gpu:
        return {"shape": "seqgpt-560m", "dtype": "bf16", "batch": args.batch or 8, "seq": args.seq or 1024,
                "warmup": 3, "steps": args.steps or 10, "nproc": n_gpus, "sizes": "1M:1G", "ar_iters": 20,
                "pad_batch": 8, "pad_heads": 16, "script_model": "seqgpt-560m", "script_seq": args.seq or 1024,
                "script_batch": 8, "script_steps": 15, "script_timeout_s": 300,
                "packed_seq": 1024, "packing_steps": 38, "packing_untimed": 8}
    return {"shape": "tiny", "dtype": "fp32", "batch": args.batch or 2, "seq": args.seq or 64,
            "warmup": 1, "steps": args.steps or 2, "nproc": 2, "sizes": "1K:64K", "ar_iters": 3,
            "pad_batch": 2, "pad_heads": 2, "script_model": "tiny", "script_seq": args.seq or 64,
            "script_batch": 4, "script_steps": 2, "script_timeout_s": 240,
            "packed_seq": 256, "packing_steps": 3, "packing_untimed": 1}


def preflight(on_gpu: bool, dry_run: bool) -> dict[str, Any]:
    """What this machine has, and a sentence for each missing thing (nothing is installed here)."""
    import torch

    found = {name: importlib.util.find_spec(name) is not None for name in INSTALL_HINT}
    missing = [f"{name} is not installed: {', '.join(s for s, (_, _, needs) in SCRIPTS.items() if name in needs)} "
               f"skipped ({INSTALL_HINT[name]})" for name, ok in found.items() if not ok]
    if not on_gpu and not dry_run:
        missing.insert(0, "no CUDA GPU visible (torch.cuda.is_available() is False): running the CPU dry run; "
                          "install the CUDA build of torch on a GPU machine for real numbers")
    return {"cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count(), **found,
            "missing": missing}


# ---------------------------------------------------------------------- subprocess helpers
def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _torchrun(nproc: int, script: str, args: list[str], timeout_s: float, tmp: Path) -> subprocess.CompletedProcess:
    # --standalone: torchrun binds its own free port and holds it (a port chosen here first could be taken
    # by another process before torchrun binds it)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(REPO / "scripts" / script), *args]
    return subprocess.run(cmd, cwd=REPO, env={**_env(), "TMPDIR": str(tmp)}, capture_output=True, text=True,
                          timeout=timeout_s)


# ---------------------------------------------------------------------- part 1: all-reduce
def all_reduce_part(st: dict[str, Any], on_gpu: bool, timeout_s: float) -> dict[str, Any]:
    """Chapter 01's bandwidth sweep on ``nproc`` ranks; the row keeps every size and the best busbw."""
    row: dict[str, Any] = {"part": "all_reduce", "nproc": st["nproc"], "backend": "nccl" if on_gpu else "gloo"}
    if st["nproc"] < 2:
        return {**row, "status": "skipped", "reason": "one GPU visible: an all-reduce needs two or more"}
    tmp = Path(tempfile.mkdtemp(prefix="gpu-bench-allreduce-"))
    try:
        proc = _torchrun(st["nproc"], "01_env_check.py", ["--sizes", st["sizes"], "--iters", str(st["ar_iters"]),
                                                         "--json-out", str(tmp / "env.json")], timeout_s, tmp)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "reason": f"still running after {timeout_s:.0f} s"}
    if proc.returncode != 0 or not (tmp / "env.json").exists():
        return {**row, "status": "error", "reason": failure_reason(proc)[:800]}
    sizes = json.loads((tmp / "env.json").read_text())["bandwidth"]["rows"]
    best = max(sizes, key=lambda r: r["busbw_gbps"])
    return {**row, "status": "ok", "sizes": sizes, "best_busbw_gbps": best["busbw_gbps"],
            "best_at_bytes": best["size_bytes"]}


# ---------------------------------------------------------------------- part 2: attention paths
def build_random_model(shape: str, device, dtype):
    """Random init directly on ``device`` (a 560M model initialised on the CPU would take most of a minute)."""
    import torch
    from transformers import BloomForCausalLM

    from ecomkit.models.bloom import preset_config

    torch.manual_seed(0)
    with torch.device(device):
        model = BloomForCausalLM(preset_config(shape))
    return model.to(dtype)


def attention_case(impl: str, st: dict[str, Any], device) -> dict[str, Any]:
    """Train ``warmup + steps`` steps with ``impl``; time the last ``steps``."""
    import torch

    from ecomkit.errors import EcomkitError
    from ecomkit.hardware import device_peak_flops
    from ecomkit.models.attention import install_attention
    from ecomkit.models.bloom import count_parameters, flops_per_token
    from ecomkit.models.loss import token_loss_sum

    row: dict[str, Any] = {"part": "attention", "attn": impl}
    dtype = torch.bfloat16 if st["dtype"] == "bf16" else torch.float32
    model = build_random_model(st["shape"], device, dtype)
    try:
        install_attention(model, impl)
    except EcomkitError as exc:  # ConfigError included: e.g. flex on CPU
        return {**row, "status": "skipped", "reason": str(exc)}
    cfg, n_params = model.config, count_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    batch, seq = st["batch"], st["seq"]
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), device=device, generator=gen)
    mask = torch.ones_like(ids)

    def step() -> float:
        loss = token_loss_sum(model(input_ids=ids, attention_mask=mask).logits, ids) / (batch * (seq - 1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        t0 = time.perf_counter()
        for _ in range(st["warmup"]):
            step()
        sync()
        warm_s = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        losses = [step() for _ in range(st["steps"])]
        sync()
        step_s = (time.perf_counter() - t0) / st["steps"]
    except torch.OutOfMemoryError:
        return {**row, "status": "out of memory", "batch": batch, "seq": seq}
    tokens_s = batch * seq / step_s
    peak = device_peak_flops(device, st["dtype"])
    fpt = flops_per_token(n_params, cfg.n_layer, cfg.hidden_size, seq)  # no padding here: real length = seq
    return {
        **row, "status": "ok", "params": n_params, "batch": batch, "seq": seq, "dtype": st["dtype"],
        "step_s": step_s, "tokens_per_s": tokens_s, "warmup_s": warm_s, "flops_per_token": fpt,
        "achieved_tflops": tokens_s * fpt / 1e12, "mfu": tokens_s * fpt / peak if peak else None,
        "peak_mem_bytes": int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
        "final_loss": losses[-1],
    }


def attention_part(st: dict[str, Any], device, impls: list[str], deadline: float) -> list[dict[str, Any]]:
    import torch

    rows = []
    for impl in impls:
        if time.monotonic() > deadline:
            rows.append({"part": "attention", "attn": impl, "status": "skipped", "reason": "time budget spent"})
            continue
        try:
            rows.append(attention_case(impl, st, device))
        except Exception as exc:  # one path failing must not lose the others' numbers
            rows.append({"part": "attention", "attn": impl, "status": "error",
                         "reason": f"{type(exc).__name__}: {exc}"[:600]})
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(_line(rows[-1]), flush=True)
    eager = next((r for r in rows if r["attn"] == "eager" and r["status"] == "ok"), None)
    for r in rows:
        if eager and r["status"] == "ok":
            r["speedup_vs_eager"] = r["tokens_per_s"] / eager["tokens_per_s"]
            if r.get("peak_mem_bytes") and eager.get("peak_mem_bytes"):
                r["memory_vs_eager"] = r["peak_mem_bytes"] / eager["peak_mem_bytes"]
    return rows


# ---------------------------------------------------------------------- part 3: head-dim padding
def head_dim_part(st: dict[str, Any], device) -> list[dict[str, Any]]:
    """Causal SDPA forward + backward at each head dim and at the width sdpa pads it to; ratio = padding's cost."""
    import torch
    import torch.nn.functional as F

    from ecomkit.dist import timed

    dtype = torch.bfloat16 if st["dtype"] == "bf16" else torch.float32
    rows = []
    for head_dim, padded in HEAD_DIM_PAIRS:
        times = {}
        for width in (head_dim, padded):
            q, k, v = (torch.randn(st["pad_batch"], st["pad_heads"], st["seq"], width, device=device, dtype=dtype,
                                   requires_grad=True) for _ in range(3))

            def fwd_bwd() -> None:
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

            times[width] = timed(fwd_bwd, repeats=5 if device.type == "cuda" else 2, warmup=2 if device.type == "cuda" else 1,
                                 device=device)
        rows.append({"part": "head_dim", "status": "ok", "head_dim": head_dim, "padded_to": padded,
                     "batch": st["pad_batch"], "heads": st["pad_heads"], "seq": st["seq"], "dtype": st["dtype"],
                     "ms": times[head_dim] * 1e3, "padded_ms": times[padded] * 1e3,
                     "cost_ratio": times[padded] / times[head_dim]})
        print(_line(rows[-1]), flush=True)
    return rows


# ---------------------------------------------------------------------- part 4: strategies on all GPUs
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
    out = Path(tempfile.mkdtemp(prefix=f"gpu-bench-{name}-"))
    args = ["--model", st["script_model"], "--seq-len", str(st["script_seq"]), "--micro-batch-size",
            str(st["script_batch"]), "--max-steps", str(st["script_steps"]), "--precision", precision, "--attn", attn,
            "--n-rows", "2000", "--eval-interval", "0", "--eval-batches", "1", "--warmup-steps", "2",
            "--no-save-model", "--no-progress", "--output-dir", str(out), *flags]
    t0 = time.perf_counter()
    try:
        proc = _torchrun(nproc, script, args, timeout_s, out)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "reason": f"still running after {timeout_s:.0f} s"}
    summary_path = out / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        return {**row, "status": "error", "returncode": proc.returncode, "reason": failure_reason(proc)[:800]}
    summary = json.loads(summary_path.read_text())
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    mfus = [r["mfu"] for r in rows if r.get("type") == "train" and r.get("mfu") is not None][1:]  # no first step
    return {**row, "status": "ok", "world_size": summary.get("world_size"), "params": summary.get("params"),
            "samples_per_s": summary.get("samples_per_s"), "tokens_per_s": summary.get("tokens_per_s"),
            "step_time_s": summary.get("step_time_s"), "peak_mem_bytes": summary.get("peak_mem_bytes"),
            "mfu": sum(mfus) / len(mfus) if mfus else None, "final_loss": summary.get("final_loss"),
            "trainable_params": summary.get("trainable_params"),
            "wall_s": time.perf_counter() - t0}


def strategy_part(st: dict[str, Any], pre: dict[str, Any], names: list[str], attn: str, precision: str,
                  deadline: float, on_gpu: bool) -> list[dict[str, Any]]:
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
        print(_line(rows[-1]), flush=True)
    return rows


# ---------------------------------------------------------------------- part 5: the catalog job, packed or not
PACKING_CASES = {  # name -> (script, flags): the catalog's short rows, bucketed, packed, and through HF Trainer
    "catalog bucketed": ("02_data_parallel.py", ["--packing", "off"]),
    "catalog packed": ("02_data_parallel.py", ["--packing", "on", "--seq-len", "PACKED_SEQ"]),
    "catalog HF Trainer": ("02_hf_trainer.py", ["--hf-sampling", "group_by_length"]),
}
PACKED_GOALS = {"catalog bucketed": 8.0, "catalog HF Trainer": 3.0}   # packed / each, real tokens/s


def packing_case(name: str, st: dict[str, Any], pre: dict[str, Any], precision: str, timeout_s: float) -> dict[str, Any]:
    """One catalog run on one device: real tokens/s over the steps after ``packing_untimed`` warm-up steps."""
    script, flags = PACKING_CASES[name]
    row: dict[str, Any] = {"part": "packing", "case": name, "script": script, "nproc": 1, "model": st["script_model"],
                           "micro_batch": st["script_batch"], "precision": precision}
    if not pre["datasets"]:
        return {**row, "status": "skipped", "reason": f"datasets not installed ({INSTALL_HINT['datasets']})"}
    out = Path(tempfile.mkdtemp(prefix="gpu-bench-packing-"))
    flags = [str(st["packed_seq"]) if f == "PACKED_SEQ" else f for f in flags]
    args = ["--model", st["script_model"], "--micro-batch-size", str(st["script_batch"]), "--max-steps",
            str(st["packing_steps"]), "--untimed-steps", str(st["packing_untimed"]), "--precision", precision,
            "--n-rows", "4000", "--eval-interval", "0", "--eval-batches", "1", "--warmup-steps", "2",
            "--no-save-model", "--no-progress", "--report-to", "none", "--output-dir", str(out), *flags]
    try:
        proc = _torchrun(1, script, args, timeout_s, out)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "reason": f"still running after {timeout_s:.0f} s"}
    if proc.returncode != 0 or not (out / "summary.json").exists():
        return {**row, "status": "error", "returncode": proc.returncode, "reason": failure_reason(proc)[:800]}
    s = json.loads((out / "summary.json").read_text())
    return {**row, "status": "ok", "tokens_per_s": s.get("tokens_per_s"), "samples_per_s": s.get("samples_per_s"),
            "fill_rate": s.get("fill_rate") or (1 - s["padding_rate"] if s.get("padding_rate") is not None else None),
            "seq_len": (s.get("config") or {}).get("seq_len", st["packed_seq"] if "packed" in name else None),
            "steady_steps": s.get("steady_steps"), "step_time_s": s.get("step_time_s"),
            "peak_mem_bytes": s.get("peak_mem_bytes")}


def packing_part(st: dict[str, Any], pre: dict[str, Any], precision: str, deadline: float) -> list[dict[str, Any]]:
    """The catalog job bucketed, packed into sequences of ``packed_seq``, and through HF Trainer; then the ratios."""
    rows = []
    for name in PACKING_CASES:
        left = deadline - time.monotonic()
        rows.append(packing_case(name, st, pre, precision, min(st["script_timeout_s"], left)) if left >= 30 else
                    {"part": "packing", "case": name, "status": "skipped", "reason": "time budget spent"})
        print(_line(rows[-1]), flush=True)
    rate = {r["case"]: r["tokens_per_s"] for r in rows if r["status"] == "ok"}
    if "catalog packed" in rate:
        for other, goal in PACKED_GOALS.items():
            if other in rate:
                ratio = rate["catalog packed"] / rate[other]
                rows.append({"part": "packing_ratio", "status": "ok", "case": f"packed / {other}", "ratio": ratio,
                             "goal": goal, "verdict": "PASS" if ratio >= goal else "MISS"})
                print(f"  packed / {other}: {ratio:.2f}x (goal >= {goal}x)", flush=True)
    return rows


def scaling_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The strategy rows in the shape ecomkit.claims reads (``scaling``/``memory``: model, strategy, gpus, ...)."""
    return [{"model": r.get("model"), "strategy": r["strategy"], "gpus": r.get("nproc"), "status": r["status"],
             "samples_per_s": r.get("samples_per_s"), "tokens_per_s": r.get("tokens_per_s"),
             "micro_batch": r.get("micro_batch"), "seq_len": r.get("seq_len"), "precision": r.get("precision"),
             "peak_bytes": r.get("peak_mem_bytes")} for r in rows if r["part"] == "strategy"]


# ---------------------------------------------------------------------- report
def _line(r: dict[str, Any]) -> str:
    label = {"attention": r.get("attn"), "strategy": f"{r.get('strategy')}×{r.get('nproc')}", "all_reduce": "all-reduce",
             "head_dim": f"d={r.get('head_dim')}", "packing": r.get("case")}[r["part"]]
    if r["status"] != "ok":
        return f"  {label:<10} {r['status']}: {r.get('reason', '')[:200]}"
    if r["part"] == "all_reduce":
        return f"  {label:<10} best busbw {r['best_busbw_gbps']:.2f} GB/s at {r['best_at_bytes']:,} bytes ({r['nproc']} ranks)"
    if r["part"] == "head_dim":
        return (f"  {label:<10} {r['ms']:.3f} ms, padded to {r['padded_to']}: {r['padded_ms']:.3f} ms "
                f"({r['cost_ratio']:.2f}×)")
    if r["part"] == "packing":
        return (f"  {label:<18} {r['tokens_per_s']:>12,.0f} real tokens/s, fill {r['fill_rate']:.1%}, "
                f"{1000 * r['step_time_s']:.0f} ms/step")
    mfu = f"MFU {r['mfu']:.1%}" if r.get("mfu") is not None else "MFU n/a (no peak FLOP/s for this device)"
    return f"  {label:<10} {r['tokens_per_s']:>12,.0f} tokens/s  {mfu}"


def verdict(rows: list[dict[str, Any]], on_gpu: bool) -> dict[str, Any]:
    ok = [r for r in rows if r["part"] in ("attention", "strategy") and r["status"] == "ok" and r.get("mfu") is not None]
    if not on_gpu or not ok:
        return {"mfu_goal": MFU_GOAL, "best_mfu": None, "verdict": "n/a (no GPU: MFU needs a device peak)"}
    best = max(ok, key=lambda r: r["mfu"])
    return {"mfu_goal": MFU_GOAL, "best": best.get("attn") or best.get("strategy"), "best_mfu": best["mfu"],
            "verdict": "PASS" if best["mfu"] >= MFU_GOAL else "MISS"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model, two gloo processes (automatic without a GPU)")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                    help="which parts to run (default: all)")
    ap.add_argument("--attn", nargs="+", default=list(ATTN_IMPLS), choices=ATTN_IMPLS, help="attention paths of part 2")
    ap.add_argument("--strategies", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS),
                    help="chapter scripts of part 4, one process per GPU")
    ap.add_argument("--script-attn", default="sdpa", choices=ATTN_IMPLS, help="--attn of the chapter scripts")
    ap.add_argument("--batch", type=int, default=0, metavar="N", help="batch of part 2 (0: 8 on GPU, 2 in the dry run)")
    ap.add_argument("--seq", type=int, default=0, metavar="N", help="sequence length (0: 1024 on GPU, 64 in the dry run)")
    ap.add_argument("--steps", type=int, default=0, metavar="N", help="timed steps of part 2 (0: 10 on GPU, 2 in the dry run)")
    ap.add_argument("--budget-s", type=float, default=540.0, metavar="S", help="parts that would start later are skipped")
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
    st = settings(args, on_gpu, pre["gpus"])
    deadline = time.monotonic() + args.budget_s
    print(f"{'GPU' if on_gpu else 'DRY RUN (CPU)'}: {pre['gpus']} visible GPU(s) | model {st['shape']} {st['dtype']}, "
          f"batch {st['batch']} × seq {st['seq']}, {st['nproc']} processes for parts 1 and 4", flush=True)
    for line in pre["missing"]:
        print(f"  missing: {line}", flush=True)
    rows: list[dict[str, Any]] = []
    if "all_reduce" in args.parts:
        print("1. all-reduce bandwidth:", flush=True)
        rows.append(all_reduce_part(st, on_gpu, max(30.0, min(300.0, deadline - time.monotonic()))))
        print(_line(rows[-1]), flush=True)
    if "attention" in args.parts:
        print("2. attention paths, one device:", flush=True)
        rows += attention_part(st, device, args.attn, deadline)
    if "head_dim" in args.parts:
        print("3. head-dim padding (causal SDPA forward + backward):", flush=True)
        rows += head_dim_part(st, device)
    if "strategy" in args.parts:
        print(f"4. strategies, {st['nproc']} processes (--attn {args.script_attn}, model {st['script_model']}):",
              flush=True)
        rows += strategy_part(st, pre, args.strategies, args.script_attn, "bf16" if on_gpu else "fp32", deadline,
                              on_gpu)
    if "packing" in args.parts:
        print(f"5. the catalog job on one device: bucketed, packed into {st['packed_seq']}-token sequences, HF Trainer "
              f"({st['packing_untimed']} untimed + {st['packing_steps'] - st['packing_untimed']} timed steps):",
              flush=True)
        rows += packing_part(st, pre, "bf16" if on_gpu else "fp32", deadline)
    goal = verdict(rows, on_gpu)
    out = Path(args.out) if args.out else (REPO / "benchmarks" / "results" if on_gpu else REPO / "runs" / "gpu_bench_dryrun")
    scaling = scaling_rows(rows)
    write_artifact("gpu_bench", rows, {"dry_run": not on_gpu, "settings": st, "preflight": pre, "goal": goal,
                                       "cuda": torch.version.cuda, "scaling": scaling, "memory": scaling},
                   results_dir=out)
    print(f"MFU goal >= {MFU_GOAL:.0%}: {goal['verdict']}"
          + (f" (best: {goal['best']} {goal['best_mfu']:.1%})" if goal.get("best_mfu") is not None else ""))
    return 1 if any(r["status"] in ("error", "timeout") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
