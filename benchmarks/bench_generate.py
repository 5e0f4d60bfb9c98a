"""Evaluation throughput by generation (examples/s): with and without the KV cache, at 1 and 2 processes.

What is timed is evaluation's own decoding (``ecomkit.train.generate.generate_texts``: batched,
left-padded, greedy) on SeqGPT-format extraction prompts built from synthetic catalog titles
(``ecomkit.data.formats.build_prompt``), every rank decoding an equal share under DDP. The model is
a preset with random weights, so no answer ends early: every example decodes ``--new-tokens``
tokens, and the work per example is the same in every variant.

Throughput = examples decoded by all ranks / wall time of the decoding at the slowest rank
(``dist.timed_phases(slowest=True)``, each run started together after a barrier). Within one launch the
cached and uncached variants alternate run by run; the 1- and 2-process launches alternate too
(``--launches`` of each), after one untimed warm-up run of each variant per launch. The table gives the median over all runs of a variant with its range.

    python benchmarks/bench_generate.py [--model small] [--examples 16] [--new-tokens 16] [--launches 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import REPO, bench_env, print_table, write_artifact

RESULT_PREFIX = "BENCH_GENERATE "
LABELS = ("品牌", "颜色", "尺码")


def worker(args: argparse.Namespace) -> None:
    """One launch: build the model under DDP, time both variants ``--repeats`` times, interleaved."""
    from ecomkit.config import TrainConfig
    from ecomkit.data.catalog import generate_catalog
    from ecomkit.data.formats import build_prompt
    from ecomkit.dist import setup_distributed, teardown
    from ecomlab.timing import timed_phases
    from ecomkit.models.bloom import load_model
    from ecomkit.models.tokenizer import get_tokenizer
    from ecomkit.parallel import build_strategy
    from ecomkit.train.resolve import precision_choice
    from ecomkit.train.gen_eval import shard_range
    from ecomkit.train.generate import DecodeSettings, generate_texts

    env = setup_distributed(seed=0)
    tok = get_tokenizer("local")
    titles = [r["title"] for r in generate_catalog(max(100, args.examples), seed=1)][:args.examples]
    prompts = [build_prompt("seqgpt", "extract", t, LABELS) for t in titles]
    cfg = TrainConfig(model=args.model, strategy="ddp")
    cfg.precision = precision_choice(cfg.precision, env).value   # --precision auto, as a run resolves it
    strategy = build_strategy(cfg, env)
    strategy.setup(load_model(args.model, vocab_size=len(tok), device=env.device, seed=0), 10)
    start, end = shard_range(len(prompts), env.rank, env.world_size)
    per_rank = -(-len(prompts) // env.world_size)
    n_batches = -(-per_rank // args.batch_size)
    never_eos = type("NoEos", (), {"__call__": lambda self, *a, **k: tok(*a, **k), "decode": tok.decode,
                                   "eos_token_id": -1, "pad_token_id": tok.pad_token_id})()

    def run(cache: bool):
        settings = DecodeSettings(max_new_tokens=args.new_tokens, batch_size=args.batch_size, use_cache=cache)
        return lambda: generate_texts(strategy, never_eos, prompts[start:end], env, settings, n_batches)

    cached, uncached = [], []
    run(True)()    # warm-up, untimed: the first forwards allocate memory and pick kernels
    run(False)()
    for _ in range(args.repeats):   # alternate run by run; each run timed at the slowest rank
        c, u = timed_phases([run(True), run(False)], repeats=1, warmup=0, device=env.device, slowest=True)
        cached.append(c)
        uncached.append(u)
    if env.is_main:
        print(RESULT_PREFIX + json.dumps({"world_size": env.world_size, "cached_s": cached,
                                          "uncached_s": uncached}), flush=True)
    strategy.close()
    teardown()


def launch(nproc: int, args: argparse.Namespace) -> dict:
    here = str(Path(__file__).resolve())
    flags = ["--worker", "--model", args.model, "--examples", str(args.examples), "--new-tokens",
             str(args.new_tokens), "--batch-size", str(args.batch_size), "--repeats", str(args.repeats)]
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), here]
           if nproc > 1 else [sys.executable, here]) + flags
    env = {**bench_env(1), "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark launch failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith(RESULT_PREFIX))
    return json.loads(line[len(RESULT_PREFIX):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="small")
    p.add_argument("--examples", type=int, default=16, help="prompts decoded per run (all ranks together)")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8, help="prompts per decoding batch, per rank")
    p.add_argument("--repeats", type=int, default=3, help="runs of each variant per launch")
    p.add_argument("--launches", type=int, default=2, help="launches per process count, alternating 1, 2, 1, 2")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    times: dict[tuple[int, bool], list[float]] = {}
    for _ in range(args.launches):
        for nproc in (1, 2):
            out = launch(nproc, args)
            times.setdefault((nproc, True), []).extend(out["cached_s"])
            times.setdefault((nproc, False), []).extend(out["uncached_s"])
    rows = []
    for (nproc, cache), ts in times.items():
        rates = sorted(args.examples / t for t in ts)
        rows.append({"processes": nproc, "kv_cache": cache, "runs": len(ts),
                     "examples_per_s": statistics.median(rates), "min": rates[0], "max": rates[-1],
                     "tokens_per_s": statistics.median(rates) * args.new_tokens})
    rows.sort(key=lambda r: (r["processes"], not r["kv_cache"]))
    rate = {(r["processes"], r["kv_cache"]): r["examples_per_s"] for r in rows}
    notes = [f"KV cache speed-up at {n} process(es): {rate[(n, True)] / rate[(n, False)]:.2f}× "
             "(median cached / median uncached examples/s)" for n in (1, 2)]
    notes += [f"2 processes / 1 process with the KV cache: {rate[(2, True)] / rate[(1, True)]:.2f}×; "
              f"without: {rate[(2, False)] / rate[(1, False)]:.2f}×",
              f"model `{args.model}` (random weights: every example decodes {args.new_tokens} tokens), "
              f"{args.examples} seqgpt extraction prompts per run, batch {args.batch_size} per rank, DDP, "
              "one thread per process"]
    print_table(rows, ["processes", "kv_cache", "runs", "examples_per_s", "min", "max", "tokens_per_s"])
    for n in notes:
        print(n)
    write_artifact("bench_generate", rows, extra={
        "settings": {k: v for k, v in vars(args).items() if k != "worker"},
        "columns": ["processes", "kv_cache", "runs", "examples_per_s", "min", "max", "tokens_per_s"],
        "headers": ["processes", "KV cache", "runs", "examples/s (median)", "min", "max", "new tokens/s"],
        "notes": notes})


if __name__ == "__main__":
    main()
