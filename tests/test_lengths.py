"""Lengths measured before training: --seq-len auto, cuts at the end of the input, counted; LM windows; the budget."""

from __future__ import annotations

import re

import json
import os
from pathlib import Path

import pytest

from ecomkit.config import parse_config
from ecomkit.data import build_datasets, write_jsonl
from ecomkit.dist import log
from ecomkit.data.formats import build_prompt
from ecomkit.data.lengths import (GEN_BUDGET_MARGIN, CutCounts, LengthStats, choose_seq_len, generation_budget,
                                  limit_warning, reached_limit)
from ecomkit.data.prompt_ids import PromptIds, cut_prompt, fit_prompt_answer
from ecomkit.data.tokenize import IGNORE_INDEX, lm_windows
from ecomkit.errors import ConfigError
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.train.loop import run_training

# Twelve extraction labels, as SeqGPT's NER prompts list them (10-26 types in its data)
LABELS = ["品牌", "颜色", "尺码", "材质", "产地", "型号", "容量", "功率", "净含量", "适用人群", "风格", "款式"]
FILLER = "这款商品做工精细，包装完好，物流很快，客服态度也很好，用了一周感觉质量不错，推荐购买。"


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("local", Path(os.environ["ECOMKIT_CACHE"]))


def ner_rows(n: int = 60) -> list[dict]:
    """Long review-like texts with spans of a few of the twelve labels: SeqGPT-format prompts of 200+ tokens."""
    brands, colours = ["华为", "小米", "苹果", "联想"], ["黑色", "白色", "红色"]
    rows = []
    for i in range(n):
        head = f"{brands[i % 4]}手机 {colours[i % 3]} "
        text = head + FILLER * (2 + i % 3)
        spans = [{"label": "品牌", "start": 0, "end": 2, "term": brands[i % 4]},
                 {"label": "颜色", "start": len(brands[i % 4]) + 3, "end": len(brands[i % 4]) + 5,
                  "term": colours[i % 3]}]
        rows.append({"text": text, "spans": spans})
    return rows


def build(path, tok, max_length, **kwargs):
    return build_datasets(str(path), seed=0, task="nlu", tokenizer=tok, max_length=max_length,
                          labels=LABELS, **kwargs)


# ---------------------------------------------------------------------- the rules, unit by unit
def test_seq_len_auto_is_the_smallest_multiple_of_64_holding_every_row_up_to_the_limit():
    assert choose_seq_len("auto", 201, 2048)[0] == 256
    assert choose_seq_len("auto", 256, 2048)[0] == 256 and choose_seq_len("auto", 257, 2048)[0] == 320
    assert choose_seq_len("auto", 3, 2048)[0] == 64
    limit, why = choose_seq_len("auto", 5000, 2048)
    assert limit == 2048 and "model's limit 2048" in why and "5000" in why
    assert choose_seq_len(128, 5000, 2048) == (128, "--seq-len 128 as given")


def test_cut_takes_the_end_of_the_input_first_then_around_it():
    prompt = PromptIds(list(range(100, 130)), 3, 25)        # head 3 ids, input 22, tail 5
    ids, cut = cut_prompt(prompt, 20)
    assert ids == list(range(100, 115)) + list(range(125, 130)) and cut.input == 10 and cut.other == 0
    ids, cut = cut_prompt(prompt, 6)                         # the input is gone; then the instruction's end
    assert cut.input == 22 and cut.other == 2 and ids == [100] + list(range(125, 130))


def test_the_answer_stays_whole_while_the_prompt_can_give_way_the_cue_last():
    prompt = PromptIds(list(range(100, 130)), 3, 25)        # head 3 ids, input 22, tail 5
    ids, labels, cut = fit_prompt_answer(prompt, list(range(1, 15)), 9, 20)   # answer 14 + EOS
    assert len(ids) == 20 and cut.input == 22 and cut.answer == 0 and cut.other == 3
    assert ids[:6] == [125, 126, 127, 128, 129, 1] and labels[:5] == [IGNORE_INDEX] * 5   # the head went; the tail stays
    ids, labels, cut = fit_prompt_answer(prompt, list(range(1, 30)), 9, 20)   # an answer longer than the row
    assert len(ids) == 20 and cut.answer == 11 and ids[0] == 129 and labels[0] == IGNORE_INDEX
    ids, labels, cut = fit_prompt_answer(prompt, [1, 2, 3], 9, 40)       # fits: unchanged
    assert ids == list(range(100, 130)) + [1, 2, 3, 9] and cut.total == 0


def test_lm_windows_overlap_by_one_and_keep_every_token():
    assert lm_windows(list(range(10)), 4) == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert lm_windows(list(range(4)), 4) == [[0, 1, 2, 3]]
    assert lm_windows(list(range(5)), 4) == [[0, 1, 2, 3], [3, 4]]


