"""Each extraction shape, and a classification set, trains under DDP with 2 processes in the seqgpt format.

One 2-process torchrun launch trains four runs in turn (``ecomkit.train.sweep.run_sweep``): the same
product titles (brand and first spec value marked, :func:`ecomkit.data.catalog.catalog_spans`) written as
span lists with the user's own key names, as CLUENER-style spans nested by English type names renamed to
Chinese by a label map, and as character tokens with integer BIO tag ids and the tag names given once; and
a review file (category + 0/1 label). This file is also the worker:
``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/test_extraction_train.py DATA OUT``.

Each run evaluates at step 0 and at the end; the held-out loss (on answer tokens only) must fall below
:data:`LOSS_RATIO` of its step-0 value, no row may be dropped, and the saved model must record the format.
The three extraction shapes hold the same spans, so they must give the same examples and the same losses.
Measured: eval loss 8.31 -> 2.48 (ratio 0.30) for each extraction shape, 8.40 -> 1.18 for the reviews,
40 steps, ~8 s per run; the launch takes ~75 s in all on 2 busy cores.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import fastlaunch
import pytest

from ecomkit.config import TrainConfig
from ecomkit.data import write_jsonl
from ecomkit.data.catalog import catalog_spans, generate_catalog, review_rows
from ecomkit.data.task_file import read_task_file
from ecomkit.train.sweep import run_sweep

ROWS = 400
LOSS_RATIO = 0.6
ENGLISH = {"品牌": "brand", "颜色": "colour", "容量": "capacity", "功率": "power", "净含量": "net_content",
           "装帧": "binding", "尺码": "size", "适用年龄": "age", "尺寸": "dimensions"}
BASE = {"task": "nlu", "seq_len": 96, "micro_batch_size": 16, "lr": 5e-3, "max_steps": 40, "eval_interval": 40,
        "eval_batches": 4, "eval_nlu_samples": 32, "save_model": False, "progress": False}
RUNS = {
    "span_list": {"data": "span_list.jsonl", "column_map": {"entities": "spans"}},
    "nested": {"data": "nested.jsonl", "label_map": {"spans": {v: k for k, v in ENGLISH.items()}},
               "save_model": True},
    "tags": {"data": "tags.jsonl", "label_map": {"ner_tags": None}},     # the tag names, filled in by write_data
    "classify": {"data": "reviews.jsonl", "column_map": {"cat": "category", "label": "sentiment"},
                 "label_map": {"sentiment": {"0": "negative", "1": "positive"}}},
}


def tag_names() -> list[str]:
    return ["O"] + [f"{p}-{label}" for label in ENGLISH for p in ("B", "I")]


def write_data(folder: Path) -> None:
    """The same titles in the three extraction shapes, and a review file."""
    span_list, nested, tags = [], [], []
    names = tag_names()
    for record in generate_catalog(ROWS, seed=7):
        title, spans = record["title"], catalog_spans(record)
        span_list.append({"text": title, "entities": [{"label": t, "entity": title[s:e], "start": s, "end": e}
                                                      for t, s, e in spans]})
        by_label: dict = {}
        for t, s, e in spans:
            by_label.setdefault(ENGLISH[t], {}).setdefault(title[s:e], []).append([s, e - 1])
        nested.append({"text": title, "label": by_label})
        ids = [0] * len(title)
        for t, s, e in spans:
            ids[s:e] = [names.index(f"B-{t}")] + [names.index(f"I-{t}")] * (e - s - 1)
        tags.append({"tokens": list(title), "ner_tags": ids})
    for name, rows in (("span_list", span_list), ("nested", nested), ("tags", tags),
                       ("reviews", review_rows(ROWS, seed=3))):
        write_jsonl(rows, folder / f"{name}.jsonl")


class Run:
    """A sweep variant: the base config with one data set and its maps."""

    def __init__(self, label: str, data_dir: Path):
        self.label, self.changes = label, {**BASE, **RUNS[label]}
        self.changes["data"] = str(data_dir / self.changes["data"])
        if label == "tags":
            self.changes["label_map"] = {"ner_tags": tag_names()}

    def apply(self, base: TrainConfig) -> TrainConfig:
        cfg = copy.deepcopy(base)
        for key, value in self.changes.items():
            setattr(cfg, key, value)
        return cfg


def worker(data_dir: str, out_dir: str) -> None:
    run_sweep(TrainConfig(output_dir=out_dir, precision="fp32"), [Run(label, Path(data_dir)) for label in RUNS])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("extraction")
    data, out = root / "data", root / "runs"
    data.mkdir()
    write_data(data)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(root)}
    proc = fastlaunch.run(__file__, [str(data), str(out)], 2, env=env, cwd=Path(__file__).resolve().parents[1],
                          timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return out


def summary_of(runs: Path, label: str) -> dict:
    return json.loads((runs / label / "summary.json").read_text())


def eval_losses(runs: Path, label: str) -> list[float]:
    rows = [json.loads(line) for line in (runs / label / "metrics.jsonl").read_text().splitlines()]
    return [r["eval_loss"] for r in rows if "eval_loss" in r]


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("label", list(RUNS))
def test_each_shape_trains_with_two_processes_in_the_seqgpt_format(runs, label):
    summary = summary_of(runs, label)
    assert summary["world_size"] == 2 and summary["config"]["prompt_format"] == "seqgpt"
    data = summary["data"]
    assert data["rows_read"] == data["rows_valid"] == data["records_used"] == ROWS and data["skipped"] == {}
    kinds = {"classify": {"category": ROWS, "sentiment": ROWS}}.get(label, {"extract": ROWS})
    assert data["examples_per_kind"] == kinds and data["prompt_format"] == "seqgpt"
    losses = eval_losses(runs, label)
    assert len(losses) == 2 and losses[-1] < LOSS_RATIO * losses[0], losses


@pytest.mark.dist
@pytest.mark.slow
def test_the_three_shapes_give_the_same_labels_and_the_saved_model_records_its_format(runs):
    labels = {label: summary_of(runs, label)["data"]["labels"]["extract"] for label in ("span_list", "nested", "tags")}
    assert labels["span_list"] == labels["nested"] == labels["tags"] and "品牌" in labels["span_list"]
    # the same spans in three shapes are the same examples, so the three runs are the same run
    losses = [eval_losses(runs, label) for label in ("span_list", "nested", "tags")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-6) and losses[2] == pytest.approx(losses[0], rel=1e-6)
    info = read_task_file(runs / "nested" / "final")
    assert info["prompt_format"] == "seqgpt" and info["labels"]["extract"] == labels["nested"]
    assert info["kinds"] == ["extract"] and (runs / "nested" / "final" / "config.json").is_file()


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
