"""``python -m ecomkit.plan``: will this training setup fit, and how fast will it run? (chapter 06)

Examples::

    python -m ecomkit.plan --model ecomgpt-7b --gpus 8 --gpu a100-40g --zero 2 --offload-optimizer
    python -m ecomkit.plan --model seqgpt-560m --gpus 4 --gpu rtx4090 --link pcie4-x16 --precision fp32 \\
        --micro-batch 8 --seq-len 128
    python -m ecomkit.plan --model ./models/SeqGPT-560M --strategy fsdp2 --gpus 8 --checkpointing --json

It prints the per-GPU memory table (parameters, gradients, optimizer states,
activations, temporary buffers), the verdict for the chosen GPU, the largest
micro-batch that fits, and the predicted step time and speed-up over one GPU.
Every assumption that is not measured (efficiency, overlap, link bandwidth)
is a flag.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from ecomkit.config import PLAN_STRATEGIES, PRECISIONS, plan_strategy_name
from ecomkit.errors import ConfigError, exit_on_user_error
from ecomkit.hardware import GIB, GPUS, LINKS, NODES
from ecomkit.planner.lora import LoraPlan, max_lora_micro_batch, plan_lora_memory
from ecomkit.planner.memory import ATTNS, PlanInput, max_micro_batch, plan_memory
from ecomkit.planner.step_time import DEFAULT_EFFICIENCY, DEFAULT_OVERLAP, predict_step_time, speedups


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ecomkit.plan", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", default="ecomgpt-7b", help="preset (tiny, small, seqgpt-560m, ecomgpt-7b) or a directory "
                   "with a BLOOM config.json")
    p.add_argument("--vocab-size", type=int, default=None, help="vocabulary of the toy presets (their tokenizer)")
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (world size)")
    p.add_argument("--gpu", default="a100-80g", help=f"one of {', '.join(GPUS)}")
    p.add_argument("--strategy", default=None,
                   help=f"one of {', '.join(PLAN_STRATEGIES)} (default ddp, or zeroN with --zero)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None, help="DeepSpeed ZeRO stage (0 = DDP)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16")
    p.add_argument("--micro-batch", type=int, default=1, help="samples per GPU per forward/backward")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--checkpointing", "--activation-checkpointing", action="store_true", dest="checkpointing")
    p.add_argument("--attn", choices=ATTNS, default="eager")
    p.add_argument("--loss-chunk-tokens", type=int, default=0,
                   help="ecomkit's chunked LM-head loss, positions per chunk (ddp/fsdp2; 0 = full logits)")
    p.add_argument("--offload-optimizer", action="store_true", help="ZeRO: optimizer states on the CPU")
    p.add_argument("--offload-param", action="store_true", help="ZeRO-3/FSDP2: parameters on the CPU too")
    p.add_argument("--link", default="nvlink-a100", help=f"interconnect: {', '.join(LINKS)}")
    p.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY, help="fraction of peak FLOP/s reached")
    p.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP, help="fraction of backward that hides comm")
    p.add_argument("--node", default=None, help=f"server layout for CPU offload: {', '.join(NODES)} "
                   "(default: the usual system of --gpu)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--peft", choices=("none", "lora"), default="none",
                   help="lora: frozen base + low-rank adapters (no gradients or optimizer states for the base)")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (with --peft lora)")
    p.add_argument("--lora-base-bits", type=int, choices=(16, 8, 4), default=16,
                   help="frozen base storage with --peft lora: 16 (the precision's dtype), 8 or 4 (QLoRA, bitsandbytes)")
    return p


def plan_input_from_args(args: argparse.Namespace) -> PlanInput:
    strategy = args.strategy
    if args.zero is not None:
        zero_name = plan_strategy_name("zero", args.zero)
        if strategy is not None and strategy != zero_name:
            raise ConfigError(f"--strategy {strategy} and --zero {args.zero} disagree; give one of them.")
        strategy = zero_name
    return PlanInput(model=args.model, vocab_size=args.vocab_size, world_size=args.gpus, strategy=strategy or "ddp",
                     tp=args.tp, pp=args.pp, precision=args.precision, micro_batch=args.micro_batch,
                     seq_len=args.seq_len, grad_accum=args.grad_accum, activation_checkpointing=args.checkpointing,
                     attn=args.attn, offload_optimizer=args.offload_optimizer, offload_param=args.offload_param,
                     gpu=args.gpu, loss_chunk_tokens=args.loss_chunk_tokens)


def run_plan(args: argparse.Namespace) -> dict[str, Any]:
    inp = plan_input_from_args(args)
    if args.peft == "lora":
        lora = LoraPlan(r=args.lora_r, base_bits=args.lora_base_bits)
        plan = plan_lora_memory(inp, lora)
        plan.notes.append("step time below: the time model is full fine-tuning's (LoRA skips the frozen weights' "
                          "gradient matmuls and most gradient communication), so it is an upper bound")
        most = max_lora_micro_batch(plan.inputs, lora)
    else:
        plan = plan_memory(inp)
        most = max_micro_batch(plan.inputs)
    time_kw = {"link": args.link, "efficiency": args.efficiency, "overlap": args.overlap, "node": args.node}
    step = predict_step_time(plan.inputs, **time_kw)
    scale = speedups(plan.inputs, [plan.inputs.world_size], **time_kw)[0] if plan.inputs.world_size > 1 else None
    return {"plan": plan, "max_micro_batch": most, "step": step, "speedup": scale}


def render(result: dict[str, Any]) -> str:
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
    return "\n".join(lines)


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    plan, step = result["plan"], result["step"]
    inputs = asdict(plan.inputs)
    inputs["model"] = plan.shape.name
    return {"inputs": inputs, "psi": plan.shape.n_params, "breakdown_bytes": plan.breakdown(),
            "total_bytes": plan.total, "cpu_bytes": plan.cpu_bytes, "gpu": plan.gpu.name,
            "gpu_bytes": plan.gpu.memory_bytes, "fits": plan.fits, "max_micro_batch": result["max_micro_batch"],
            "step_time": {**asdict(step), "total_s": step.total_s}, "speedup": result["speedup"],
            "total_gib": plan.total / GIB}


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    result = run_plan(args)
    print(json.dumps(to_json(result), indent=2) if args.json else render(result))


if __name__ == "__main__":
    main()
