"""Extraction data: the three shapes, their maps, their bad rows, and what build_datasets makes of them."""

import json
from collections import Counter

import pytest
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from ecomkit.data import build_datasets, load_records, write_jsonl
from ecomkit.data.catalog import SPAN_LABELS, catalog_spans, generate_catalog
from ecomkit.data.formats import KIND_CLASSIFY, KIND_EXTRACT, TaskExample, prompt_and_answer
from ecomkit.data.task_file import parse_labels, read_task_file, write_task_file
from ecomkit.data.catalog import spans_from_json
from ecomkit.data.spans import tokens_text
from ecomkit.data.tasks import task_examples
from ecomkit.data.tokenize import IGNORE_INDEX
from ecomkit.errors import DataError
from ecomkit.models.tokenizer import get_tokenizer

TEXT = "华为Mate60手机 黑色 XL"
SPAN_ROW = {"text": TEXT, "spans": [{"type": "品牌", "term": "华为", "start": 0, "end": 2},
                                    {"type": "颜色", "term": "黑色", "start": 11, "end": 13}]}
WANT = [["品牌", 0, 2, "华为"], ["颜色", 11, 13, "黑色"]]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return get_tokenizer("synthetic", tmp_path_factory.mktemp("tok"), n_rows=1500)


def load(tmp_path, rows, **kwargs):
    return load_records(write_jsonl(rows, tmp_path / "rows.jsonl"), task="nlu", **kwargs)


def spans_of(result):
    return [json.loads(r["spans"]) for r in result.records]


def test_span_list_exclusive_end_and_key_aliases(tmp_path):
    aliased = {"text": TEXT, "ents": [{"label": "品牌", "entity": "华为", "start": 0, "end": 2},
                                      {"kind": "颜色", "span": "黑色", "start": 11, "end": 13}]}
    result = load(tmp_path, [SPAN_ROW, aliased], column_map={"ents": "spans", "kind": "type"})
    assert spans_of(result) == [WANT, WANT] and result.records[0]["text"] == TEXT


def test_inclusive_file_is_refused_with_the_fix_and_read_right_when_told(tmp_path):
    rows = [{"text": TEXT, "spans": [{"type": t, "term": w, "start": s, "end": e - 1} for t, s, e, w in WANT]}] * 3
    with pytest.raises(DataError, match=r"3 of 3 rows with spans.*--span-end inclusive"):
        load(tmp_path, rows)
    assert spans_of(load(tmp_path, rows, span_end="inclusive")) == [WANT] * 3
    with pytest.raises(DataError, match=r"line 1, field 'spans'.*\[inclusive_span_end\].*--span-end inclusive"):
        load(tmp_path, rows, strict=True)


def test_a_few_inclusive_looking_rows_among_good_ones_are_counted_not_refused(tmp_path):
    bad = {"text": TEXT, "spans": [{"type": "品牌", "term": "华为", "start": 0, "end": 1}]}
    report = load(tmp_path, [SPAN_ROW] * 3 + [bad]).report
    assert report.counts == {"inclusive_span_end": 1} and report.kept == 3


def test_offsets_without_term_are_range_checked(tmp_path):
    rows = [{"text": TEXT, "spans": [{"type": "品牌", "start": 0, "end": 2}]},
            {"text": TEXT, "spans": [{"type": "品牌", "start": 5, "end": 99}]},
            {"text": TEXT, "spans": [{"type": "品牌", "start": "0", "end": 2}]},
            {"text": TEXT, "spans": "华为"}]
    report = load(tmp_path, rows).report
    assert report.counts == {"span_out_of_range": 1, "span_offsets": 2} and report.kept == 1
    assert "outside the text" in report.first_issue["span_out_of_range"].detail


