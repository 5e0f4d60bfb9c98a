"""Task formats, tokenization (loss masks), the collator and build_datasets."""

import functools

import pytest
import torch
from torch.utils.data import DataLoader

from ecomkit.data import (
    CATEGORY_LABELS,
    SENTIMENT_LABELS,
    DistributedBatchSampler,
    build_classification_example,
    build_prompt,
    build_datasets,
    build_nlu_examples,
    category_labels_for,
    encode_prompt_answer,
    format_lm_text,
    generate_catalog,
    pad_collate,
    tokenize_records,
    write_jsonl,
)
from ecomkit.data.tokenize import IGNORE_INDEX
from ecomkit.errors import ConfigError, DataError
from ecomkit.models.tokenizer import get_tokenizer

RECORD = {"sku": "SKU-000001", "category": "手机", "brand": "星驰", "title": "星驰® 旗舰智能手机 256GB SKU-000001",
          "price": 2999.0, "spec": "颜色:黑色; 容量:256GB", "review": "太棒了!物流三天到货。", "sentiment": "positive"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return get_tokenizer("synthetic", tmp_path_factory.mktemp("tok"), n_rows=1500)


@pytest.fixture(scope="module")
def records():
    return generate_catalog(200, seed=11)


def test_lm_text_format():
    assert format_lm_text(RECORD) == ("商品:星驰® 旗舰智能手机 256GB SKU-000001 价格:2999.00 "
                                      "规格:颜色:黑色; 容量:256GB 评论:太棒了!物流三天到货。")


def test_nlu_examples_per_available_field():
    examples = build_nlu_examples(RECORD)
    assert [e.task for e in examples] == ["category", "sentiment", "brand", "price"]
    assert [e.answer for e in examples] == ["手机", "positive", "星驰", "2999.00"]
    assert all(e.prompt.endswith("答:") and e.answer not in e.prompt.split("\n")[0] for e in examples)
    minimal = {"title": "UrbanFit® 纯棉T恤", "price": 99.0}
    assert [e.task for e in build_nlu_examples(minimal)] == ["price"]


def test_classification_example_candidates_and_index():
    ex = build_classification_example(RECORD, "category")
    assert ex.candidates == CATEGORY_LABELS and ex.candidates[ex.correct_index] == "手机"
    ex = build_classification_example({**RECORD, "sentiment": "negative"}, "sentiment")
    assert ex.candidates == SENTIMENT_LABELS and ex.correct_index == 2
    assert ex == build_classification_example({**RECORD, "sentiment": "negative"}, "sentiment")
    with pytest.raises(DataError, match="category_labels_for"):
        build_classification_example({**RECORD, "category": "汽车"}, "category")
    with pytest.raises(ConfigError):
        build_classification_example(RECORD, "brand")


def test_category_labels_for_user_categories():
    assert category_labels_for([RECORD]) == ("手机",)   # the labels the data has, in the built-in order
    assert category_labels_for([{**RECORD, "category": "服饰"}, RECORD]) == ("手机", "服饰")
    assert category_labels_for([{**RECORD, "category": "汽车"}, RECORD]) == ("手机", "汽车")


def test_lm_documents_become_windows_never_truncated(tok, records):
    ds = tokenize_records(records, tok, "lm", max_length=64, keep_kind=True)
    assert ds.column_names == ["input_ids", "labels", "length", "polarity", "kind", "record"]
    polarity = {"positive": 1, "neutral": 0, "negative": -1}
    by_record: dict[int, list[list[int]]] = {}
    for row in ds:
        assert row["labels"] == row["input_ids"]
        assert row["length"] == len(row["input_ids"]) <= 64
        assert row["polarity"] == polarity[records[row["record"]]["sentiment"]]
        by_record.setdefault(row["record"], []).append(row["input_ids"])
    assert sorted(by_record) == list(range(len(records)))
    windowed = 0
    for i, windows in by_record.items():
        full = tok(format_lm_text(records[i]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        # consecutive windows overlap by one id, so every id after the first is predicted exactly once
        assert windows[0] + [t for w in windows[1:] for t in w[1:]] == full
        assert all(w[0] == prev[-1] for prev, w in zip(windows, windows[1:]))
        windowed += len(windows) > 1
    assert windowed > 0   # some documents were longer than 64 tokens


def test_nlu_loss_only_on_answer_tokens(tok, records):
    ds = tokenize_records(records[:20], tok, "nlu", max_length=512)
    examples = [e for r in records[:20] for e in build_nlu_examples(r)]
    assert len(ds) == len(examples)
    assert ds["polarity"] == [{"positive": 1, "neutral": 0, "negative": -1}[r["sentiment"]]
                              for r in records[:20] for _ in build_nlu_examples(r)]
    for row, ex in zip(ds, examples):
        prompt = tok(ex.prompt, add_special_tokens=False)["input_ids"]
        answer = tok(ex.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert row["input_ids"] == prompt + answer
        assert row["labels"] == [IGNORE_INDEX] * len(prompt) + answer
        assert tok.decode([t for t in row["labels"] if t != IGNORE_INDEX], skip_special_tokens=True) == ex.answer


def test_nlu_cut_keeps_instruction_labels_and_cue_and_drops_the_end_of_the_input(tok):
    long = {**RECORD, "review": "太棒了!" + "物流三天到货。" * 100}
    prompt = build_prompt("seqgpt", "classify", long["review"], ["positive", "negative"])
    ids, labels = encode_prompt_answer(tok, prompt, "positive", max_length=48)
    n_answer = sum(label != IGNORE_INDEX for label in labels)
    text = tok.decode(ids[:-n_answer])
    assert len(ids) == 48 and ids[-1] == tok.eos_token_id
    assert tok.decode(ids[-n_answer:-1]) == "positive"
    assert text.startswith("输入: 太棒了!物流")             # the input's start is kept ...
    assert text.endswith("\n分类: positive，negative\n输出: [GEN]")   # ... and the label line and cue whole
    assert "物流三天到货。" * 20 not in text                # its end went


def test_multi_process_tokenization_matches_single(tok, records):
    one = tokenize_records(records, tok, "nlu", 128, num_proc=1)
    two = tokenize_records(records, tok, "nlu", 128, num_proc=2)
    assert one["input_ids"] == two["input_ids"] and one["labels"] == two["labels"]


def test_pad_collate_right_pads_with_masks():
    batch = pad_collate([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}],
                        pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert "polarity" not in batch
    assert pad_collate([{"input_ids": [1], "labels": [1]}], pad_id=0, pad_to_multiple_of=8)["input_ids"].shape == (1, 8)
    with_polarity = pad_collate([{"input_ids": [1], "labels": [1], "polarity": -1},
                                 {"input_ids": [1, 2], "labels": [1, 2], "polarity": 0}], pad_id=0)
    assert with_polarity["polarity"].tolist() == [-1, 0]


def test_no_polarity_column_without_sentiment(tok):
    records = [{k: v for k, v in RECORD.items() if k != "sentiment"}, RECORD]
    assert tokenize_records(records, tok, "lm", 64).column_names == ["input_ids", "labels", "length"]


def test_dataloader_with_sampler_and_collate(tok, records):
    ds = tokenize_records(records, tok, "lm", 128)
    sampler = DistributedBatchSampler(ds["length"], micro_batch_size=4, grad_accum=2, num_replicas=2, rank=1, seed=0)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=functools.partial(pad_collate, pad_id=tok.pad_token_id))
    batches = list(loader)
    assert len(batches) == len(sampler) == (len(ds) // 16) * 2
    for batch in batches:
        assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].dtype == torch.long
        assert (batch["attention_mask"].sum(1) == batch["input_ids"].ne(tok.pad_token_id).sum(1)).all()
        assert batch["polarity"].shape == (4,)


def test_tokenize_argument_errors(tok, records):
    with pytest.raises(ConfigError, match="task"):
        tokenize_records(records, tok, "chat", 64)
    with pytest.raises(ConfigError, match="max_length"):
        tokenize_records(records, tok, "lm", 8)


def test_build_datasets_synthetic_split_is_deterministic(tok):
    train, evald, raw_eval, report = build_datasets("synthetic", n_rows=300, seed=4, task="nlu", tokenizer=tok,
                                                    max_length=256, eval_fraction=0.1)
    assert (report.n_train_records, report.n_eval_records) == (270, 30) and len(raw_eval) == 30
    assert len(train) == report.n_train_examples >= 270 * 2
    assert report.category_labels == CATEGORY_LABELS and "kept 300 of 300" in report.summary()
    again = build_datasets("synthetic", n_rows=300, seed=4, task="nlu", tokenizer=tok, max_length=256,
                           eval_fraction=0.1)
    assert again[2].to_list() == raw_eval.to_list() and again[1]["input_ids"] == evald["input_ids"]
    other = build_datasets("synthetic", n_rows=300, seed=5, task="nlu", tokenizer=tok, max_length=256,
                           eval_fraction=0.1)
    assert [r["sku"] for r in other[2]] != [r["sku"] for r in raw_eval]


def test_build_datasets_from_file_with_cap(tok, tmp_path, records):
    path = write_jsonl(records + [{**RECORD, "price": "free"}], tmp_path / "d.jsonl")
    train, evald, raw_eval, report = build_datasets(str(path), max_rows=100, seed=0, task="lm", tokenizer=tok,
                                                    max_length=128)
    assert (report.n_train_records, report.n_eval_records) == (95, 5)
    assert len(train) >= 95 and len(evald) >= 5     # documents longer than 128 tokens become several windows
    assert report.validation.counts == {"non_numeric_price": 1}
    assert {r["sku"] for r in raw_eval} <= {r["sku"] for r in records}
    assert "Capped by max_rows=100: using 100 of 200 valid records" in report.summary()
    with pytest.raises(ConfigError, match="--n-rows 100 sets the size of the synthetic catalog.*--max-rows"):
        build_datasets(str(path), n_rows=100, seed=0, task="lm", tokenizer=tok, max_length=128)
    with pytest.raises(DataError, match="not found"):
        build_datasets(str(tmp_path / "missing.csv"), n_rows=None, seed=0, task="lm", tokenizer=tok, max_length=64)
    with pytest.raises(ConfigError, match="eval_fraction"):
        build_datasets("synthetic", n_rows=200, seed=0, task="lm", tokenizer=tok, max_length=64, eval_fraction=1.0)
