"""Scores of generated answers and their baselines (``ecomkit.train.task_metrics``, ``gen_eval``): pure functions."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from ecomkit.data.formats import TaskExample, parse_answer
from ecomkit.train.gen_eval import budget_advice, prediction_rows, scores_from_rows, shard_range
from ecomkit.train.task_metrics import (SpanDictionary, classification_scores, extraction_scores, f1, invalid_text,
                                        majority_label, margin_points, spans_not_in_text, training_majorities)


def test_extraction_micro_scores_strict_accuracy_and_per_label_f1_by_hand():
    golds = [{("品牌", "华为"), ("颜色", "黑色")}, {("品牌", "小米")}, set()]
    preds = [{("品牌", "华为"), ("颜色", "白色")}, {("品牌", "小米")}, set()]
    s = extraction_scores(golds, preds)
    # tp 2 (华为, 小米), predicted 3, gold 3
    assert (s["tp"], s["n_pred"], s["n_gold"]) == (2, 3, 3)
    assert s["precision"] == pytest.approx(2 / 3) and s["recall"] == pytest.approx(2 / 3)
    assert s["f1"] == pytest.approx(2 / 3)
    assert s["strict_acc"] == pytest.approx(2 / 3)   # the empty example with nothing predicted counts as exact
    assert s["per_label_f1"] == {"品牌": 1.0, "颜色": 0.0}


def test_extraction_scores_are_set_based_and_safe_on_empty_input():
    once = extraction_scores([{("品牌", "华为")}], [[("品牌", "华为"), ("品牌", "华为")]])  # a repeated span
    assert once["f1"] == 1.0 and once["n_pred"] == 1
    nothing = extraction_scores([set()], [set()])
    assert nothing["f1"] == 0.0 and nothing["strict_acc"] == 1.0
    assert math.isnan(extraction_scores([], [])["strict_acc"])
    with pytest.raises(ValueError):
        extraction_scores([set()], [])


def test_classification_accuracy_macro_f1_and_the_majority_baseline():
    golds = ["正面", "正面", "正面", "负面"]
    preds = ["正面", "负面", None, "负面"]       # None: an answer the parser could not map to a label
    s = classification_scores(golds, preds)
    assert s["acc"] == 0.5
    assert s["macro_f1"] == pytest.approx((f1(1, 1, 3) + f1(1, 2, 1)) / 2)
    assert majority_label(("正面", "负面"), {"正面": 30, "负面": 10}) == "正面"
    assert classification_scores(golds, ["正面"] * 4)["acc"] == 0.75
    # a tie, or a label set no training example has, goes to the label listed first in the prompt
    assert majority_label(("a", "b"), {"a": 2, "b": 2}) == "a" and majority_label(("x", "y"), {}) == "x"
    assert training_majorities({"category": ("a", "b"), "sentiment": ("x", "y")},
                               {"category": {"b": 3, "a": 1}}) == {("a", "b"): "b", ("x", "y"): "x"}
    assert margin_points(0.8, 0.75) == pytest.approx(5.0)


def test_the_majority_baseline_comes_from_training_labels_not_the_scored_ones():
    """Issue #43 item 1: a train/dev pair whose majorities differ.

    Training majority 'b'; the dev file's most frequent label is 'a'. A model that always answers the training
    majority scores exactly the baseline (margin 0); on main the baseline took the dev majority and scored
    0.5 on these rows, so that model "did NOT clear" a baseline that is itself.
    """
    train = {"category": {"a": 10, "b": 30, "c": 5}}
    majorities = training_majorities({"category": ("a", "b", "c")}, train)
    dev = [TaskExample("classify", f"t{i}", ("a", "b", "c"), gold_label=g)
           for i, g in enumerate(["a", "a", "a", "b", "b", "c"])]
    rows = prediction_rows("seqgpt", dev, ["b"] * 6, SpanDictionary({}), majorities)
    assert [r["majority"] for r in rows] == ["b"] * 6
    s = scores_from_rows(rows)
    assert s["gen_majority_acc"] == pytest.approx(2 / 6) and s["gen_acc"] == pytest.approx(2 / 6)
    assert s["gen_acc_margin_points"] == 0.0
    assert "gen_majority_acc" not in scores_from_rows(prediction_rows("seqgpt", dev, ["b"] * 6, SpanDictionary({})))


def test_garbled_answers_are_counted_per_row_and_in_the_summary():
    """Issue #43 item 7: answers with U+FFFD and spans not in the input are counted (scoring stays exact match)."""
    assert invalid_text("品牌: 华\ufffd") and not invalid_text("品牌: 华为")
    assert spans_not_in_text({("品牌", "华为"), ("品牌", "苹果")}, "华为 手机") == 1
    exs = [TaskExample("extract", "华为 黑色 手机", ("品牌", "颜色"), gold_spans=(("品牌", "华为"),)),
           TaskExample("extract", "小米 充电器", ("品牌",), gold_spans=(("品牌", "小米"),)),
           TaskExample("classify", "很好用", ("正面", "负面"), gold_label="正面")]
    generated = ["品牌: 华为，苹果\n颜色: 白色", "品牌: 小\ufffd", "正\ufffd"]
    rows = prediction_rows("seqgpt", exs, generated, SpanDictionary({}), {("正面", "负面"): "正面"})
    assert [r["invalid_text"] for r in rows] == [False, True, True]
    assert [r.get("spans_not_in_input") for r in rows] == [2, 1, None]   # 苹果, 白色; 小\ufffd
    s = scores_from_rows(rows)
    assert s["gen_invalid_text"] == 2 and s["gen_spans_not_in_input"] == 3
    assert s["gen_span_f1"] == pytest.approx(f1(1, 4, 2))   # still exact match: 华为 right, the rest wrong