def test_an_out_of_range_offset_is_named_with_its_line_behind_other_span_errors(tmp_path):
    """Issue #43 item 8: an offset past the text's end has its own reason, so the log names its line.

    Counted under ``span_offsets`` with the other span errors, it was hidden behind the first of them (line 2
    here): the report named only that row. A term given with such offsets was reported as a term mismatch.
    """
    rows = [SPAN_ROW,
            {"text": TEXT, "spans": [{"type": "品牌", "start": "0", "end": 2}]},                   # line 2
            {"text": TEXT, "spans": [{"type": "品牌", "term": "黑色", "start": 0, "end": 2}]},     # line 3
            {"text": TEXT, "spans": [{"type": "品牌", "term": "华为", "start": 0, "end": 40}]},   # line 4
            {"text": TEXT, "spans": [{"type": "品牌", "start": 30, "end": 32}]}] + [SPAN_ROW] * 5
    report = load(tmp_path, rows, max_chars=4096).report
    assert report.counts == {"span_offsets": 2, "span_out_of_range": 2}
    first = report.first_issue["span_out_of_range"]
    assert first.location == "line 4" and first.field == "spans" and "[0, 40)" in first.detail
    assert "span_out_of_range 2 (first at line 4, field 'spans': span 1: offsets [0, 40) are outside" in report.summary()
    with pytest.raises(DataError, match=r"line 4, field 'spans'.*\[span_out_of_range\]"):
        load(tmp_path, [SPAN_ROW] * 3 + [rows[3]], strict=True)


def test_nested_by_label_is_end_inclusive_and_label_map_renames(tmp_path):
    row = {"text": TEXT, "label": {"brand": {"华为": [[0, 1]]}, "color": {"黑色": [[11, 12]]}}}
    result = load(tmp_path, [row], label_map={"spans": {"brand": "品牌", "color": "颜色"}})
    assert spans_of(result) == [WANT]
    exclusive = {"text": TEXT, "label": {"brand": {"华为": [[0, 2]]}}}
    report = load(tmp_path, [row, exclusive]).report
    assert report.counts == {"span_offsets": 1} and "inclusive" in report.first_issue["span_offsets"].detail
    unmapped = load(tmp_path, [row, {"text": TEXT, "label": {"model": {"Mate60": [[2, 7]]}}}],
                    label_map={"spans": {"brand": "品牌", "color": "颜色"}}).report
    assert unmapped.counts == {"unmapped_label": 1}


def test_overlapping_spans_of_one_label_are_bad_of_two_labels_fine_duplicates_one(tmp_path):
    two_labels = {"text": TEXT, "spans": [{"type": "品牌", "start": 0, "end": 2}, {"type": "型号", "start": 0, "end": 7}]}
    duplicate = {"text": TEXT, "spans": [{"type": "品牌", "start": 0, "end": 2}] * 2}
    overlap = {"text": TEXT, "spans": [{"type": "品牌", "start": 0, "end": 2}, {"type": "品牌", "start": 1, "end": 7}]}
    result = load(tmp_path, [two_labels, duplicate, overlap])
    assert result.report.counts == {"overlapping_spans": 1}
    assert [len(s) for s in spans_of(result)] == [2, 1]


def test_token_tags_bio_and_bioes_names_and_ids(tmp_path):
    chars = list("华为手机黑色")
    bio = {"tokens": chars, "ner_tags": ["B-品牌", "I-品牌", "O", "O", "B-颜色", "I-颜色"]}
    bioes = {"tokens": chars, "ner_tags": ["B-品牌", "E-品牌", "O", "O", "B-颜色", "E-颜色"]}
    words = {"tokens": ["Apple", "iPhone", "black"], "ner_tags": [1, 0, 3]}
    names = ["O", "S-品牌", "I-品牌", "S-颜色"]
    result = load(tmp_path, [bio, bioes, words], label_map={"ner_tags": names})
    want = [["品牌", 0, 2, "华为"], ["颜色", 4, 6, "黑色"]]
    assert spans_of(result) == [want, want, [["品牌", 0, 5, "Apple"], ["颜色", 13, 18, "black"]]]
    assert [r["text"] for r in result.records] == ["华为手机黑色", "华为手机黑色", "Apple iPhone black"]
    assert tokens_text(["a", "b"]) == ("ab", [0, 1])


