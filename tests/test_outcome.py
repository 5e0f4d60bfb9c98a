"""What a run says at its end: each figure's method, and why a model that does not clear its baseline did not.

Pure functions (``ecomkit.train.outcome``, ``ecomkit.metrics``, ``ecomkit.task_summary``); the run's own line is checked end to end in
``test_outcome_e2e.py``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from ecomkit import metrics
from ecomkit.metrics import not_learned_line
from ecomkit.task_summary import classification_lines, eval_methods, generation_lines, methods_line, task_lines
from ecomkit.train.gen_eval import budget_advice
from ecomkit.train.task_metrics import (baseline_outcome, launch_command, likely_reasons, missed_baselines,
                                        retry_command)

# The issue's run: candidate scoring at the majority baseline, generated labels below theirs.
ISSUE_SUMMARY = {"acc_category": 0.159, "macro_f1_category": 0.03, "majority_category": 0.159,
                 "majority_label_category": "手机", "scored_category": 3139,
                 "acc_sentiment": 0.499, "majority_sentiment": 0.505, "majority_label_sentiment": "positive",
                 "gen_acc": 0.0, "gen_macro_f1": 0.0, "gen_majority_acc": 0.332, "gen_acc_margin_points": -33.2,
                 "gen_classify_n": 6278}


def test_every_figure_names_its_method_in_the_row_and_the_printed_lines():
    methods = eval_methods({**ISSUE_SUMMARY, "eval_loss": 2.0, "gen_span_f1": 0.5, "gen_span_f1_margin_points": 1.0})
    assert methods["acc_category"] == methods["macro_f1_category"] == "candidate scoring"
    assert methods["gen_acc"] == "generation, exact match" and methods["gen_span_f1"] == "generation, span F1"
    assert "eval_loss" not in methods and "majority_category" not in methods and "gen_span_f1_margin_points" \
        not in methods
    assert "eval category   accuracy 0.159 by candidate scoring" in classification_lines(ISSUE_SUMMARY)
    assert "generated labels accuracy 0.000 by generation, exact match" in generation_lines(ISSUE_SUMMARY)
    # both methods in one summary: one line says how they differ, so 0.159 and 0.000 no longer disagree unlabelled
    both = {**ISSUE_SUMMARY, "eval_methods": eval_methods(ISSUE_SUMMARY)}
    assert "candidate scoring ranks the candidate labels" in methods_line(both)
    assert methods_line({"acc_category": 0.5, "eval_methods": {"acc_category": "candidate scoring"}}) == ""


# One summary per kind of task score the printed lines read: each must open the gate to their module.
ONE_SCORE_EACH = [{"acc_category": 0.5}, {"gen_acc": 0.5, "gen_macro_f1": 0.4, "gen_classify_n": 8},
                  {"gen_decoded": 8, "gen_examples_per_s": 2.0, "gen_decode_mode": "greedy", "gen_prompts_cut": 0,
                   "gen_unknown_labels": 0}, {"gen_budget_advice": "raise it with --gen-max-new-tokens N"}]


@pytest.mark.parametrize("summary", ONE_SCORE_EACH, ids=lambda s: next(iter(s)))
def test_the_run_summary_prints_every_kind_of_task_score_through_the_module_found_by_name(summary):
    """``metrics.task_lines`` loads ``task_summary`` (``metrics.TASK_SUMMARY``) when a summary holds task scores."""
    assert metrics.task_lines(summary) == task_lines(summary) != ""


def test_a_summary_without_task_scores_does_not_load_their_lines():
    code = ("import sys; from ecomkit import metrics; "
            "assert metrics.task_lines({'eval_loss': 1.0, 'eval_methods': {}}) == ''; "
            "assert metrics.TASK_SUMMARY not in sys.modules and metrics.REPORTING not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_figures_that_miss_their_baseline_are_named_with_their_method():
    assert missed_baselines(ISSUE_SUMMARY) == ["category 0.159 ≤ 0.159 (candidate scoring)",
                                               "sentiment 0.499 ≤ 0.505 (candidate scoring)",
                                               "generated labels 0.000 ≤ 0.332 (generation)"]
    assert missed_baselines({"acc_category": 0.3, "majority_category": 0.159, "gen_acc_margin_points": 5.0}) == []


def test_likely_reason_too_few_steps_then_lr_then_a_preset():
    few = likely_reasons(steps=60, steps_per_epoch=3531, lr=3e-3, model_kind="preset")
    assert few[0].text.startswith("too few steps: 60 steps saw 0.02 of one pass")
    assert few[0].flags == {"--max-steps": "0", "--epochs": "3"}
    assert "random-init preset knows no language" in few[1].text
    # real weights at a preset's lr: the lr is named first, with the recommended one as the fix
    real = likely_reasons(steps=600, steps_per_epoch=100, lr=3e-3, model_kind="local", recommended_lr=2e-5)
    assert [r.text for r in real] == ["lr 0.003 is far from the 2e-05 recommended for real weights fine-tuned in full"]
    assert real[0].flags == {"--lr": "2e-05"}
    lora = likely_reasons(steps=600, steps_per_epoch=100, lr=2e-5, model_kind="hub", recommended_lr=2e-4,
                          peft="lora")
    assert lora[0].text.endswith("recommended for real weights with LoRA")
    # within the factor of the recipe, enough passes, real weights: nothing the settings point to
    assert likely_reasons(steps=600, steps_per_epoch=100, lr=3e-5, model_kind="local", recommended_lr=2e-5) == []
    # a preset that saw enough passes is asked for more of them (twice as many, at least RETRY_EPOCHS)
    assert likely_reasons(steps=1000, steps_per_epoch=100, lr=3e-3, model_kind="preset")[0].flags["--epochs"] == "20"


def test_retry_command_is_the_users_own_command_with_the_flags_changed():
    cmd = ["torchrun", "--standalone", "--nproc_per_node", "2", "scripts/02_data_parallel.py", "--task", "nlu",
           "--data", "reviews.csv", "--column-map", '{"cat": "category"}', "--max-steps=60", "--lr", "3e-3"]
    out = shlex.split(retry_command(cmd, {"--max-steps": "0", "--epochs": "3", "--lr": "2e-05"}))
    assert out == [*cmd[:11], "--max-steps", "0", "--lr", "2e-05", "--epochs", "3"]
    assert launch_command(["scripts/02_data_parallel.py", "--task", "nlu"], {"LOCAL_WORLD_SIZE": "2",
                                                                             "TORCHELASTIC_RUN_ID": "x"}) == [
        "torchrun", "--standalone", "--nproc_per_node", "2", "scripts/02_data_parallel.py", "--task", "nlu"]
    assert launch_command(["scripts/08_tasks.py"], {}) == ["python", "scripts/08_tasks.py"]


def test_a_summary_that_misses_its_baseline_says_so_in_one_line_with_the_reason_and_the_retry():
    summary = {**ISSUE_SUMMARY, "steps": 60, "steps_per_epoch": 3531, "model_origin": {"kind": "preset"},
               "config": {"lr": 3e-3, "peft": "none"}}
    verdict = baseline_outcome(summary, ["torchrun", "--nproc_per_node", "2", "s.py", "--data", "r.csv"])
    assert verdict["cleared"] is False and len(verdict["missed"]) == 3
    line = not_learned_line({"baseline": verdict})
    assert line.count("\n") == 1 and line.startswith("NOT LEARNED: category 0.159 ≤ 0.159 (candidate scoring)")
    assert "Likely: too few steps" in line
    assert line.rstrip().endswith("Try: torchrun --nproc_per_node 2 s.py --data r.csv --max-steps 0 --epochs 3")
    cleared = baseline_outcome({"acc_category": 0.4, "majority_category": 0.159}, ["python", "s.py"])
    assert cleared == {"cleared": True} and not_learned_line({"baseline": cleared}) == ""
    lm = baseline_outcome({"eval_loss": 3.0, "steps": 10, "config": {"lr": 3e-3}}, ["python", "s.py"])
    assert lm == {"cleared": None} and not_learned_line({"baseline": lm}) == ""   # an LM run has no baseline


def test_budget_advice_follows_the_cause():
    # the budget holds every training answer: the model has not learned to end them, more budget will not help
    untrained = budget_advice(393, 400, 11, longest_answer=3)
    assert "has not learned to end its answers" in untrained and "will not help" in untrained
    # a budget below the longest training answer: raising it is the lever
    short = budget_advice(300, 400, 4, longest_answer=12)
    assert short.endswith("raise it with --gen-max-new-tokens N") and "not learned" not in short
    summary = {"gen_acc": 0.0, "gen_macro_f1": 0.0, "gen_classify_n": 4, "gen_decoded": 4, "gen_held_out": 4,
               "gen_examples_per_s": 1.0, "gen_decode_mode": "generate", "gen_prompts_cut": 0,
               "gen_unknown_labels": 0, "gen_at_budget": 4, "gen_max_new_tokens": 11,
               "gen_budget_advice": budget_advice(4, 4, 11, longest_answer=3)}
    assert "raise it" not in generation_lines(summary) and "train longer" in generation_lines(summary)
