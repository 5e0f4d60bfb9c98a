"""``make demo``: a run that learns a task in about half a minute, and says what it learned against a baseline.

A falling loss says nothing about what the model can do, so the demo trains a classification task on the catalog's
titles, written as a user's own file, and prints its accuracy beside the majority baseline and the next command.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from ecomkit.config import TrainConfig
from ecomkit.data.toy_tasks import write_category_task

DEMO_ROWS = 2000                          # titles written (5 % held out, stratified by category)
DEMO_FILE = Path("data") / "titles.jsonl"  # under the output folder
DEMO_FIELDS = {"model": "tiny", "task": "nlu", "precision": "auto", "max_steps": 300, "lr": 5e-3,
               "micro_batch_size": 16, "eval_interval": 0, "gen_eval_samples": 100, "output_dir": "runs/demo"}
NEXT_FIELDS = ("task", "model")   # repeated in the next command; the recipe sets the rest for the user's file
MARGIN_SHOWN = 0.0                        # the demo says "clears" only above this many points


def demo_config() -> TrainConfig:
    """The demo's defaults (flags still override them, as for every script)."""
    return dataclasses.replace(TrainConfig(), **DEMO_FIELDS)


def with_demo_data(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` reading the demo's titles file (written now) when its data is the default ``synthetic``.

    Every rank writes the same file atomically, so no process group is needed yet. Data the user named is kept.
    """
    if cfg.data != "synthetic":
        return cfg
    path = write_category_task(Path(cfg.output_dir) / DEMO_FILE, DEMO_ROWS, cfg.seed)
    out = dataclasses.replace(cfg, data=str(path))
    out.validate()
    return out


def next_command(cfg: TrainConfig) -> str:
    """The demo's training on the user's own file, with the flags where the demo differs from the defaults."""
    base = TrainConfig()
    flags = " ".join(f"--{name.replace('_', '-')} {getattr(cfg, name)}" for name in NEXT_FIELDS
                     if getattr(cfg, name) != getattr(base, name))
    return (f"torchrun --standalone --nproc_per_node 2 scripts/02_data_parallel.py {flags} --data YOUR_FILE.csv "
            f"--column-map '{{\"your_text_column\": \"title\", \"your_label_column\": \"category\"}}' "
            f"--output-dir runs/mine")


def demo_result(summary: dict[str, Any], cfg: TrainConfig) -> str:
    """What the model learned, beside its baseline; who the model is; what to run next (printed on rank 0)."""
    if summary.get("gen_acc") is None:
        return ("\n=== what the model learned ===\nno classification example was decoded (see the evaluation "
                "lines above), so there is no task metric to show\n")
    data, origin = summary.get("data") or {}, summary.get("model_origin") or {}
    labels = (data.get("labels") or {}).get("category") or []
    acc, base = summary["gen_acc"], summary["gen_majority_acc"]
    answered = ", ".join(summary.get("gen_majority_labels") or []) or "?"
    margin = 100 * (acc - base)
    verdict = f"clears it by {margin:+.1f} points" if margin > MARGIN_SHOWN else f"does NOT clear it ({margin:+.1f} points)"
    who = "a random-init preset" if origin.get("kind") == "preset" else origin.get("text", "")
    return "\n".join([
        "", "=== what the model learned ===",
        f"task      the category of a product title, one of {len(labels)} labels; {data.get('train_records', 0):,} "
        f"titles trained, {summary['gen_classify_n']} held out ({cfg.data})",
        f"result    accuracy {acc:.3f} of its generated answers on the held-out titles; baseline {base:.3f}, "
        f"always answering {answered} (the most frequent category of the training titles): the model {verdict}",
        f"model     {summary['model']}: {who}, {summary['params']:,} parameters, trained from scratch here in "
        f"{summary.get('wall_s', 0):.0f} s; it learned these titles, not language",
        "next      the same training on your own file (one row per example, a text column and a label column):",
        f"            {next_command(cfg)}",
        "          a real task needs real weights: add --model DAMO-NLP/SeqGPT-560M (or a local save_pretrained "
        "folder); README, \"Your own task, data and checkpoint\"", ""])


def print_demo_result(summary: dict[str, Any], cfg: TrainConfig) -> None:
    """:func:`demo_result` on rank 0 (every rank returns the summary; one prints it)."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(demo_result(summary, cfg), flush=True)


__all__ = ["DEMO_FIELDS", "DEMO_FILE", "DEMO_ROWS", "demo_config", "demo_result", "next_command", "print_demo_result",
           "with_demo_data"]