@pytest.mark.parametrize("tags,why", [
    (["I-品牌", "I-品牌", "O", "O"], "at the start"),          # I- without B-
    (["B-品牌", "I-颜色", "O", "O"], "after B-品牌"),          # I- of another type
    (["B-品牌", "O", "O"], "3 tags for 4 tokens"),
    (["B-品牌", "I-品牌", "X-品牌", "O"], "not O or"),
    (["B-品牌", "O", "S-颜色", "O"], "O before"),              # BIOES: B- never ended with E-
    ([1, 0, 0, 0], "without tag names"),
])
def test_malformed_tag_sequences_are_counted(tmp_path, tags, why):
    report = load(tmp_path, [{"tokens": list("华为手机"), "ner_tags": tags}, {"text": "好", "sentiment": "positive"}],
                  ).report
    assert report.counts == {"malformed_tags": 1} and why in report.first_issue["malformed_tags"].detail


def test_hf_dataset_with_classlabel_tags_needs_no_names(tmp_path):
    names = ["O", "B-BRAND", "I-BRAND"]
    features = Features({"tokens": Sequence(Value("string")), "ner_tags": Sequence(ClassLabel(names=names))})
    Dataset.from_dict({"tokens": [list("华为手机")], "ner_tags": [[1, 2, 0, 0]]}, features=features).save_to_disk(
        str(tmp_path / "hf"))
    result = load_records(tmp_path / "hf", task="nlu", label_map={"spans": {"BRAND": "品牌"}})
    assert spans_of(result) == [[["品牌", 0, 2, "华为"]]]


def test_bad_fraction_stops_the_build_with_the_report(tmp_path, tok):
    bad = {"tokens": list("华为"), "ner_tags": ["I-品牌", "O"]}
    path = write_jsonl([SPAN_ROW] * 8 + [bad] * 2, tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=r"malformed_tags 2.*20.0% of the rows, above max_bad_fraction=0.05"):
        build_datasets(str(path), seed=0, task="nlu", tokenizer=tok, max_length=64)


def test_catalog_spans_cover_brand_and_first_spec_value():
    for record in generate_catalog(300, seed=2):
        spans = catalog_spans(record)
        title = record["title"]
        assert [label for label, *_ in spans][0] == "品牌" and len(spans) == 2
        assert title[spans[0][1]:spans[0][2]] == record["brand"]
        key, value = record["spec"].split(";")[0].split(":", 1)
        assert spans[1][0] == key and title[spans[1][1]:spans[1][2]] == value and key in SPAN_LABELS


def test_build_exposes_eval_examples_train_spans_and_trains_prompt_to_answer(tmp_path, tok):
    rows = [{"text": f"{b}手机 {c}", "spans": [{"type": "品牌", "term": b, "start": 0, "end": len(b)},
                                              {"type": "颜色", "term": c, "start": len(b) + 3,
                                               "end": len(b) + 3 + len(c)}]}
            for b, c in [("华为", "黑色"), ("小米", "白色"), ("荣耀", "蓝色"), ("OPPO", "金色")] * 10]
    rows += [{"text": "今天天气很好", "spans": []}] * 4                              # no spans: answers 无
    rows += [{"prompt": "把下面的话翻译成英文\n你好", "response": "hello"}] * 2       # untouched in every format
    path = write_jsonl(rows, tmp_path / "ner.jsonl")
    train, evald, eval_records, report = build_datasets(str(path), seed=0, task="nlu", tokenizer=tok,
                                                        max_length=64, eval_fraction=0.2, labels=["颜色", "品牌"])
    assert report.labels["extract"] == ("颜色", "品牌") and report.prompt_format == "seqgpt"
    assert report.examples_per_kind == {"extract": 44, "instruction": 2}
    assert len(report.eval_examples) == sum(1 for r in eval_records if r["prompt"] is None)
    assert all(ex.kind == KIND_EXTRACT and ex.labels == ("颜色", "品牌") for ex in report.eval_examples)
    train_records = 46 - len(eval_records)
    assert sum(report.train_spans.values()) == 2 * sum(1 for r in rows[:40]) - 2 * sum(
        1 for r in eval_records if r["spans"] and spans_from_json(r["spans"]))
    assert set(report.train_spans) <= {("品牌", b) for b in ("华为", "小米", "荣耀", "OPPO")} | {
        ("颜色", c) for c in ("黑色", "白色", "蓝色", "金色")} and train_records == report.n_train_records
    # the loss is on the answer only, and the answer is the seqgpt one
    prompt, answer = prompt_and_answer("seqgpt", report.eval_examples[0])
    first = evald[0]
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert first["labels"][:len(ids)] == [IGNORE_INDEX] * len(ids)
    assert tok.decode([t for t in first["labels"] if t != IGNORE_INDEX], skip_special_tokens=True) == answer
    # --labels leaves spans of other labels out, and says how many
    *_, narrow = build_datasets(str(path), seed=0, task="nlu", tokenizer=tok, max_length=64, labels=["品牌"])
    assert narrow.spans_outside_labels == {"颜色": 40} and "颜色 40" in narrow.summary()


