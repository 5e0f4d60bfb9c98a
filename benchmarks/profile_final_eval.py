"""Where a final evaluation's time goes: CPU seconds of its loss, candidate scoring and generation parts.

A diagnostic, not a published figure (it writes no artifact): run it on two checkouts to compare them. It
writes review-shaped files (``cat,label,review``, ``ecomkit.data.catalog.review_rows``), builds an untrained
one-process run of ``--model`` on them with ``--eval-rows`` held-out rows given as ``--eval-data``, and times one
final evaluation (``TrainingRun.evaluate(final=True)``). CPU seconds (``time.process_time``, one thread) are
reported beside the wall time because they move less when other work shares the machine.

    python benchmarks/profile_final_eval.py [--model tiny] [--train-rows 4000] [--eval-rows 1500]
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import torch

import ecomkit.train.loop as held_out   # the run's evaluation calls live in the loop
import ecomkit.train.nlu_accuracy as scoring   # found by name by the loop when it scores candidates
from ecomkit.config import TrainConfig
from ecomkit.data.catalog import review_rows
from ecomkit.dist import DistEnv
from ecomkit.train.loop import TrainingRun

COLUMNS = {"cat": "category", "label": "sentiment"}
LABELS = {"sentiment": {"0": "negative", "1": "positive"}}


def write_reviews(path: Path, n: int, seed: int) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["cat", "label", "review"])
        writer.writeheader()
        writer.writerows(review_rows(n, seed=seed))
    return path


def timed(cpu: dict[str, float], name: str, fn):
    """``fn`` adding its CPU seconds to ``cpu[name]``."""
    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            cpu[name] = cpu.get(name, 0.0) + time.process_time() - start
    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--train-rows", type=int, default=4000)
    p.add_argument("--eval-rows", type=int, default=1500)
    args = p.parse_args()
    torch.set_num_threads(1)
    cpu: dict[str, float] = {}
    held_out.held_out_loss = timed(cpu, "loss", held_out.held_out_loss)
    scoring.evaluate_nlu_accuracy = timed(cpu, "candidate_scoring", scoring.evaluate_nlu_accuracy)
    with tempfile.TemporaryDirectory() as tmp:
        train = write_reviews(Path(tmp) / "reviews.csv", args.train_rows, seed=3)
        dev = write_reviews(Path(tmp) / "dev.csv", args.eval_rows, seed=7)
        cfg = TrainConfig(model=args.model, task="nlu", data=str(train), eval_data=str(dev), column_map=COLUMNS,
                          label_map=LABELS, max_steps=1, eval_interval=0, output_dir=str(Path(tmp) / "run"),
                          progress=False)
        run = TrainingRun(cfg, DistEnv(rank=0, world_size=1, local_world_size=1,
                                       device=torch.device("cpu"))).build()
        type(run.gen_eval).__call__ = timed(cpu, "generation", type(run.gen_eval).__call__)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = run.evaluate(final=True)
        total = {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}
        run.close()
    print(json.dumps({**{k: round(v, 1) for k, v in {**total, **cpu}.items()},
                      "held_out_examples": result.get("eval_loss_examples"),
                      **{k: result.get(k) for k in ("eval_loss", "acc_category", "acc_sentiment", "gen_acc")}}))


if __name__ == "__main__":
    main()
