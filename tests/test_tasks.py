"""Evaluation by generation end to end: a 2-process DDP run learns extraction (colour spans, span-list
shape) and classification (sentiment) in SeqGPT's prompt, from ``ecomkit.data.toy_tasks``, and beats both
baselines (the dictionary baseline is wrong there by construction, see that module; on the synthetic
catalog it is near perfect, since every held-out span was seen in training); the same saved weights
evaluated under ZeRO-3 and FSDP2 on 2 processes give the figures of a 1-process evaluation; predictions.jsonl recomputes the
summary; plain transformers ``generate()`` and ``ecomkit.predict`` give exactly the answers scored.

One training launch serves every assertion (module-scoped fixture); its saved weights are evaluated
under ZeRO-3 and FSDP2 in one more 2-process launch (this file's worker) and in this process alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fastlaunch
import pytest
import torch

from conftest import REPO, run_script
from ecomkit.data.formats import parse_answer
from ecomkit.data.toy_tasks import write_colour_task
from ecomkit.train.gen_eval import read_predictions, scores_from_predictions, scores_from_rows

pytestmark = [pytest.mark.dist, pytest.mark.slow]

# fp32: the figures and answers of one set of weights are compared exactly across strategies, with plain generate()
# and with ecomkit.predict; at precision auto (bf16 here) ZeRO-3's bf16 weights, FSDP2's mixed precision and one
# process's autocast round differently, and one answer in 48 once changed (55 item 8; docs/testing.md).
TRAIN = ["--precision", "fp32", "--task", "nlu", "--model", "tiny", "--seq-len", "64", "--max-steps", "400",
         "--micro-batch-size", "16", "--lr", "6e-3", "--warmup-steps", "20", "--eval-interval", "100", "--eval-batches", "2",
         "--eval-nlu-samples", "16", "--gen-eval-samples", "48", "--gen-max-new-tokens", "12", "--gen-batch-size",
         "12", "--final-eval-samples", "48", "--no-progress"]   # the final evaluation capped: the suite's time
GEN_KEYS = ("gen_span_f1", "gen_span_precision", "gen_span_recall", "gen_strict_acc", "gen_span_f1_per_label",
            "dict_span_f1", "gen_acc", "gen_macro_f1", "gen_majority_acc", "gen_decoded")
MARGIN_POINTS = 5.0   # the run must clear each baseline by at least this much


def evaluation_args(out: Path) -> list[str]:
    """The training run's data and sizes, with its saved model: what every evaluation of it is given."""
    train, dev = out / "data" / "train.jsonl", out / "data" / "dev.jsonl"
    return ["--data", str(train), "--eval-data", str(dev), *TRAIN, "--model", str(out / "train" / "final")]


