"""Prompt formats: the exact prompts, the answers, and a parser that reads what models actually generate."""

import pytest

from ecomkit.data.formats import (
    KIND_CLASSIFY,
    KIND_EXTRACT,
    NO_SPANS,
    PROMPT_FORMATS,
    ParsedAnswer,
    TaskExample,
    build_prompt,
    format_answer,
    parse_answer,
    prompt_and_answer,
)
from ecomkit.errors import ConfigError

LABELS = ("品牌", "颜色", "尺码")
TEXT = "华为 Mate60 黑色 手机 华为旗舰"


def extract(spans, text=TEXT, labels=LABELS):
    return TaskExample(KIND_EXTRACT, text, labels, gold_spans=tuple(spans), source="t:1")


def test_seqgpt_prompt_is_seqgpts_readme_prompt():
    assert build_prompt("seqgpt", KIND_CLASSIFY, "这个手机很好用", ["正面", "负面"]) == \
        "输入: 这个手机很好用\n分类: 正面，负面\n输出: [GEN]"
    assert build_prompt("seqgpt", KIND_EXTRACT, TEXT, LABELS) == f"输入: {TEXT}\n抽取: 品牌，颜色，尺码\n输出: [GEN]"


def test_ecomgpt_prompt_is_an_alpaca_block_with_candidates():
    prompt = build_prompt("ecomgpt", KIND_EXTRACT, TEXT, LABELS)
    assert prompt.index("### Instruction:\n") < prompt.index("候选标签: 品牌，颜色，尺码") < prompt.index(TEXT) \
        < prompt.index("### Response:\n")
    assert prompt.endswith("### Response:\n")
    assert "分类" in build_prompt("ecomgpt", KIND_CLASSIFY, "x", ["a", "b"])


def test_ecomkit_prompt_keeps_the_old_layout():
    prompt = build_prompt("ecomkit", KIND_CLASSIFY, "好评", ["正面", "负面"])
    assert prompt.startswith("任务:") and prompt.endswith("答:") and "候选:正面、负面" in prompt


def test_unknown_format_and_kind_are_config_errors():
    with pytest.raises(ConfigError, match="seqgpt"):
        build_prompt("alpaca", KIND_CLASSIFY, "x", ["a"])
    with pytest.raises(ConfigError, match="classify"):
        build_prompt("seqgpt", "ner", "x", ["a"])


def test_task_example_sorts_and_deduplicates_spans_and_checks_labels():
    ex = extract([("颜色", "黑色"), ("品牌", "华为"), ("品牌", "华为")])
    assert ex.gold_spans == (("品牌", "华为"), ("颜色", "黑色"))
    with pytest.raises(ConfigError, match="not among"):
        extract([("型号", "Mate60")])
    with pytest.raises(ConfigError, match="not among"):
        TaskExample(KIND_CLASSIFY, "x", ("a", "b"), gold_label="c")


def test_extraction_answer_one_line_per_label_in_label_order_spans_in_text_order():
    ex = extract([("颜色", "黑色"), ("品牌", "华为旗舰"), ("品牌", "华为")])
    assert format_answer("seqgpt", ex) == "品牌: 华为，华为旗舰\n颜色: 黑色"
    assert prompt_and_answer("seqgpt", ex) == (build_prompt("seqgpt", KIND_EXTRACT, TEXT, LABELS),
                                               "品牌: 华为，华为旗舰\n颜色: 黑色")


def test_no_spans_answer_is_documented_and_parses_to_empty():
    ex = extract([])
    for fmt in PROMPT_FORMATS:
        assert format_answer(fmt, ex) == NO_SPANS == "无"
        assert parse_answer(fmt, KIND_EXTRACT, NO_SPANS, LABELS) == ParsedAnswer(None, frozenset())


def test_classification_answer_is_the_label_and_round_trips():
    ex = TaskExample(KIND_CLASSIFY, "好用", ("正面", "负面"), gold_label="负面")
    for fmt in PROMPT_FORMATS:
        assert format_answer(fmt, ex) == "负面"
        assert parse_answer(fmt, KIND_CLASSIFY, format_answer(fmt, ex), ex.labels).label == "负面"


