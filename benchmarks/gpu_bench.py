#!/usr/bin/env python
"""Single-GPU benchmark: BLOOM attention paths (eager / sdpa / flex) and the chapter scripts, one JSON report.

Part 1 — attention. A SeqGPT-560M-shaped BLOOM (hidden 1024, 24 blocks, 16 heads,
vocabulary 250,880), randomly initialised directly on the GPU in bf16 (parameters
and AdamW states in bf16: a throughput measurement, not a recipe), trained on
random tokens for a few steps with each attention path. Reported per path:
tokens/s, MFU (6Ψ + 12·L·h·T FLOPs per token over the GPU's ecomkit.hardware
dense bf16 peak), step time and peak allocated memory. Goal (issue 9): >= 40 %
MFU for the best path.

Part 2 — the chapter scripts at world size 1 under torchrun (nccl when a
process group is created): DDP (02), ZeRO-3 (03), FSDP2 (04), with the same
model preset, sequence length and batch. A script that does not exist yet, or
fails (a missing package such as deepspeed, say), is recorded with its reason
and the run goes on.

Everything is bounded by --budget-s (default 420 s, inside the 8 minutes the
issue allows): a case that would start after the budget is recorded as
skipped. The report (date, GPU name, versions, every number) goes to
benchmarks/results/gpu_bench_<date>_<gpu>.json unless --out is given.

Without a GPU, or with --dry-run, the same code runs on a tiny model in fp32
for a few steps (flex is then skipped: torch has no FlexAttention backward on
CPU) and the report is written to runs/gpu_bench_dryrun.json unless --out is
given; tests/test_attention_gpu_bench.py runs that dry run.

    python benchmarks/gpu_bench.py                       # on a GPU machine
    python benchmarks/gpu_bench.py --dry-run --scripts ddp --out /tmp/dry.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import failure_reason  # noqa: E402

MFU_GOAL = 0.40
ATTN_IMPLS = ("eager", "sdpa", "flex")
SCRIPTS = {  # name -> (script, strategy flags)
    "ddp": ("02_data_parallel.py", ["--strategy", "ddp"]),
    "zero3": ("03_zero3.py", ["--strategy", "zero", "--zero-stage", "3"]),
    "fsdp2": ("04_mixed_parallel.py", ["--strategy", "fsdp"]),
}


# ---------------------------------------------------------------------- settings
def settings(args: argparse.Namespace, on_gpu: bool) -> dict[str, Any]:
    """Full size on a GPU; a tiny, few-step version for the CPU dry run."""
    if on_gpu:
        return {"shape": "seqgpt-560m", "dtype": "bf16", "batch": args.batch or 4, "seq": args.seq or 2048,
                "warmup": 3, "steps": args.steps or 10, "script_model": "seqgpt-560m", "script_seq": 512,
                "script_batch": 8, "script_steps": 15, "script_timeout_s": 240}
    return {"shape": "tiny", "dtype": "fp32", "batch": args.batch or 2, "seq": args.seq or 64,
            "warmup": 1, "steps": args.steps or 2, "script_model": "tiny", "script_seq": 64,
            "script_batch": 4, "script_steps": 2, "script_timeout_s": 240}


# ---------------------------------------------------------------------- part 1: attention
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
    from ecomkit.models.bloom import count_parameters, flops_per_token
    from ecomkit.models.attention import install_attention
    from ecomkit.models.loss import token_loss_sum

    dtype = torch.bfloat16 if st["dtype"] == "bf16" else torch.float32
    model = build_random_model(st["shape"], device, dtype)
    try:
        install_attention(model, impl)
    except EcomkitError as exc:  # ConfigError included: e.g. flex on CPU
        return {"attn": impl, "status": "skipped", "reason": str(exc)}
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
        return {"attn": impl, "status": "out of memory", "batch": batch, "seq": seq}
    tokens_s = batch * seq / step_s
    peak = device_peak_flops(device, st["dtype"])
    fpt = flops_per_token(n_params, cfg.n_layer, cfg.hidden_size, seq)
    return {
        "attn": impl, "status": "ok", "params": n_params, "batch": batch, "seq": seq, "dtype": st["dtype"],
        "step_s": step_s, "tokens_per_s": tokens_s, "warmup_s": warm_s, "flops_per_token": fpt,
        "achieved_tflops": tokens_s * fpt / 1e12, "mfu": tokens_s * fpt / peak if peak else None,
        "peak_mem_bytes": int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
        "final_loss": losses[-1],
    }


def run_attention_part(st: dict[str, Any], device, impls: list[str], deadline: float) -> list[dict[str, Any]]:
    import torch

    rows = []
    for impl in impls:
        if time.monotonic() > deadline:
            rows.append({"attn": impl, "status": "skipped", "reason": "time budget spent"})
            continue
        try:
            rows.append(attention_case(impl, st, device))
        except Exception as exc:  # one path failing must not lose the others' numbers
            rows.append({"attn": impl, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:600]})
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(_attention_line(rows[-1]), flush=True)
    eager = next((r for r in rows if r["attn"] == "eager" and r["status"] == "ok"), None)
    for r in rows:
        if eager and r["status"] == "ok":
            r["speedup_vs_eager"] = r["tokens_per_s"] / eager["tokens_per_s"]
            if r.get("peak_mem_bytes") and eager.get("peak_mem_bytes"):
                r["memory_vs_eager"] = r["peak_mem_bytes"] / eager["peak_mem_bytes"]
    return rows


def _attention_line(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"  {r['attn']:<6} {r['status']}: {r.get('reason', '')[:160]}"
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (no peak FLOP/s for this device)"
    mem = f" peak {r['peak_mem_bytes'] / 2**30:.1f} GiB" if r["peak_mem_bytes"] else ""
    return f"  {r['attn']:<6} {r['tokens_per_s']:>12,.0f} tokens/s  {r['step_s'] * 1000:8.1f} ms/step  MFU {mfu}{mem}"


# ---------------------------------------------------------------------- part 2: chapter scripts
def script_case(name: str, st: dict[str, Any], attn: str, precision: str, timeout_s: float) -> dict[str, Any]:
    """Run one chapter script with torchrun at world size 1 and read back its summary."""
    script, flags = SCRIPTS[name]
    path = REPO / "scripts" / script
    if not path.exists():
        return {"strategy": name, "status": "not available yet", "reason": f"scripts/{script} does not exist"}
    out = Path(tempfile.mkdtemp(prefix=f"gpu-bench-{name}-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", str(path),
           "--model", st["script_model"], "--seq-len", str(st["script_seq"]), "--micro-batch-size",
           str(st["script_batch"]), "--max-steps", str(st["script_steps"]), "--precision", precision,
           "--attn", attn, "--n-rows", "2000", "--eval-interval", "0", "--eval-batches", "1", "--warmup-steps", "2",
           "--no-save-model", "--no-progress", "--output-dir", str(out), *flags]
    env = {**os.environ, "TMPDIR": str(out), "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"strategy": name, "status": "timeout", "reason": f"still running after {timeout_s:.0f} s"}
    wall = time.perf_counter() - t0
    summary_path = out / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        return {"strategy": name, "status": "error", "returncode": proc.returncode,
                "reason": failure_reason(proc)[:800]}
    summary = json.loads(summary_path.read_text())
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    mfus = [r["mfu"] for r in rows if r.get("type") == "train" and r.get("mfu") is not None][1:]
    return {
        "strategy": name, "status": "ok", "script": script, "loop_strategy": summary.get("strategy"),
        "world_size": summary.get("world_size"), "params": summary.get("params"),
        "samples_per_s": summary.get("samples_per_s"), "tokens_per_s": summary.get("tokens_per_s"),
        "step_time_s": summary.get("step_time_s"), "peak_mem_bytes": summary.get("peak_mem_bytes"),
        "mfu": sum(mfus) / len(mfus) if mfus else None, "final_loss": summary.get("final_loss"),
        "wall_s": wall,
    }


def run_script_part(st: dict[str, Any], names: list[str], attn: str, precision: str,
                    deadline: float) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        left = deadline - time.monotonic()
        if left < 30:
            rows.append({"strategy": name, "status": "skipped", "reason": "time budget spent"})
        else:
            rows.append(script_case(name, st, attn, precision, min(st["script_timeout_s"], left)))
        r = rows[-1]
        detail = (f"{r['samples_per_s']:.2f} samples/s, {r['tokens_per_s']:,.0f} tokens/s"
                  + (f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else "")
                  if r["status"] == "ok" else r.get("reason", "")[:200])
        print(f"  {name:<6} {r['status']}: {detail}", flush=True)
    return rows


# ---------------------------------------------------------------------- report
def environment(device) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "host_cpus": os.cpu_count(),
    }


def default_out(env: dict[str, Any], dry: bool) -> Path:
    if dry:
        return REPO / "runs" / "gpu_bench_dryrun.json"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", env["device"]).strip("-").lower()
    return REPO / "benchmarks" / "results" / f"gpu_bench_{env['date'][:10]}_{slug}.json"


def verdicts(attention: list[dict[str, Any]], on_gpu: bool) -> dict[str, Any]:
    ok = [r for r in attention if r["status"] == "ok" and r.get("mfu") is not None]
    if not on_gpu or not ok:
        return {"mfu_goal": MFU_GOAL, "best_mfu": None, "verdict": "n/a (no GPU: MFU needs a device peak)"}
    best = max(ok, key=lambda r: r["mfu"])
    return {"mfu_goal": MFU_GOAL, "best_attn": best["attn"], "best_mfu": best["mfu"],
            "verdict": "PASS" if best["mfu"] >= MFU_GOAL else "MISS"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="tiny model, few steps (automatic without a GPU)")
    ap.add_argument("--attn", nargs="+", default=list(ATTN_IMPLS), choices=ATTN_IMPLS)
    ap.add_argument("--scripts", nargs="*", default=list(SCRIPTS), choices=list(SCRIPTS),
                    help="chapter scripts to run at world size 1 (none: --scripts with no names)")
    ap.add_argument("--script-attn", default="sdpa", choices=ATTN_IMPLS)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--out", default=None, help="report file, or a folder for the default file name")
    args = ap.parse_args(argv)

    import torch

    on_gpu = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    st = settings(args, on_gpu)
    deadline = time.monotonic() + args.budget_s
    env = environment(device)
    print(f"{'GPU' if on_gpu else 'DRY RUN (CPU)'}: {env['device']}, torch {env['torch']}, "
          f"transformers {env['transformers']} | model {st['shape']} {st['dtype']}, batch {st['batch']} × seq "
          f"{st['seq']}, {st['steps']} timed steps after {st['warmup']} warm-up", flush=True)
    print("attention paths:", flush=True)
    attention = run_attention_part(st, device, args.attn, deadline)
    print(f"chapter scripts (world size 1, --attn {args.script_attn}, model {st['script_model']}):", flush=True)
    scripts = run_script_part(st, args.scripts, args.script_attn, "bf16" if on_gpu else "fp32", deadline)
    report = {"environment": env, "dry_run": not on_gpu, "settings": st, "attention": attention,
              "scripts": scripts, "goal": verdicts(attention, on_gpu)}
    out = default_out(env, not on_gpu)
    if args.out:  # a file, or a folder that gets the default file name (e.g. the device tool's $OUT)
        out = Path(args.out) / out.name if Path(args.out).is_dir() else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    g = report["goal"]
    print(f"MFU goal >= {MFU_GOAL:.0%}: {g['verdict']}"
          + (f" (best: {g['best_attn']} {g['best_mfu']:.1%})" if g.get("best_mfu") is not None else ""))
    print(f"report: {out}")
    failed = [r for r in attention if r["status"] == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