def test_instruction_rows_are_untouched_in_every_format():
    record = {"prompt": "问:1+1=?\n答:", "response": "2", "category": "手机", "title": "x"}
    for fmt in ("seqgpt", "ecomgpt", "ecomkit"):
        (ex,) = task_examples(record, "nlu", {}, fmt)
        assert (ex.task, ex.prompt, ex.answer) == ("instruction", "问:1+1=?\n答:", "2")


def test_eval_data_replaces_the_split_with_the_same_maps(tmp_path, tok):
    train_rows = [{"text": TEXT, "label": {"brand": {"华为": [[0, 1]]}}}] * 20
    dev_rows = [{"text": "小米手机", "label": {"brand": {"小米": [[0, 1]]}}}] * 3 + [{"text": "x", "label": {"brand": {
        "y": [[0, 0]]}}}]
    train_path, dev_path = write_jsonl(train_rows, tmp_path / "t.jsonl"), write_jsonl(dev_rows, tmp_path / "d.jsonl")
    *_, report = build_datasets(str(train_path), seed=0, task="nlu", tokenizer=tok, max_length=64,
                                eval_data=str(dev_path), label_map={"spans": {"brand": "品牌"}}, max_bad_fraction=0.3)
    assert (report.n_train_records, report.n_eval_records) == (20, 3)
    assert report.eval_validation.counts == {"span_offsets": 1} and "d.jsonl: kept 3 of 4" in report.summary()
    assert [ex.gold_spans for ex in report.eval_examples] == [(("品牌", "小米"),)] * 3
    assert report.train_spans == Counter({("品牌", "华为"): 20})
    assert report.facts()["eval_source"] == str(dev_path)


def test_synthetic_nlu_in_seqgpt_has_classification_and_extraction(tok):
    *_, report = build_datasets("synthetic", n_rows=200, seed=1, task="nlu", tokenizer=tok, max_length=128)
    assert report.examples_per_kind == {"category": 200, "sentiment": 200, "extract": 200}
    kinds = Counter(ex.kind for ex in report.eval_examples)
    assert kinds == {KIND_CLASSIFY: 2 * report.n_eval_records, KIND_EXTRACT: report.n_eval_records}
    assert report.labels["extract"] == SPAN_LABELS


def test_task_file_round_trip_and_labels_flag(tmp_path):
    assert parse_labels("品牌, 颜色，尺码") == ("品牌", "颜色", "尺码") and parse_labels("") == ()
    assert read_task_file(tmp_path) is None
    write_task_file(tmp_path, prompt_format="ecomgpt", task="nlu", labels={"extract": ("品牌",)}, kinds=["extract"])
    assert read_task_file(tmp_path) == {"prompt_format": "ecomgpt", "task": "nlu", "labels": {"extract": ["品牌"]},
                                        "kinds": ["extract"]}
    (tmp_path / "ecomkit_task.json").write_text('{"prompt_format": "alpaca"}')
    with pytest.raises(DataError, match="not a valid ecomkit task file"):
        read_task_file(tmp_path)


def test_classification_example_from_task_example_fields():
    ex = TaskExample(KIND_CLASSIFY, "很好用", ("正面", "负面"), gold_label="正面")
    assert prompt_and_answer("seqgpt", ex) == ("输入: 很好用\n分类: 正面，负面\n输出: [GEN]", "正面")


