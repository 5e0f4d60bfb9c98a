#!/usr/bin/env python
"""Chapter 08 benchmark: what learning rate a pretrained model needs to fine-tune, and what a large one costs it.

  python benchmarks/bench_transfer.py [--model small] [--lrs 1e-5 3e-5 1e-4 3e-4 1e-3 3e-3] [--seeds 0]

One pretraining run (``--task lm`` on the synthetic catalog's product text, ``ecomlab.measure.transfer``),
then, for every lr and seed, a fine-tuning run of the saved folder on reviews in the README's review-file
shape (category and sentiment, ``--task nlu``) and an evaluation of the fine-tuned folder's LM loss on the
pretraining run's held-out text; and one from-scratch run of the same task at the preset's lr per seed, for
the same steps. Each row: accuracy per target and its majority baseline (candidate scoring, held-out
records), and the LM loss's rise over the pretrained model's. The curve is what a default fine-tuning lr
for such a model is chosen from: the lr that learns the task best at a rise the reader can accept.
All runs are in this one invocation, side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, bench_env, print_table, run_summary, write_artifact

from ecomlab.measure import transfer as T

NPROC = 2


def evaluate_lm(pages: Path, model: Path, out: Path, sizes: T.Sizes) -> dict:
    """``scripts/08_tasks.py --evaluate-only --task lm`` on the pretraining run's held-out split (evaluation.json)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(NPROC),
           str(REPO / "scripts" / "08_tasks.py"), *T.lm_eval_args(pages, model, out, sizes)]
    proc = subprocess.run(cmd, cwd=REPO, env=bench_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads((out / "evaluation.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=T.MODEL, help="the preset to pretrain (default %(default)s)")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--pretrain-steps", type=int, default=T.Sizes.pretrain_steps)
    parser.add_argument("--finetune-steps", type=int, default=T.Sizes.finetune_steps)
    args = parser.parse_args()
    sizes = dataclasses.replace(T.Sizes(), model=args.model, pretrain_steps=args.pretrain_steps,
                                finetune_steps=args.finetune_steps)
    work = Path(tempfile.mkdtemp(prefix="ecomkit-transfer-"))
    reviews = T.write_reviews(work / "reviews.csv", sizes.review_rows)
    pages = T.write_pages(work / "pages.jsonl", sizes.pretrain_rows)
    pre = run_summary("02_data_parallel.py", T.pretrain_args(pages, work / "pretrain", sizes), nproc=NPROC,
                      out_dir=str(work / "pretrain"))
    print(f"pretrained {sizes.model}: {sizes.pretrain_steps} steps, final loss {pre['final_loss']:.3f}", flush=True)
    pretrained_loss = pre["eval_loss"]   # its final evaluation reads the held-out split lm_eval_args reads
    rows = []
    for seed in args.seeds:
        for lr in args.lrs:
            out = work / f"ft-{lr:g}-{seed}"
            summary = run_summary("02_data_parallel.py", T.finetune_args(reviews, work / "pretrain" / "final", lr,
                                  out, sizes, seed=seed), nproc=NPROC, out_dir=str(out))
            a = T.arm(f"fine-tuned {lr:g}", lr, True, summary, evaluate_lm(pages, out / "final", out / "lm", sizes))
            rows += [{**r, "seed": seed} for r in T.arms_table([a], pretrained_loss)]
            print(f"done: lr {lr:g} seed {seed}: mean acc {a.mean_accuracy:.3f}, "
                  f"LM loss rise {T.loss_rise(a, pretrained_loss):+.1%}", flush=True)
        out = work / f"scratch-{seed}"
        summary = run_summary("02_data_parallel.py", T.finetune_args(reviews, sizes.model, T.SCRATCH_LR, out, sizes,
                              save_model=False, seed=seed), nproc=NPROC, out_dir=str(out))
        rows += [{**r, "seed": seed} for r in T.arms_table([T.arm("from scratch", T.SCRATCH_LR, False, summary)],
                                                          pretrained_loss)]
        print(f"done: from scratch seed {seed}", flush=True)
    columns = ["arm", "seed", "lr", "acc_category", "majority_category", "acc_sentiment", "majority_sentiment",
               "mean_acc", "lm_loss", "lm_loss_rise"]
    print_table(rows, columns)
    notes = [f"model `{sizes.model}`, pretrained {sizes.pretrain_steps} steps on {sizes.pretrain_rows} product pages "
             f"(held-out LM loss {pretrained_loss:.3f}); every arm {sizes.finetune_steps} steps of global batch "
             f"{sizes.micro_batch_size * NPROC} on {sizes.review_rows} review rows, {NPROC} processes"]
    write_artifact("bench_transfer", rows, extra={"columns": columns, "notes": notes,
                                                  "sizes": dataclasses.asdict(sizes), "processes": NPROC,
                                                  "pretrained_lm_loss": pretrained_loss,
                                                  "pretrain_final_loss": pre["final_loss"]})


if __name__ == "__main__":
    main()
