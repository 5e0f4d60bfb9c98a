#!/usr/bin/env python
"""The pieces around a CPU step, each timed against what it replaces, side by side in one run.

  python benchmarks/bench_kernels.py [--repeats 7] [--model small]

One process, one thread:
- BLOOM's tanh GeLU, forward + backward on ``small``'s MLP activation ``[8, 128, 2048]``: ATen's
  ``gelu(approximate="tanh")`` against ecomkit's kernel (``--cpu-kernels``, ``ecomkit/fast/cpu_kernels.py``);
- the LM head's cross-entropy, forward + backward on ``[1016, vocab]`` logits (a micro-batch of 8 × 128 with
  its labeled positions): ATen's (cast to fp32, ``cross_entropy``) against ecomkit's kernel;
- BLOOM's QKV split, backward: three ``select`` views (transformers' ``_reshape``) against one ``unbind``
  (``BloomEagerAttention``);
each in fp32 and bf16, the two alternating ``--repeats`` times; the median and the largest difference of
the outputs and gradients are reported. Also: clipping ``small``'s gradients when their norm is below
``max_norm`` (torch's ``clip_grad_norm_`` against ``models/optim.clip_grad_norm``), and bf16 GEMMs at
``small``'s weight-gradient shapes with the transposed operand autograd hands oneDNN, against copying it
contiguous first (a measurement of why ecomkit does not copy it: "after" there is the copy plus the GEMM).
Last, a probe of the whole forward + backward of ``--model`` on one 8 × 128 micro-batch at bf16: the default
recipe (fp32 weights under autocast) against the same model with bf16 weights and no autocast, which is what
removing autocast's casts could save; ecomkit has no such mode (it would need fp32 master weights). And the
chunked LM head + loss at bf16, called on a row count it has not seen (oneDNN builds its GEMMs' primitives)
against one it has. The same fwd+bwd with eager attention's mask and softmax in fp32, as transformers
runs them under autocast, against ecomkit's bf16 path (``fast/attention.py``'s ``eager_attend``). And the same bf16
fwd+bwd under torch.profiler: its GEMMs' share of the step, and their
FLOPs over their time in the step, which bounds the share of the peak a step can reach (in the notes).

Two processes (torchrun, gloo), one thread each: the all-reduce of ``small``'s gradients (its parameter
count, fp32 and bf16) through the process group (gloo over loopback TCP) against shared memory
(``--ddp-allreduce shm``, ``ecomkit/fast/shm_allreduce.py``), alternating, with the results compared
bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from common import REPO, bench_env, print_table, warn_emulated_bf16, write_artifact

from ecomkit.dist import DistEnv
from ecomkit.hardware import matmul_peak
from ecomkit.fast.attention import BloomEagerAttention, attention_modules, install_attention
from ecomkit.models.bloom import build_model, flops_per_token, preset_parameter_count
from ecomkit.fast.cpu_kernels import (cross_entropy_sum, gelu_tanh, install_fused_gelu, kernel_cross_entropy_sum,
                                      load_cpu_kernels)
from ecomkit.models.loss import TokenLoss, chunked_token_loss_sum, lm_loss_sum
from ecomkit.models.optim import adamw_kernel, clip_grad_norm, param_groups
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.fast.shm_allreduce import load_shm_op
from ecomkit.models.precision import length_multiple


def timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def compare(name: str, dtype: torch.dtype, shape: tuple, ref: Callable, new: Callable, repeats: int) -> dict:
    """Median seconds of ``ref`` and ``new`` (each returns its outputs), alternating, and their largest difference."""
    outs = [ref(), new()]
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(*outs))
    times: dict[str, list[float]] = {"ref": [], "new": []}
    for _ in range(repeats):
        times["ref"].append(timed(ref))
        times["new"].append(timed(new))
    r, n = statistics.median(times["ref"]), statistics.median(times["new"])
    return {"piece": name, "dtype": str(dtype).removeprefix("torch."), "shape": "×".join(map(str, shape)),
            "before ms": 1000 * r, "after ms": 1000 * n, "speed-up": r / n, "max abs difference": diff}


def gelu_case(dtype: torch.dtype, use_kernel: bool) -> Callable:
    x = (torch.randn(8, 128, 2048, generator=torch.Generator().manual_seed(0)) * 2).to(dtype).requires_grad_()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)

    def run():
        y = gelu_tanh(x, use_kernel)
        (dx,) = torch.autograd.grad(y, x, g)
        return y.detach(), dx
    return run


def loss_case(dtype: torch.dtype, vocab: int, use_kernel: bool) -> Callable:
    gen = torch.Generator().manual_seed(0)
    z = (torch.randn(1016, vocab, generator=gen) * 3).to(dtype).requires_grad_()
    y = torch.randint(0, vocab, (1016,), generator=gen)

    def run():
        loss = cross_entropy_sum(z, y, use_kernel)
        (dz,) = torch.autograd.grad(loss, z)
        return loss.detach().reshape(1), dz
    return run


def qkv_case(unbind: bool, dtype: torch.dtype) -> Callable:
    """BLOOM's QKV split on small's fused projection [8, 128, 8 heads, 3, 64]: three selects or one unbind."""
    fused = torch.randn(8, 128, 8 * 3 * 64, generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_()
    grads = [torch.randn(8, 8, 128, 64, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(3)]

    def run():
        view = fused.view(8, 128, 8, 3, 64)
        parts = view.unbind(3) if unbind else [view[..., i, :] for i in range(3)]
        qkv = [p.transpose(1, 2) for p in parts]
        (dz,) = torch.autograd.grad(qkv, fused, grads)
        return (dz,)
    return run


def clip_case(numel: int, ecomkit: bool) -> Callable:
    """Clipping a model's worth of gradients whose norm is below max_norm: torch's, or ecomkit's."""
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (numel // 2, numel - numel // 2)]
    for i, p in enumerate(params):   # set once: below max_norm neither version changes them
        p.grad = torch.full_like(p, 1e-6 * (i + 1))

    def run():
        norm = clip_grad_norm(params, 1.0) if ecomkit else torch.nn.utils.clip_grad_norm_(params, 1.0)
        return (norm.reshape(1), *[p.grad for p in params])
    return run


class FP32SoftmaxEagerAttention(BloomEagerAttention):
    """ecomkit's eager attention with transformers' forward under bf16 too: the fp32 mask add and softmax."""

    def _own_forward(self, hidden_states: torch.Tensor) -> bool:
        return False


def step_case(model_name: str, vocab: int, bf16_weights: bool, optimizer: bool = False,
              fp32_softmax: bool = False) -> Callable:
    """Forward + backward of ``model_name`` on one 8 × 128 micro-batch, as the default bf16 recipe runs it.

    The recipe keeps fp32 weights and runs under autocast, which casts every weight and linear input to bf16
    in the forward and every weight gradient back to fp32. ``bf16_weights`` is a probe, not a recipe ecomkit
    offers: the same model with its weights in bf16 and no autocast, i.e. what removing those casts could
    save (a real bf16-weights mode also needs fp32 master weights in the optimizer, one copy per step).
    ``optimizer``: each call also takes the loop's AdamW step (fused where it applies, ``models/optim.py``).
    ``fp32_softmax``: attention as transformers computes it under autocast (``FP32SoftmaxEagerAttention``).
    """
    model = build_model(model_name, vocab_size=vocab, seed=0)
    install_attention(model, "eager")   # the default (--attn auto) on CPU at bf16 and 128 tokens
    for m in attention_modules(model) if fp32_softmax else ():
        m.__class__ = FP32SoftmaxEagerAttention
    install_fused_gelu(model, True, True)
    loss_fn = TokenLoss("chunked", 1024, length_multiple("bf16", torch.device("cpu")), kernel_cross_entropy_sum)
    if bf16_weights:
        model.to(torch.bfloat16)
    ids = torch.randint(0, vocab, (8, 128), generator=torch.Generator().manual_seed(0))
    groups = param_groups(model, 0.01)
    opt = torch.optim.AdamW(groups, lr=1e-4, **adamw_kernel(groups)) if optimizer else None

    def run() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with contextlib.nullcontext() if bf16_weights else torch.autocast("cpu", dtype=torch.bfloat16):
            loss = lm_loss_sum(model, loss_fn, ids, torch.ones_like(ids), ids)
        loss.backward()
        if opt is not None:
            opt.step()
        return [loss.detach() / ids.numel()]   # the mean token loss, compared between the two
    return run


def head_rows_case(vocab: int, new_counts: bool) -> Callable:
    """The chunked LM head + loss at bf16 (``small``'s width) on one row count seen before, or a new one each call.

    Why: the chunked loss gives the head as many rows as the step has labeled positions, topped up to a
    multiple of 16 (``models/loss.py``), so a run meets up to ``B × T / 16`` head row counts, and oneDNN builds
    the forward and both backward GEMMs' primitives on each count's first use. ``new_counts`` times those
    first uses (1008, 992, ... rows); otherwise every call is 1024 rows, built once before.
    """
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(512, vocab, bias=False)
    counts = iter(range(1008, 0, -16))
    multiple = length_multiple("bf16", torch.device("cpu"))

    def run() -> list[torch.Tensor]:
        rows = next(counts) if new_counts else 1024
        h = torch.randn(1, rows, 512, generator=gen).requires_grad_()
        y = torch.randint(0, vocab, (1, rows), generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = chunked_token_loss_sum(h, head, y, 1024, multiple, kernel_cross_entropy_sum)
        loss.backward()
        return [torch.zeros(())]   # different rows each side: nothing to compare
    return run


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ADAMW_STEP = "Optimizer.step#AdamW.step"   # torch's record_function around every optimizer step


def gemm_profile(model_name: str, vocab: int, steps: int) -> dict:
    """``model_name``'s bf16 training step (``step_case``) under torch.profiler: its GEMMs, at what rate, and AdamW.

    Why: a GEMM timed alone keeps its operands in cache; inside a step they come from the ops before it. The
    planner's FLOPs (what bench_precision's share of the peak counts) are these products, so their FLOPs over the
    GEMMs' time plus the optimizer's (memory-bound) update bound the share of the peak a step can reach.
    """
    run = step_case(model_name, vocab, False, optimizer=True)
    for _ in range(3):
        run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(steps):
            run()
    events = prof.key_averages()
    gemm = [e for e in events if e.key in GEMM_OPS]
    cfg = build_model(model_name, vocab_size=vocab).config
    planner = flops_per_token(preset_parameter_count(model_name, vocab_size=vocab), cfg.n_layer, cfg.hidden_size,
                              128) * 8 * 128
    (adamw,) = [e for e in events if e.key == ADAMW_STEP]
    return {"step_ms": sum(e.self_cpu_time_total for e in events) / 1e3 / steps,
            "gemm_ms": sum(e.self_cpu_time_total for e in gemm) / 1e3 / steps,
            "adamw_ms": adamw.cpu_time_total / 1e3 / steps,
            "gemm_gflop": sum(e.flops for e in gemm) / 1e9 / steps, "planner_gflop": planner / 1e9}


def gemm_rows(repeats: int) -> list[dict]:
    """bf16 GEMM rates at small's weight-gradient shapes: the transposed operand as autograd hands it, or copied."""
    rows = []
    for k, n in ((512, 1536), (512, 2048), (2048, 512)):
        x = torch.randn(1024, k).bfloat16()
        g = torch.randn(1024, n).bfloat16()
        flops = 2 * 1024 * k * n
        row = compare("weight-gradient GEMM: transposed → copied first (not adopted)", torch.bfloat16,
                      (n, 1024, k), lambda: (g.t() @ x,), lambda: (g.t().contiguous() @ x,), repeats)
        row["piece"] += f"; GFLOP/s {flops / row['before ms'] / 1e6:.0f} → {flops / row['after ms'] / 1e6:.0f}"
        rows.append(row)
    return rows


def allreduce_worker(numel: int, repeats: int, out: str) -> None:
    """Under torchrun: gloo against shared memory for ``numel`` elements in fp32 and bf16; rank 0 writes JSON."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    load_shm_op(DistEnv(rank=rank, world_size=world, local_world_size=world, backend="gloo"))
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(dtype)
        a, b = base.clone(), base.clone()
        dist.all_reduce(a)
        torch.ops.deepspeed.inference_all_reduce_(b)
        same = bool(torch.equal(a, b))
        times: dict[str, list[float]] = {"gloo": [], "shm": []}
        for _ in range(repeats):
            for kind in ("gloo", "shm"):
                t = base.clone()
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(t) if kind == "gloo" else torch.ops.deepspeed.inference_all_reduce_(t)
                elapsed = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)   # the slower rank's time
                times[kind].append(elapsed.item())
        g, s = statistics.median(times["gloo"]), statistics.median(times["shm"])
        rows.append({"piece": "gradient all-reduce, 2 processes: gloo → shared memory",
                     "dtype": str(dtype).removeprefix("torch."),
                     "shape": f"{numel} ({numel * base.element_size() / 2**20:.0f} MiB)", "before ms": 1000 * g,
                     "after ms": 1000 * s, "speed-up": g / s, "max abs difference": 0.0 if same else float("nan")})
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7, help="alternating timings of each pair (median reported)")
    ap.add_argument("--vocab", type=int, default=0,
                    help="LM-head width of the loss case (0: the size of the chapter scripts' tokenizer)")
    ap.add_argument("--model", default="small", help="preset whose parameter count sizes the all-reduce")
    ap.add_argument("--allreduce-worker", default=None, help=argparse.SUPPRESS)   # internal: the torchrun half
    args = ap.parse_args()
    args.vocab = args.vocab or len(get_tokenizer("synthetic", bench_env()["ECOMKIT_CACHE"]))
    numel = preset_parameter_count(args.model, vocab_size=args.vocab)
    if args.allreduce_worker:
        allreduce_worker(numel, args.repeats, args.allreduce_worker)
        return
    torch.set_num_threads(1)
    status = load_cpu_kernels()
    if not status.vectorized:
        raise SystemExit(f"ecomkit's CPU kernels are not in use on this machine: {status.reason}")
    warn_emulated_bf16(["bf16"], "Its bf16 rows cannot be skipped.")
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        rows.append(compare("tanh GeLU fwd+bwd: ATen → ecomkit kernel", dtype, (8, 128, 2048),
                            gelu_case(dtype, False), gelu_case(dtype, True), args.repeats))
        rows.append(compare("LM-head cross-entropy fwd+bwd: ATen → ecomkit kernel", dtype, (1016, args.vocab),
                            loss_case(dtype, args.vocab, False), loss_case(dtype, args.vocab, True), args.repeats))
        rows.append(compare("BLOOM's QKV split, backward: 3 selects → unbind", dtype, (8, 128, 8, 3, 64),
                            qkv_case(False, dtype), qkv_case(True, dtype), args.repeats))
        print(f"{dtype}: done", flush=True)
    rows.append(compare("gradient clipping, norm below max_norm: torch → ecomkit", torch.float32, (numel,),
                        clip_case(numel, False), clip_case(numel, True), args.repeats))
    rows += gemm_rows(args.repeats)
    rows.append(compare(f"'{args.model}' fwd+bwd at bf16: autocast, fp32 weights → bf16 weights, no autocast "
                        "(probe)", torch.bfloat16, (8, 128), step_case(args.model, args.vocab, False),
                        step_case(args.model, args.vocab, True), args.repeats))
    rows.append(compare(f"'{args.model}' fwd+bwd at bf16, eager attention: mask + softmax in fp32 "
                        "(transformers) → in bf16", torch.bfloat16, (8, 128),
                        step_case(args.model, args.vocab, False, fp32_softmax=True),
                        step_case(args.model, args.vocab, False), args.repeats))
    rows.append(compare("chunked LM head + loss fwd+bwd at bf16: a new row count (first use) → one seen before",
                        torch.bfloat16, (1024, 512, args.vocab), head_rows_case(args.vocab, True),
                        head_rows_case(args.vocab, False), args.repeats) | {"max abs difference": float("nan")})
    prof = gemm_profile(args.model, args.vocab, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "allreduce.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
               "--model", args.model, "--vocab", str(args.vocab), "--repeats", str(args.repeats),
               "--allreduce-worker", out]
        subprocess.run(cmd, cwd=REPO, env=bench_env(1), check=True)
        rows += json.loads(Path(out).read_text())
    columns = list(rows[0])
    print_table(rows, columns)
    peak = matmul_peak("bf16", reps=args.repeats)[0] / 1e9   # the runs' roofline peak (chapter 01)
    bound = prof["planner_gflop"] / (prof["gemm_ms"] + prof["adamw_ms"]) * 1e3 / peak
    notes = [f"one thread per process; medians of {args.repeats} alternating timings of 'before' and 'after'; "
             "speed-up = before / after",
             f"bf16 1024² GEMM on this CPU, the peak the runs' share is measured against: {peak:.0f} GFLOP/s",
             f"'{args.model}' training step at bf16 (8 × 128, the recipe, AdamW included) under torch.profiler, "
             f"{args.repeats} steps: its GEMMs ({', '.join(GEMM_OPS)}) took {prof['gemm_ms']:.0f} of "
             f"{prof['step_ms']:.0f} ms per step ({prof['gemm_ms'] / prof['step_ms']:.0%}) for "
             f"{prof['gemm_gflop']:.1f} GFLOP (the planner counts {prof['planner_gflop']:.1f}), "
             f"{prof['gemm_gflop'] / prof['gemm_ms'] * 1e3:.0f} GFLOP/s = "
             f"{prof['gemm_gflop'] / prof['gemm_ms'] * 1e3 / peak:.0%} of that peak; AdamW's update took "
             f"{prof['adamw_ms']:.0f} ms. So with every other op of the step at no cost, the planner's FLOPs over "
             f"GEMMs + AdamW would reach {bound:.0%} of the peak: the most a step can while these run as here",
             "max abs difference: over outputs and gradients (the loss is a sum over 1016 rows; the "
             "GEMMs' outputs are sums of 1024 products, rounded to bf16); for the whole fwd+bwd, of the mean "
             "token loss; nan for the head's row counts (different rows, nothing to compare)",
             f"all-reduce: {numel:,} elements, the parameter count of '{args.model}'; a max abs difference of 0 "
             "means the shared-memory result equals gloo's bit for bit",
             f"ecomkit's CPU kernels: {status.reason.split(' in ')[0]}"]
    write_artifact("bench_kernels", rows, {"columns": columns, "notes": notes, "args": vars(args)})


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