def test_answers_that_stopped_at_the_budget_are_counted_with_the_flag_that_raises_it():
    """Issue #42: generations that used every new token without ending are counted per row and in the summary."""
    from ecomkit.task_summary import generation_lines
    from ecomkit.train.generate import stopped_at_budget

    assert stopped_at_budget([5, 6, 7], eos_id=2, max_new_tokens=3)
    assert not stopped_at_budget([5, 6], eos_id=2, max_new_tokens=3)   # ended (its EOS was dropped) before
    exs = [TaskExample("classify", "好", ("正面", "负面"), gold_label="正面")] * 3
    rows = prediction_rows("seqgpt", exs, ["正面", "正面正面正面", "负面"], SpanDictionary({}),
                           {("正面", "负面"): "正面"}, at_budget=[False, True, False])
    assert [r["at_budget"] for r in rows] == [False, True, False]
    s = scores_from_rows(rows)
    assert s["gen_at_budget"] == 1
    s.update(gen_decoded=3, gen_examples_per_s=1.0, gen_decode_mode="generate", gen_prompts_cut=0,
             gen_max_new_tokens=4)
    assert "1 answers stopped at the budget" in generation_lines(s)   # counted; advice is the evaluator's to give
    s["gen_budget_advice"] = budget_advice(1, 3, 4, longest_answer=12)   # a third of them, the budget too short
    assert ("1 of 3 generated answers stopped at the budget of 4 new tokens without ending (they may be cut short); "
            "raise it with --gen-max-new-tokens N") in generation_lines(s)


def test_dictionary_baseline_most_frequent_label_longest_match_first_and_only_asked_labels():
    d = SpanDictionary.from_spans([("颜色", "红色"), ("颜色", "红色"), ("品牌", "红色"), ("品牌", "红"),
                                   ("品牌", "华为"), ("尺码", "XL")])
    assert d.label_of["红色"] == "颜色"
    # 红色 (longest) wins over 红 inside it; a second 红 elsewhere still matches; 尺码 is not asked for
    found = d.predict("红色外套 红 华为 XL", ["颜色", "品牌"])
    assert found == {("颜色", "红色"), ("品牌", "红"), ("品牌", "华为")}
    assert SpanDictionary.from_spans([("b", "x"), ("a", "x")]).label_of["x"] == "a"   # ties: the first label sorted
    counted = SpanDictionary.from_spans(Counter({("品牌", "红色"): 3, ("颜色", "红色"): 2}))   # a Counter counts
    assert counted.label_of["红色"] == "品牌"


def test_shards_are_contiguous_disjoint_and_cover_everything():
    for n in range(0, 12):
        for count in (1, 2, 3, 4):
            ranges = [shard_range(n, i, count) for i in range(count)]
            covered = [j for a, b in ranges for j in range(a, b)]
            assert covered == list(range(n))
            sizes = [b - a for a, b in ranges]
            assert max(sizes) - min(sizes) <= 1


def test_scores_recomputed_from_prediction_rows_by_reparsing_the_generated_text():
    exs = [TaskExample("extract", "华为 黑色 手机", ("品牌", "颜色"), gold_spans=(("品牌", "华为"), ("颜色", "黑色"))),
           TaskExample("extract", "小米 充电器", ("品牌", "颜色"), gold_spans=(("品牌", "小米"),)),
           TaskExample("classify", "很好用", ("正面", "负面"), gold_label="正面"),
           TaskExample("classify", "太差了", ("正面", "负面"), gold_label="负面")]
    generated = ["品牌: 华为\n颜色：白色", "品牌：小米，小米", "正面", "我不知道"]
    d = SpanDictionary.from_spans([("品牌", "华为"), ("颜色", "黑色")])
    rows = prediction_rows("seqgpt", exs, generated, d, {("正面", "负面"): "正面"})
    s = scores_from_rows(rows)
    assert s["gen_span_f1"] == pytest.approx(f1(2, 3, 3)) and s["dict_span_f1"] == pytest.approx(f1(2, 2, 3))
    assert s["gen_acc"] == 0.5 and s["gen_majority_acc"] == 0.5 and s["gen_unknown_labels"] == 1
    for row in rows:   # what the row records as predicted is what the parser reads from its generated text
        parsed = parse_answer("seqgpt", row["kind"], row["generated"], row["labels"])
        expect = parsed.label if row["kind"] == "classify" else sorted(map(list, parsed.spans))
        assert row["predicted"] == expect


def test_printed_summary_says_whether_each_baseline_is_cleared_and_by_how_much():
    from ecomkit.task_summary import generation_lines

    assert generation_lines({"eval_loss": 1.0}) == ""   # no evaluation by generation: no lines
    rows = prediction_rows("seqgpt", [TaskExample("extract", "华为 手机", ("品牌",), gold_spans=(("品牌", "华为"),)),
                                      TaskExample("classify", "好", ("正面", "负面"), gold_label="正面")],
                           ["品牌: 小米", "负面"], SpanDictionary.from_spans([("品牌", "华为")]), {("正面", "负面"): "正面"})
    s = scores_from_rows(rows)
    s.update(gen_decoded=2, gen_held_out=5, gen_examples_per_s=3.0, gen_decode_mode="generate", gen_prompts_cut=0)
    text = generation_lines(s)
    assert "margin -100.0 points (does NOT clear it; 1 examples)" in text      # F1 0 against the dictionary's 1
    assert "accuracy 0.000" in text and "training-majority baseline 1.000" in text
    assert "2 of 5 held-out examples, 3.0 examples/s" in text and "\nbudget" not in text   # no advice line
