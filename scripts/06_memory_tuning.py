#!/usr/bin/env python
"""Chapter 06: memory tuning, and checking the planner (ecomkit.planner.memory / ecomkit.planner.step_time) against measurement.

What is new compared with scripts/02_data_parallel.py: nothing changes in the
training loop; this script measures. Three sub-commands:

  # model-state bytes per rank under DDP, ZeRO-1/2/3 and FSDP2 (tiny BLOOM), next to the planner's
  torchrun --standalone --nproc_per_node 2 scripts/06_memory_tuning.py states --output-dir runs/06
  # calibrate the time model (matmul, fwd/bwd, AdamW, gloo α-β) around a real chapter-02 DDP run, and compare
  torchrun --standalone --nproc_per_node 2 scripts/06_memory_tuning.py calibrate --output-dir runs/06/calibrate
  # activation experiments in one process: checkpointing, save_on_cpu, precision, sweeps, memory pool, bucketing
  python scripts/06_memory_tuning.py activations --output-dir runs/06 [--quick]

The planner itself: python -m ecomkit.plan --help.
`calibrate` accepts every training flag of chapter 02 (--model, --seq-len, --micro-batch-size, --max-steps, ...);
its defaults (small BLOOM, seq 32, micro-batch 4) keep every batch free of padding, so that the prediction
and the measurement describe the same shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ecomkit.parallel.zero.config import ensure_deepspeed_env

ensure_deepspeed_env()  # DS_ACCELERATOR=cpu before anything imports deepspeed (the states command uses ZeRO)

from ecomkit.errors import exit_on_user_error  # noqa: E402


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    print(f"wrote {path}")


def cmd_states(argv: list[str]) -> None:
    from ecomkit.dist import distributed_session
    from ecomkit.measure.memory_tuning import compare_states_with_plan, measure_strategy_states

    p = argparse.ArgumentParser(prog="06_memory_tuning.py states")
    p.add_argument("--output-dir", default="runs/06")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--strategies", default="ddp,zero1,zero2,zero3,fsdp2")
    p.add_argument("--vocab-size", type=int, default=1001,
                   help="odd on purpose: uneven FSDP2 shards and DeepSpeed alignment padding get exercised")
    args = p.parse_args(argv)
    with distributed_session() as env:
        rows = measure_strategy_states(env, args.strategies.split(","), precision=args.precision,
                                       vocab_size=args.vocab_size,
                                       output_dir=str(Path(args.output_dir) / "states_runs"))
        if env.is_main:
            rows = compare_states_with_plan(rows, vocab_size=args.vocab_size)
            write_json(Path(args.output_dir) / f"states_{args.precision}.json", rows)
            for r in rows:
                print(f"{r['strategy']:>6} rank {r['rank']}: measured {r['measured_total']:>9,} B, "
                      f"planned {r['planned_total']:>9,} B, difference {r['difference_bytes']:+,} B")


def calibration_defaults():
    from ecomkit.config import TrainConfig

    return TrainConfig(model="small", seq_len=32, micro_batch_size=4, max_steps=6, eval_interval=0, eval_batches=1,
                       n_rows=300, save_model=False, progress=False, lr=1e-3, output_dir="runs/06/calibrate")


def cmd_calibrate(argv: list[str]) -> None:
    from ecomkit.config import parse_config
    from ecomkit.measure.calibration import CalibrationCallback
    from ecomkit.train import run_training

    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--repeats", type=int, default=3, help="timed runs per microbenchmark")

    cfg, ns = parse_config(argv, description="calibrate the time model", defaults=calibration_defaults(), extra=extra)
    callback = CalibrationCallback(str(Path(cfg.output_dir) / "time_model.json"), repeats=ns.repeats)
    run_training(cfg, [callback])
    if int(os.environ.get("RANK", 0)) == 0:
        r = callback.report
        print(f"predicted DDP step {r['predicted']['total_s']:.3f} s, measured {r['measured_step_s']:.3f} s, "
              f"predicted/measured = {r['ratio_predicted_over_measured']:.2f}")


def cmd_activations(argv: list[str]) -> None:
    import torch

    from ecomkit.measure import memory_tuning as mt

    p = argparse.ArgumentParser(prog="06_memory_tuning.py activations")
    p.add_argument("--output-dir", default="runs/06")
    p.add_argument("--quick", action="store_true", help="shorter sequences (for tests and notebooks)")
    args = p.parse_args(argv)
    cfg = mt.long_context_config()
    seqs = [128, 256, 512] if args.quick else [256, 512, 1024, 2048]
    out = {
        "model": cfg.to_dict(),
        "sweep": mt.activation_sweep(cfg, seqs, batches=[1, 2], modes=list(mt.MODES), attns=["eager", "sdpa"],
                                     track_live=False),
        "checkpointing": mt.checkpointing_experiment(cfg, 2, seqs[-2:]),
        "save_on_cpu_cpu": mt.save_on_cpu_experiment(cfg, 2, seqs[-1], device="cpu"),
        "memory_pool": mt.memory_pool_experiment(cfg, 2, 64),
        "bucketing": bucketing_rows(mt, 1500 if args.quick else 6000),
    }
    if torch.cuda.is_available():
        out["save_on_cpu_gpu"] = mt.save_on_cpu_experiment(cfg, 2, seqs[-1], device="cuda")
        out["gpu_peak"] = mt.gpu_peak_check(cfg, 2, seqs)
    write_json(Path(args.output_dir) / "activations.json", out)


def bucketing_rows(mt, n_rows: int) -> list[dict]:
    """Random vs length-bucketed batches of the synthetic catalog's real token lengths."""
    import datasets

    from ecomkit.data import generate_catalog, tokenize_records
    from ecomkit.models.tokenizer import get_tokenizer
    from ecomkit.train.loop import tokenizer_cache_dir

    datasets.disable_progress_bars()
    tok = get_tokenizer("local", tokenizer_cache_dir())
    lengths = tokenize_records(generate_catalog(n_rows, seed=0), tok, "lm", 256)["length"]
    return mt.bucketing_experiment(lengths, mt.long_context_config(vocab_size=len(tok)), micro_batch=8, n_batches=12)


COMMANDS = {"states": cmd_states, "calibrate": cmd_calibrate, "activations": cmd_activations}


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
