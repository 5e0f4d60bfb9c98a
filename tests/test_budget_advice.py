"""Warnings that fit the moment (issue 56 item 4): no advice about the answers' ends before any training step,
and none for a share of answers at the budget too small to move a figure by a point (measured by bench_budget)."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from ecomkit.task_summary import generation_lines
from ecomkit.train.gen_eval import BUDGET_ADVICE_SHARE, budget_advice, budget_line
from ecomlab.artifacts import newest_artifacts
from ecomlab.derive.budget import advice_share, recovery_rate

RESULTS = REPO / "benchmarks" / "results"


def test_no_advice_for_a_share_that_cannot_move_a_figure_by_a_point():
    """The issue's run: 1 answer in 6,278 at the budget got "train longer" in the closing summary."""
    assert budget_advice(1, 6278, 11, longest_answer=3) is None
    assert budget_advice(393, 400, 11, longest_answer=3).endswith("a larger --gen-max-new-tokens will not help")
    at = int(BUDGET_ADVICE_SHARE * 1000)
    assert budget_advice(at, 1000, 11, 3) is None and budget_advice(at + 1, 1000, 11, 3) is not None
    assert "raise it" not in budget_line(1, 6278, 11, "--gen-max-new-tokens")
    assert "raise it with --gen-max-new-tokens N" in budget_line(300, 400, 11, "--gen-max-new-tokens")
    summary = {"gen_acc": 0.9, "gen_macro_f1": 0.9, "gen_classify_n": 6278, "gen_decoded": 6278, "gen_held_out": 6278,
               "gen_examples_per_s": 1.0, "gen_decode_mode": "generate", "gen_prompts_cut": 0,
               "gen_unknown_labels": 0, "gen_at_budget": 1, "gen_max_new_tokens": 11}
    lines = generation_lines(summary)
    assert "budget " not in lines and "train longer" not in lines and "1 answers stopped at the budget" in lines


def test_the_advice_share_is_a_point_over_the_largest_rate_at_which_freed_answers_were_regained():
    def at(budget, at_budget, score):
        return {"budget": budget, "at_budget": at_budget, "decoded": 200, "score": score}

    # 100 answers cut at budget 1 (50 %), 20 at budget 3 (10 %), none at 8; the figure regained 40 and 10 points
    sweep = [at(1, 100, 40.0), at(3, 20, 70.0), at(8, 0, 80.0)]
    assert recovery_rate(sweep) == pytest.approx((40.0 + 10.0) / (50.0 + 10.0))
    assert recovery_rate([at(4, 0, 50.0), at(8, 0, 50.0)]) is None            # no budget cut an answer
    slower = [at(2, 20, 75.0), at(8, 0, 80.0)]                                 # 5 points for 10: rate 0.5
    assert advice_share([sweep, slower]) == pytest.approx(1.0 / (100 * 50.0 / 60.0))   # the largest rate
    with pytest.raises(ValueError, match="no budget"):
        advice_share([[at(4, 0, 50.0), at(8, 0, 50.0)]])


def test_the_advice_share_is_what_bench_budget_measured():
    path = newest_artifacts(RESULTS).get("bench_budget")
    if path is None:
        pytest.skip("no bench_budget artifact in benchmarks/results yet")
    doc = json.loads(path.read_text())
    assert advice_share([r["sweep"] for r in doc["rows"]]) == pytest.approx(BUDGET_ADVICE_SHARE, abs=5e-4)


def test_the_step_0_evaluation_gives_no_advice_on_the_answers_ends(tmp_path):
    """On main the step-0 evaluation, before any training, logged "the model has not learned to end its answers
    yet; train longer". Now that row counts its answers at the budget and advises nothing; after a step it does."""
    from ecomkit.config import parse_config
    from ecomkit.data.toy_tasks import write_colour_task
    from ecomkit.train.loop import run_training

    train, dev = write_colour_task(tmp_path / "data", n_train=60, n_dev=8)
    cfg, _ = parse_config(["--task", "nlu", "--data", str(train), "--eval-data", str(dev), "--model", "tiny",
                           "--max-steps", "1", "--eval-interval", "1", "--gen-eval-samples", "8",
                           "--final-eval-samples", "8", "--eval-nlu-samples", "4", "--no-save-model", "--no-progress",
                           "--report-to", "none", "--output-dir", str(tmp_path / "run")])
    run_training(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r for r in rows if "gen_decoded" in r}
    assert evals[0]["gen_at_budget"] / evals[0]["gen_decoded"] > BUDGET_ADVICE_SHARE   # untrained: answers run on
    assert "gen_budget_advice" not in evals[0]
    assert "train longer" in evals[1]["gen_budget_advice"]                              # one step in: it may