def worker(out: Path) -> None:
    """Under torchrun (2 ranks): evaluate the saved weights under ZeRO-3, then FSDP2, in one process group."""
    from ecomkit.config import parse_config
    from ecomkit.dist import setup_distributed, teardown
    from ecomkit.train.eval_run import evaluate_in_session

    env = setup_distributed(seed=0)
    for name, extra in (("zero3", ["--strategy", "zero", "--zero-stage", "3"]), ("fsdp", ["--strategy", "fsdp"])):
        cfg, _ = parse_config([*evaluation_args(out), *extra, "--output-dir", str(out / name)])
        evaluate_in_session(cfg, env)
    teardown()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from ecomkit.config import parse_config
    from ecomkit.train.eval_run import run_evaluation

    out = tmp_path_factory.mktemp("tasks")
    train, dev = write_colour_task(out / "data")
    run_script("08_tasks.py", ["--data", str(train), "--eval-data", str(dev), *TRAIN, "--output-dir",
                               str(out / "train")], nproc=2, timeout=600)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = fastlaunch.run(__file__, [str(out)], 2, env=env, cwd=out, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    cfg, _ = parse_config([*evaluation_args(out), "--output-dir", str(out / "single")])
    run_evaluation(cfg)   # one process, here
    evals = {name: json.loads((out / name / "evaluation.json").read_text()) for name in ("single", "zero3", "fsdp")}
    summary = json.loads((out / "train" / "summary.json").read_text())
    return out, summary, evals


def test_ddp_run_learns_extraction_and_classification_beyond_the_baselines(trained):
    out, s, _ = trained
    assert s["world_size"] == 2 and s["config"]["prompt_format"] == "seqgpt"
    assert s["gen_extract_n"] > 0 and s["gen_classify_n"] > 0
    assert s["gen_span_f1"] > s["dict_span_f1"] + MARGIN_POINTS / 100, (s["gen_span_f1"], s["dict_span_f1"])
    assert s["gen_span_f1_margin_points"] == pytest.approx(100 * (s["gen_span_f1"] - s["dict_span_f1"]))
    assert s["gen_acc"] > s["gen_majority_acc"] + MARGIN_POINTS / 100, (s["gen_acc"], s["gen_majority_acc"])
    rows = [json.loads(l) for l in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "gen_decoded" in r]
    assert [r["step"] for r in evals] == [0, 100, 200, 300, 400]
    assert evals[-1]["gen_span_f1"] > evals[0]["gen_span_f1"]   # it learned: untrained, it finds nothing


def test_predictions_file_recomputes_every_figure_of_the_summary(trained):
    out, s, _ = trained
    rows = read_predictions(out / "train" / "predictions.jsonl")
    assert len(rows) == s["gen_decoded"] == 48 and s["gen_prompts_cut"] == 0
    for row in rows:   # re-read every answer from its generated text, not from the recorded parse
        parsed = parse_answer(s["config"]["prompt_format"], row["kind"], row["generated"], row["labels"])
        row["predicted"] = parsed.label if row["kind"] == "classify" else sorted(map(list, parsed.spans))
    again = scores_from_rows(rows)
    for key in GEN_KEYS[:-1]:
        assert again[key] == pytest.approx(s[key]), key
    assert scores_from_predictions(out / "train" / "predictions.jsonl")["gen_span_f1"] == pytest.approx(s["gen_span_f1"])


def test_zero3_and_fsdp2_evaluations_equal_one_process_on_the_same_weights(trained):
    out, _, evals = trained
    ref = evals["single"]
    assert ref["world_size"] == 1 and evals["zero3"]["world_size"] == evals["fsdp"]["world_size"] == 2
    for name in ("zero3", "fsdp"):
        for key in GEN_KEYS:
            assert evals[name][key] == pytest.approx(ref[key]), (name, key)
        assert read_predictions(out / name / "predictions.jsonl") == read_predictions(out / "single" / "predictions.jsonl")


def test_plain_transformers_generate_gives_exactly_the_answers_the_evaluator_scored(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, s, _ = trained
    final = out / "train" / "final"
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tok = AutoTokenizer.from_pretrained(final)
    rows = read_predictions(out / "train" / "predictions.jsonl")
    for row in rows:   # the way SeqGPT's README runs it: one prompt, greedy, new tokens decoded
        ids = tok(row["prompt"], return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        assert tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True) == row["generated"], row


def test_predict_cli_answers_the_evaluated_examples_as_the_evaluator_parsed_them(trained, tmp_path):
    out, _, _ = trained
    rows = read_predictions(out / "train" / "predictions.jsonl")[:12]
    src = tmp_path / "in.jsonl"
    texts = [r["prompt"].split("\n")[0][len("输入: "):] for r in rows]
    src.write_text("".join(json.dumps({"text": t, "task": r["kind"], "labels": r["labels"]}, ensure_ascii=False)
                           + "\n" for t, r in zip(texts, rows)), encoding="utf-8")
    dst = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "ecomkit.predict", "--model", str(out / "train" / "final"),
                           "--input", str(src), "--output", str(dst), "--max-new-tokens", "12"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row, ans in zip(rows, (json.loads(l) for l in dst.read_text(encoding="utf-8").splitlines())):
        assert ans["generated"] == row["generated"]
        if row["kind"] == "classify":
            assert ans["label"] == row["predicted"]
        else:
            assert sorted([k, v] for k, vs in ans["spans"].items() for v in vs) == row["predicted"]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    worker(Path(sys.argv[1]))