def test_generation_budget_auto_is_the_longest_training_answer_plus_a_margin():
    assert generation_budget("auto", LengthStats(longest_answer=37)) == (
        37 + GEN_BUDGET_MARGIN, f"auto: the longest training answer (37 tokens with its EOS) + {GEN_BUDGET_MARGIN}")
    assert generation_budget(12, LengthStats())[0] == 12
    with pytest.raises(ConfigError, match="--gen-max-new-tokens N"):
        generation_budget("auto", LengthStats())


def test_cut_counts_say_what_was_cut_and_warn_with_the_flag():
    counts = CutCounts(seq_len=128, rows_cut=5, tokens_dropped=300, input_tokens_dropped=290, answer_tokens_dropped=10,
                       inputs_over_half_cut=4)
    assert counts.text() == "5 rows cut to 128 tokens, 300 tokens dropped (input 290, answer 10, prompt 0)"
    assert counts.warning("train", 50) == ("4 of 50 train rows lost more than half of their input text to --seq-len "
                                           "128. --seq-len auto (the default) fits every row; or give a larger --seq-len.")
    assert CutCounts(128).text() == "nothing cut" and CutCounts(128).warning("eval", 9) is None


# ---------------------------------------------------------------------- a SeqGPT-format extraction file
def test_long_seqgpt_prompts_with_twelve_labels_are_never_cut_by_default(tmp_path, tok):
    path = write_jsonl(ner_rows(), tmp_path / "ner.jsonl")
    train, evald, _, report = build(path, tok, "auto")
    assert report.lengths["train"].prompt.max >= 200 and report.lengths["train"].prompted_rows == report.lengths["train"].rows
    longest = max(s.row.max for s in report.lengths.values())
    assert report.seq_len == -(-longest // 64) * 64 and report.seq_len >= 256
    assert all(c.rows_cut == 0 and c.tokens_dropped == 0 for c in report.cuts.values())
    assert max(train["length"]) == report.lengths["train"].row.max       # rows whole
    summary = report.summary()
    assert f"seq_len {report.seq_len} (auto: the smallest multiple of 64" in summary
    assert f"row {report.lengths['train'].row.text()}" in summary and "nothing cut" in summary
    facts = json.loads(json.dumps(report.facts()))
    assert facts["cuts"]["train"]["rows_cut"] == 0 and facts["lengths"]["train"]["prompt"]["max"] >= 200


def test_a_small_seq_len_counts_its_cuts_per_split_and_keeps_labels_and_cue(tmp_path, tok):
    path = write_jsonl(ner_rows(), tmp_path / "ner.jsonl")
    train, evald, _, report = build(path, tok, 128)
    cut = report.cuts["train"]
    assert cut.rows_cut == report.lengths["train"].rows and cut.tokens_dropped == cut.input_tokens_dropped > 0
    assert report.cuts["eval"].rows_cut == report.lengths["eval"].rows
    assert max(train["length"]) <= 128 and max(evald["length"]) <= 128
    row = train[0]
    prompt = tok.decode([i for i, y in zip(row["input_ids"], row["labels"]) if y == IGNORE_INDEX])
    assert prompt.startswith("输入: ") and prompt.endswith(f"\n抽取: {'，'.join(LABELS)}\n输出: [GEN]")
    warnings = report.cut_warnings()
    assert len(warnings) == 2 and warnings[0].startswith(f"{cut.inputs_over_half_cut} of {report.lengths['train'].rows} "
                                                         "train rows lost more than half of their input text")
    assert "--seq-len auto" in warnings[0] and "rows cut to 128 tokens" in report.summary()


def test_prompts_cut_for_decoding_keep_the_label_line(tok):
    from ecomkit.train.generate import DecodeSettings, encode_prompts
    long = build_prompt("seqgpt", "extract", FILLER * 10, LABELS)
    short = build_prompt("seqgpt", "extract", "华为手机", LABELS)
    ids, cut = encode_prompts(tok, [long, short], DecodeSettings(max_length=128))
    assert cut == 1 and len(ids[0]) == 127 and ids[1] == tok(short, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids[0]).endswith(f"\n抽取: {'，'.join(LABELS)}\n输出: [GEN]")


def test_an_extraction_file_trains_with_default_flags_and_no_input_cut(tmp_path, tok, caplog):
    """The acceptance run: SeqGPT-format prompts of 200+ tokens and twelve labels, only --data and --labels given
    (and a short run): the data line shows the lengths and the chosen seq_len, and summary.json counts no cut."""
    path = write_jsonl(ner_rows(), tmp_path / "ner.jsonl")
    cfg, _ = parse_config(["--task", "nlu", "--data", str(path), "--labels", ",".join(LABELS), "--max-steps", "2",
                           "--eval-interval", "0", "--final-eval-samples", "4", "--no-save-model", "--no-progress",
                           "--report-to", "none", "--output-dir", str(tmp_path / "run")])
    log.addHandler(caplog.handler)      # ecomkit's logger does not propagate; its stream may predate this test
    try:
        summary = run_training(cfg)
    finally:
        log.removeHandler(caplog.handler)
    data = summary["data"]
    assert data["lengths"]["train"]["prompt"]["max"] >= 200 and summary["seq_len"] >= 256
    assert data["seq_len_reason"].startswith("auto: the smallest multiple of 64 that holds every row")
    assert all(c["rows_cut"] == 0 and c["input_tokens_dropped"] == 0 for c in data["cuts"].values())
    report = next(r.getMessage() for r in caplog.records if "***** Running training *****" in r.getMessage())
    assert re.search(rf"\n  seq_len +{summary['seq_len']} +auto: holds every row", report), report   # rank 0's
    lengths = next(line for line in report.splitlines() if line.startswith("  lengths "))
    assert "tokens p50/p95/max: row" in lengths and "nothing cut" in lengths, lengths


# ---------------------------------------------------------------------- --seq-len auto at the model's limit
def test_auto_at_the_limit_says_so_and_gives_the_real_options_not_seq_len_auto():
    """Issue 49 item 5: auto stopped at the model's limit, cut 31 rows, and the warning advised --seq-len auto."""
    assert not reached_limit("auto", 2000, 2048) and not reached_limit(128, 5000, 2048)
    assert reached_limit("auto", 2049, 2048)
    assert choose_seq_len("auto", 1990, 2000) == (2000, "auto: the model's limit 2000, which holds every row "
                                                        "(longest 1990)")
    cuts = {"train": CutCounts(2048, rows_cut=31, tokens_dropped=900, input_tokens_dropped=900,
                               inputs_over_half_cut=2), "eval": CutCounts(2048, rows_cut=3)}
    stats = {"train": LengthStats(rows=59_000), "eval": LengthStats(rows=3_100)}
    line = limit_warning(2048, cuts, stats)
    assert line.startswith("--seq-len auto reached the model's limit 2048: 31 of 59,000 train rows and 3 of 3,100 "
                           "eval rows are longer and were cut at the end of their input text (2 of them lost more "
                           "than half of their input), the head kept (instruction, label list, answer cue)")
    assert "cannot be split into LM-style windows" in line and "--seq-len N above 2048" in line
    assert "config.json seq_length" in line and "--seq-len auto (the default)" not in line
    assert limit_warning(2048, {"train": CutCounts(2048), "eval": CutCounts(2048)}, stats) is None


def review_rows(n: int = 80, long_every: int = 10) -> list[dict]:
    """Reviews with a category and a sentiment; every ``long_every``-th one far longer than the rest."""
    cats = ["手机", "服装", "食品"]
    return [{"category": cats[i % 3], "sentiment": "positive" if i % 2 else "negative",
             "review": f"{cats[i % 3]} 第{i}条 " + FILLER * (8 if i % long_every == 0 else 1)} for i in range(n)]


def test_a_model_with_a_low_limit_cuts_long_reviews_and_says_what_to_do(tmp_path, tok, caplog):
    """A saved model whose config allows 128 tokens (--model <folder>): --seq-len auto stops there, the long
    reviews are cut at the end of their input and counted per split, and the one warning line says what happened
    and the real options, instead of advising the --seq-len auto that was in use."""
    from ecomkit.models.bloom import build_model, model_length_limit

    model_dir = tmp_path / "low-limit"
    model = build_model("tiny", vocab_size=len(tok), seed=0)
    model.config.seq_length = 128
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    assert model_length_limit(str(model_dir)) == 128
    path = write_jsonl(review_rows(), tmp_path / "reviews.jsonl")
    cfg, _ = parse_config(["--task", "nlu", "--data", str(path), "--model", str(model_dir), "--max-steps", "1",
                           "--eval-interval", "0", "--final-eval-samples", "2", "--gen-eval-samples", "0",
                           "--no-save-model", "--no-progress", "--report-to", "none", "--output-dir",
                           str(tmp_path / "run")])
    log.addHandler(caplog.handler)
    try:
        summary = run_training(cfg)
    finally:
        log.removeHandler(caplog.handler)
    data = summary["data"]
    assert summary["seq_len"] == 128 and data["seq_len_at_limit"] is True
    assert data["seq_len_reason"].startswith("auto reached the model's limit 128; the longest row has")
    cut = {k: c["rows_cut"] for k, c in data["cuts"].items()}
    assert 0 < cut["train"] < data["lengths"]["train"]["rows"]     # only the long reviews
    messages = [r.getMessage() for r in caplog.records]
    warned = [m for m in messages if m.startswith("--seq-len auto reached the model's limit 128")]
    assert len(set(warned)) == 1, messages   # one line (the handler may see a record twice)
    split_counts = " and ".join(f"{n:,} of {data['lengths'][k]['rows']:,} {k} rows" for k, n in cut.items() if n)
    assert f"128: {split_counts} are longer and were cut at the end of their input text" in warned[0]
    assert "--seq-len N above 128" in warned[0]
    assert not any("--seq-len auto (the default) fits every row" in m for m in messages)