def test_config_fields_and_their_checks(tmp_path):
    from ecomkit.config import parse_config
    from ecomkit.errors import ConfigError
    dev = write_jsonl([SPAN_ROW], tmp_path / "dev.jsonl")
    cfg, _ = parse_config(["--task", "nlu", "--prompt-format", "ecomgpt", "--labels", "品牌,颜色", "--eval-data",
                           str(dev), "--span-end", "inclusive", "--label-map", '{"ner_tags": ["O", "B-X", "I-X"]}'])
    assert (cfg.prompt_format, cfg.labels, cfg.eval_data, cfg.span_end) == ("ecomgpt", "品牌,颜色", str(dev),
                                                                            "inclusive")
    assert parse_config([])[0].prompt_format == "seqgpt"
    for bad, match in ((["--prompt-format", "alpaca"], "prompt_format"), (["--span-end", "closed"], "span_end"),
                       (["--labels", "品牌,,颜色"], "labels"), (["--labels", "品牌,品牌"], "labels"),
                       (["--eval-data", str(tmp_path / "missing.jsonl")], "Eval file")):
        with pytest.raises((ConfigError, SystemExit), match=match if "--labels" in bad or "--eval-data" in bad
                           else None):
            parse_config(bad)


def test_seqgpt_truncation_keeps_the_label_line(tok):
    from ecomkit.data.formats import build_prompt, input_span
    from ecomkit.data.prompt_ids import encode_prompt_answer
    text = "物流很快，" * 60
    prompt = build_prompt("seqgpt", KIND_CLASSIFY, text, ["positive", "negative"])
    start, end = input_span(prompt)
    assert prompt[start:end] == text and prompt[end:] == "\n分类: positive，negative\n输出: [GEN]"
    assert input_span("用户自己的提示\n答:") == (0, len("用户自己的提示\n答:"))   # a user's own prompt: all input
    ids, labels = encode_prompt_answer(tok, prompt, "positive", max_length=48)
    kept = tok.decode([i for i, label in zip(ids, labels) if label == IGNORE_INDEX])
    assert len(ids) == 48 and kept.startswith("输入: 物流") and kept.endswith("\n分类: positive，negative\n输出: [GEN]")


def test_extraction_rows_are_span_lists_that_load_whole(tmp_path):
    from ecomkit.data.toy_tasks import extraction_rows
    rows = extraction_rows(120, seed=4)
    result = load(tmp_path, rows)          # the loader checks every term against its offsets
    assert result.report.kept == 120 and all(len(json.loads(r["spans"])) == 2 for r in result.records)
    catalog = generate_catalog(120, seed=4)
    assert [row["text"] for row in extraction_rows(120, seed=4, distractors=0)] == [r["title"] for r in catalog]
    # distractors: a compatible brand and another value of the attribute, seen in training as spans, not spans here
    with_distractor = [row for row in rows if " 兼容" in row["text"] or " for " in row["text"]]
    assert 60 < len(with_distractor) < 110 and all(row["text"].startswith(r["title"]) for row, r in zip(rows, catalog))
    made_up = {row["spans"][0]["term"] for row in extraction_rows(120, seed=4, new_brands=True)}
    assert len(made_up) > 100 and not made_up & {r["brand"] for r in catalog}    # brands a dictionary has not seen


def test_csv_cells_hold_spans_and_tags_as_json(tmp_path):
    from ecomkit.data import write_csv
    rows = [{"text": TEXT, "spans": json.dumps(SPAN_ROW["spans"], ensure_ascii=False)},
            {"tokens": json.dumps(list("华为")), "ner_tags": json.dumps(["B-品牌", "I-品牌"], ensure_ascii=False)},
            {"text": "好评", "spans": ""},                          # an empty cell: no spans, a plain text row
            {"text": TEXT, "spans": "[{bad json"}]
    result = load_records(write_csv(rows, tmp_path / "s.csv", fields=["text", "spans", "tokens", "ner_tags"]),
                          task="nlu", max_chars=4096)
    assert [json.loads(r["spans"]) for r in result.records[:2]] == [WANT, [["品牌", 0, 2, "华为"]]]
    assert result.records[2] == {"text": "好评"}
    assert result.report.counts == {"span_offsets": 1} and "not JSON" in result.report.first_issue["span_offsets"].detail
