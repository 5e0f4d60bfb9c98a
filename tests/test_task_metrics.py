"""Scores of generated answers and their baselines (``ecomkit.train.task_metrics``, ``gen_eval``): pure functions."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from ecomkit.data.formats import TaskExample, parse_answer
from ecomkit.train.gen_eval import prediction_rows, scores_from_rows, shard_range
from ecomkit.train.task_metrics import (SpanDictionary, classification_scores, extraction_scores, f1,
                                        majority_answer, margin_points)


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
    # the baseline answers each label set's most frequent *training* label; ties and unseen labels: prompt order
    assert majority_answer(("正面", "负面"), {"正面": 7, "负面": 3}) == "正面"
    assert classification_scores(golds, [majority_answer(("正面", "负面"), {"正面": 7})] * 4)["acc"] == 0.75
    assert majority_answer(("a", "b"), {"a": 2, "b": 2}) == "a" and majority_answer(("x", "y"), {}) == "x"
    assert majority_answer(("正面", "负面"), {"负面": 1}) == "负面"
    assert margin_points(0.8, 0.75) == pytest.approx(5.0)


def test_the_majority_baseline_comes_from_training_labels_not_the_evaluated_ones():
    # held out: three 正面, one 负面; training: mostly 负面. The baseline always answers 负面 and scores 1/4.
    exs = [TaskExample("classify", t, ("正面", "负面"), gold_label=g)
           for t, g in (("好", "正面"), ("很好", "正面"), ("不错", "正面"), ("差", "负面"))]
    rows = prediction_rows("seqgpt", exs, ["正面"] * 4, SpanDictionary.from_spans([]), {"正面": 2, "负面": 8})
    assert [r["majority"] for r in rows] == ["负面"] * 4
    s = scores_from_rows(rows)
    assert s["gen_majority_acc"] == 0.25 and s["gen_acc"] == 0.75 and s["gen_majority_labels"] == ["负面"]
    assert s["gen_acc_margin_points"] == pytest.approx(50.0)


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
    rows = prediction_rows("seqgpt", exs, generated, d, {"正面": 5, "负面": 4})
    s = scores_from_rows(rows)
    assert s["gen_span_f1"] == pytest.approx(f1(2, 3, 3)) and s["dict_span_f1"] == pytest.approx(f1(2, 2, 3))
    assert s["gen_acc"] == 0.5 and s["gen_majority_acc"] == 0.5 and s["gen_unknown_labels"] == 1
    for row in rows:   # what the row records as predicted is what the parser reads from its generated text
        parsed = parse_answer("seqgpt", row["kind"], row["generated"], row["labels"])
        expect = parsed.label if row["kind"] == "classify" else sorted(map(list, parsed.spans))
        assert row["predicted"] == expect


def test_printed_summary_says_whether_each_baseline_is_cleared_and_by_how_much():
    from ecomkit.metrics import generation_lines

    assert generation_lines({"eval_loss": 1.0}) == ""   # no evaluation by generation: no lines
    rows = prediction_rows("seqgpt", [TaskExample("extract", "华为 手机", ("品牌",), gold_spans=(("品牌", "华为"),)),
                                      TaskExample("classify", "好", ("正面", "负面"), gold_label="正面")],
                           ["品牌: 小米", "负面"], SpanDictionary.from_spans([("品牌", "华为")]), {"正面": 1})
    s = scores_from_rows(rows)
    s.update(gen_decoded=2, gen_examples_per_s=3.0, gen_decode_mode="generate", gen_prompts_cut=0)
    text = generation_lines(s)
    assert "margin -100.0 points (does NOT clear it; 1 examples)" in text      # F1 0 against the dictionary's 1
    assert "accuracy 0.000" in text and "majority baseline 1.000" in text and "2 examples, 3.0 examples/s" in text