@pytest.mark.parametrize("fmt", PROMPT_FORMATS)
def test_gold_answers_parse_back_to_gold_spans(fmt):
    ex = extract([("颜色", "黑色"), ("品牌", "华为"), ("尺码", "XL")], text="华为 黑色 XL")
    assert parse_answer(fmt, KIND_EXTRACT, format_answer(fmt, ex), LABELS).spans == frozenset(ex.gold_spans)


def test_parser_tolerates_spaces_and_both_widths_of_punctuation():
    want = frozenset({("品牌", "华为"), ("品牌", "小米"), ("颜色", "黑色"), ("颜色", "白色"), ("尺码", "XL")})
    for text in ("品牌: 华为，小米\n颜色: 黑色，白色\n尺码: XL",
                 " 品牌 ： 华为 , 小米 \n\n颜色:黑色、白色\n 尺码：XL。",
                 "品牌：华为;小米\r\n颜色： 黑色 ； 白色\n尺码 : XL"):
        assert parse_answer("seqgpt", KIND_EXTRACT, text, LABELS).spans == want, text


def test_parser_counts_unknown_labels_and_keeps_the_rest():
    parsed = parse_answer("seqgpt", KIND_EXTRACT, "品牌: 华为\n型号: Mate60\n颜色: 黑色", LABELS)
    assert parsed.spans == {("品牌", "华为"), ("颜色", "黑色")}
    assert parsed.unknown_labels == ("型号",)


def test_parser_treats_repeated_spans_as_a_set():
    parsed = parse_answer("seqgpt", KIND_EXTRACT, "品牌: 华为，华为\n品牌: 华为", LABELS)
    assert parsed.spans == {("品牌", "华为")} and parsed.unknown_labels == ()


def test_parser_stops_at_trailing_text_and_new_prompts():
    assert parse_answer("seqgpt", KIND_EXTRACT, "品牌: 华为\n以上是抽取结果\n颜色: 黑色", LABELS).spans == \
        {("品牌", "华为")}
    assert parse_answer("seqgpt", KIND_EXTRACT, "品牌: 华为\n输入: 小米 白色\n抽取: 品牌\n输出: [GEN]品牌: 小米",
                        LABELS).spans == {("品牌", "华为")}
    assert parse_answer("ecomgpt", KIND_EXTRACT, "颜色: 黑色\n\n### Instruction:\n品牌: x", LABELS).spans == \
        {("颜色", "黑色")}


def test_parser_full_width_label_forms_and_none_words():
    parsed = parse_answer("seqgpt", KIND_EXTRACT, "ＳＩＺＥ：ＸＬ\n品牌: 无", ("size", "品牌"))
    assert parsed.spans == {("size", "ＸＬ")}     # the label is matched in NFKC, the span kept as written


def test_classification_parser_first_line_prefix_and_unknown():
    labels = ("正面", "负面", "中性")
    assert parse_answer("seqgpt", KIND_CLASSIFY, " 正面 \n输入: 别的", labels).label == "正面"
    assert parse_answer("seqgpt", KIND_CLASSIFY, "负面。这条评论在抱怨", labels).label == "负面"
    assert parse_answer("seqgpt", KIND_CLASSIFY, "positive", ("Positive", "Negative")).label == "Positive"
    unknown = parse_answer("seqgpt", KIND_CLASSIFY, "好评", labels)
    assert unknown.label is None and unknown.unknown_labels == ("好评",)
    assert parse_answer("seqgpt", KIND_CLASSIFY, "", labels) == ParsedAnswer(None, frozenset())


def test_parser_drops_punctuation_only_spans():
    assert parse_answer("seqgpt", KIND_EXTRACT, "品牌:: \n颜色：：黑色", LABELS).spans == {("颜色", "黑色")}


def test_parser_keeps_brackets_and_dots_inside_spans():
    labels = ("品牌", "型号")
    parsed = parse_answer("seqgpt", KIND_EXTRACT, "品牌: Acme Co.\n型号: SPF50 (PA+++)。", labels)
    assert parsed.spans == {("品牌", "Acme Co."), ("型号", "SPF50 (PA+++)")}
