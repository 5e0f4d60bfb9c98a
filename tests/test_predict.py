"""``python -m ecomkit.predict`` on a saved model: the same prompt, decoding and parser as evaluation.

The model is the tiny preset with larger random weights (answers differ from text to text), saved with the
local tokenizer; what it answers is nonsense, but the test is that predict's answers are exactly what
evaluation's decoding and parser make of the same prompts, and that its input checks are clear.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ecomkit.data.formats import build_prompt, parse_answer
from ecomkit.dist import DistEnv
from ecomkit.errors import DataError
from ecomkit.train.generate import DecodeSettings, generate_texts
from ecomkit.data.formats import TaskExample
from ecomkit.data.task_file import read_task_file, write_task_file
from ecomkit.data.questions import Recorded, command_line_rows, row_items, split_labels
from ecomkit.data.rows import read_rows
from ecomkit.train.predict import Predictor, main, recorded_prompt_format
from ecomlab.plots.tasks import confusion_counts

sys.path.insert(0, str(Path(__file__).parent))
from test_generate import single, tokenizer, varied_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["华为 Mate 60 雅川青 手机", "李宁 运动鞋 白色", "小米 充电宝"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "final"
    tok = tokenizer()
    model = varied_model(len(tok))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out, model, tok


def test_predict_answers_are_evaluations_decoding_and_parser(saved, capsys):
    out, model, tok = saved
    labels = ("品牌", "颜色")
    prompts = [build_prompt("seqgpt", "extract", t, labels) for t in TEXTS]
    texts, _ = generate_texts(single(model), tok, prompts, DistEnv(), DecodeSettings(max_new_tokens=12))
    main(["--model", str(out), "--task", "extract", "--labels", "品牌，颜色", "--max-new-tokens", "12", *TEXTS])
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["generated"] for p in printed] == texts
    for p, text in zip(printed, texts):
        parsed = parse_answer("seqgpt", "extract", text, labels)
        assert {(k, s) for k, spans in p["spans"].items() for s in spans} == set(parsed.spans)


def test_predict_file_in_file_out_with_per_row_task_and_labels(saved, tmp_path):
    out, _, _ = saved
    rows = [{"text": TEXTS[0], "task": "classify", "labels": ["正面", "负面"], "id": 7}, {"text": TEXTS[1]}]
    src, dst = tmp_path / "in.jsonl", tmp_path / "sub" / "out.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "ecomkit.predict", "--model", str(out), "--input", str(src),
                           "--output", str(dst), "--task", "extract", "--labels", "品牌"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = [json.loads(line) for line in dst.read_text(encoding="utf-8").splitlines()]
    assert answers[0]["input"]["id"] == 7 and answers[0]["task"] == "classify" and "label" in answers[0]
    assert answers[1]["labels"] == ["品牌"] and isinstance(answers[1]["spans"], dict)
    assert [a["location"] for a in answers] == ["line 1", "line 2"]
    direct = Predictor(str(out)).predict([TaskExample("classify", TEXTS[0], ("正面", "负面")),
                                          TaskExample("extract", TEXTS[1], ("品牌",))])
    assert [a["generated"] for a in direct] == [a["generated"] for a in answers]


def test_predict_remembers_the_task_labels_length_and_budget_the_run_saved(saved, tmp_path, capsys):
    """Issue #43 item 4: ``--model runs/x/final "…"`` alone. On main it exited with "no task; give --task", and its
    --max-length/--max-new-tokens defaults ignored the run's. Flags still override each."""
    import shutil

    src, model, tok = saved
    out = tmp_path / "final"
    shutil.copytree(src, out)
    write_task_file(out, prompt_format="seqgpt", task="nlu", labels={"extract": ("品牌", "颜色"), "category": ("a", "b")},
                    kinds=["extract"], seq_len=24, gen_max_new_tokens=5)
    prompts = [build_prompt("seqgpt", "extract", t, ("品牌", "颜色")) for t in TEXTS]
    want = generate_texts(single(model), tok, prompts, DistEnv(), DecodeSettings(max_new_tokens=5, max_length=24))[0]
    main(["--model", str(out), *TEXTS])
    captured = capsys.readouterr()
    printed = [json.loads(line) for line in captured.out.splitlines()]
    assert [p["generated"] for p in printed] == want
    stopped = sum(bool(p.get("at_budget")) for p in printed)   # nonsense answers run to the budget
    assert stopped and f"{stopped} of 3 generated answers stopped at the budget of 5 new tokens" in captured.err
    assert "raise it with --gen-max-new-tokens" in captured.err
    longer = generate_texts(single(model), tok, prompts, DistEnv(), DecodeSettings(max_new_tokens=9))[0]
    main(["--model", str(out), "--gen-max-new-tokens", "9", "--seq-len", str(1 << 20), *TEXTS])
    assert [json.loads(line)["generated"] for line in capsys.readouterr().out.splitlines()] == longer
    write_task_file(out, prompt_format="seqgpt", task="nlu", labels={"category": ("a", "b"), "sentiment": ("x", "y")},
                    kinds=["category", "sentiment"])
    main(["--model", str(out), "--labels", "x,y", TEXTS[0]])
    assert json.loads(capsys.readouterr().out)["label"] in ("x", "y", None)


def test_predict_answers_every_target_a_model_learned_one_line_each(saved, tmp_path, capsys):
    """Issue 49 item 7: ``--model runs/mine/final "…"`` on a model that learned category and sentiment exited
    asking for --labels; it answers both, one line per target (and per text), each prompt with that target's
    labels. --task keeps one kind; --labels asks one set; a row's own labels are one question."""
    import shutil

    src, model, tok = saved
    out = tmp_path / "final"
    shutil.copytree(src, out)
    write_task_file(out, prompt_format="seqgpt", task="nlu", kinds=["category", "sentiment", "extract"],
                    labels={"category": ("手机", "服装"), "sentiment": ("正面", "负面"), "extract": ("品牌",)},
                    gen_max_new_tokens=4)
    main(["--model", str(out), *TEXTS[:2]])
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["text"], p["target"]) for p in printed] == [(t, g) for t in TEXTS[:2]
                                                           for g in ("category", "sentiment", "extract")]
    assert all(("label" in p) == (p["target"] != "extract") and ("spans" in p) == (p["target"] == "extract")
               for p in printed)
    recorded = Recorded(read_task_file(out), str(out))

    def asked(raw, task=None, labels=()):
        row = command_line_rows([raw["text"]])[0]
        return row_items(type(row)(row.location, raw, row.record), task, labels, recorded, "x")

    assert [(i.question.example.kind, i.question.example.labels) for i in asked({"text": "a"})] == [
        ("classify", ("手机", "服装")), ("classify", ("正面", "负面")), ("extract", ("品牌",))]
    assert [i.target for i in asked({"text": "a"}, "classify")] == ["category", "sentiment"]
    assert [i.question.example.labels for i in asked({"text": "a", "task": "extract"})] == [("品牌",)]
    one = asked({"text": "a"}, "classify", ("正面", "负面"))
    assert len(one) == 1 and one[0].target == "sentiment"   # a learned label set: that target's input and gold
    with pytest.raises(DataError, match="no task"):
        asked({"text": "a", "task": "summarise"})


def test_input_errors_name_the_place_and_the_fix(saved, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{oops\n', encoding="utf-8")
    rows = read_rows(str(bad)).rows
    assert rows[1].location == "line 2" and rows[1].record is None and "not valid JSON" in rows[1].issue.detail
    row = command_line_rows(["a"])[0]
    with pytest.raises(DataError, match="no labels"):
        row_items(row, "extract", (), Recorded(None), "command line")
    with pytest.raises(DataError, match="no task"):
        row_items(row, None, ("x",), Recorded(None), "command line")
    assert split_labels("品牌, 颜色、尺码") == ("品牌", "颜色", "尺码")
    assert recorded_prompt_format(tmp_path) is None


def test_confusion_counts_put_unreadable_answers_in_their_own_column():
    names, counts = confusion_counts(["a", "b", "b"], ["a", None, "c"])
    assert names == ["a", "b", "c", "(none)"]
    assert counts == [[1, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]]


@pytest.mark.slow
def test_a_model_trained_on_a_review_file_answers_category_and_sentiment_by_default(tmp_path):
    """Issue 49 item 7 end to end: the README's review command (cat,label,review with its --column-map and
    --label-map), trained a few steps, then its predict line as printed: one answer per target, no --labels."""
    from ecomkit.config import parse_config
    from ecomkit.train.loop import run_training

    cats, words = ["手机", "服装", "食品"], {"手机": "屏幕 电池 信号", "服装": "面料 尺码 做工", "食品": "口感 新鲜 包装"}
    lines = ["cat,label,review"] + [f"{cats[i % 3]},{i % 2},{words[cats[i % 3]]} {'很好' if i % 2 else '太差'} {i}"
                                    for i in range(120)]
    data = tmp_path / "reviews.csv"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg, _ = parse_config(["--task", "nlu", "--data", str(data), "--model", "tiny", "--column-map",
                           '{"cat": "category", "label": "sentiment"}', "--label-map",
                           '{"sentiment": {"0": "negative", "1": "positive"}}', "--max-steps", "2",
                           "--eval-interval", "0", "--final-eval-samples", "4", "--no-progress", "--report-to", "none",
                           "--output-dir", str(tmp_path / "run")])
    run_training(cfg)
    proc = subprocess.run([sys.executable, "-m", "ecomkit.predict", "--model", str(tmp_path / "run" / "final"),
                           "华为 Mate 60 屏幕 很好"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [p["target"] for p in printed] == ["category", "sentiment"], printed
    learned = read_task_file(tmp_path / "run" / "final")["labels"]
    assert sorted(learned["category"]) == sorted(cats) and set(learned["sentiment"]) >= {"negative", "positive"}
    assert all(p["label"] is None or p["label"] in learned[p["target"]] for p in printed)
    readme = (REPO / "README.md").read_text(encoding="utf-8")   # the line run above, and what it answers
    assert 'python -m ecomkit.predict --model runs/mine/final "' in readme and "every target the model learned" in readme
    # Issue 56 item 3: the training file itself, with no --column-map: every row, every target, scored. On main
    # predict read JSON Lines only, and stopped at the first row without a 'text' field.
    out = tmp_path / "answers.csv"
    proc = subprocess.run([sys.executable, "-m", "ecomkit.predict", "--model", str(tmp_path / "run" / "final"),
                           "--input", str(data), "--output", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, encoding="utf-8", newline="") as f:
        answers = list(csv.DictReader(f))
    assert [(a["location"], a["target"]) for a in answers] == [(f"line {n}", t) for n in range(2, 122)
                                                               for t in ("category", "sentiment")]
    assert all(a["gold"] and not a.get("error") for a in answers) and answers[0]["input.review"] == lines[1].split(",")[2]
    assert {a["gold"] for a in answers if a["target"] == "sentiment"} == {"negative", "positive"}   # the label map
    scores = json.loads(out.with_suffix(".scores.json").read_text(encoding="utf-8"))
    for target in ("category", "sentiment"):
        right = [a["correct"] == "True" for a in answers if a["target"] == target]
        assert scores[target]["rows"] == 120 and scores[target]["gen_acc"] == pytest.approx(sum(right) / 120)
        assert scores[target]["baseline"].startswith("the run's training labels")
    assert "accuracy" in proc.stderr and "majority baseline" in proc.stderr


REVIEW_ROWS = [{"cat": "手机", "label": "1", "review": "屏幕 电池 很好", "id": "a"},
               {"cat": "手机", "label": "0", "review": "信号 太差", "id": "b"},
               {"cat": "服装", "label": "1", "review": "面料 很好", "id": "c"},
               {"cat": "手机", "label": "2", "review": "电池 一般", "id": "d"},     # a label the map does not know
               {"cat": "家具", "label": "0", "review": "做工 太差", "id": "e"},     # a category the model never learned
               {"cat": "手机", "label": "1", "review": "", "id": "f"}]             # nothing to read: not answerable


def review_model(saved, tmp_path, baselines: bool = True):
    """The saved model with the task file a review run writes: two targets, its column and label maps."""
    import shutil

    out = tmp_path / "final"
    shutil.copytree(saved[0], out)
    counts = {"category": {"手机": 3, "服装": 9}, "sentiment": {"negative": 5, "positive": 4}} if baselines else None
    write_task_file(out, prompt_format="seqgpt", task="nlu", kinds=["category", "sentiment"],
                    labels={"category": ("手机", "服装"), "sentiment": ("negative", "positive")}, gen_max_new_tokens=4,
                    reading={"column_map": {"cat": "category", "label": "sentiment"},
                             "label_map": {"sentiment": {"0": "negative", "1": "positive"}}, "span_end": "exclusive"},
                    train_label_counts=counts, train_spans={} if baselines else None)
    return out


def write_rows_as(rows: list[dict], path: Path, suffix: str) -> Path:
    """``rows`` in each format --data reads: CSV, JSON Lines, a JSON array, a save_to_disk folder, one .arrow file."""
    from ecomkit.data import write_csv, write_hf_dataset, write_jsonl

    if suffix == ".json":
        path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
        return path
    if suffix == ".arrow":
        return next(write_hf_dataset(rows, path.with_suffix("")).glob("*.arrow"))
    return {".csv": write_csv, ".jsonl": write_jsonl, "_dir": write_hf_dataset}[suffix](rows, path)


@pytest.mark.parametrize("suffix,first", [(".csv", "line 2"), (".jsonl", "line 1"), (".json", "item 1"),
                                          ("_dir", "row 1"), (".arrow", "row 1")])
def test_predict_reads_a_file_as_its_run_read_it_and_names_every_row_it_cannot_answer(saved, tmp_path, suffix,
                                                                                        first, capsys):
    """Issue 56 item 3: on main ``--input`` read JSON Lines with a 'text' field only, knew no column map, and
    stopped at the first row it could not read. Now the run's maps apply, every row is in the output (those it
    cannot answer with their line and why), and the labels the rows carry are scored against the run's baseline."""
    model = review_model(saved, tmp_path)
    data = write_rows_as(REVIEW_ROWS, tmp_path / f"reviews{suffix}", suffix)
    main(["--model", str(model), "--input", str(data), "--output", str(tmp_path / "answers.jsonl")])
    err = capsys.readouterr().err
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text(encoding="utf-8").splitlines()]
    assert answers[0]["location"] == first and answers[0]["input"]["id"] == "a" and answers[0]["text"] == "屏幕 电池 很好"
    assert [(a["input"]["id"], a.get("target")) for a in answers] == [
        (r["id"], t) for r in REVIEW_ROWS[:5] for t in ("category", "sentiment")] + [("f", None)]
    bad = answers[-1]
    assert "error" in bad and "empty" in bad["error"] and f"1 of 6 rows of {data} could not be answered" in err
    assert f"{bad['location']}: every text field of the row is empty" in err
    by = {(a["input"]["id"], a["target"]): a for a in answers[:-1]}
    assert by["b", "sentiment"]["gold"] == "negative" and by["a", "category"]["gold"] == "手机"   # the maps applied
    assert "gold" not in by["d", "sentiment"] and "'2' is not in label_map" in by["d", "sentiment"]["note"]
    assert "gold" not in by["e", "category"] and "'家具' is not among the labels" in by["e", "category"]["note"]
    assert "2 of 6 rows" in err and "carry a label that is not scored" in err
    scores = json.loads((tmp_path / "answers.scores.json").read_text(encoding="utf-8"))
    assert scores["category"]["rows"] == 4 and scores["sentiment"]["rows"] == 4
    assert scores["category"]["gen_majority_labels"] == ["服装"]   # the training majority, not the file's 手机
    assert scores["category"]["gen_majority_acc"] == 0.25 and "training labels" in scores["category"]["baseline"]
    right = [a["correct"] for a in answers[:-1] if a["target"] == "category" and "gold" in a]
    assert scores["category"]["gen_acc"] == sum(right) / 4


def test_predict_without_recorded_baselines_says_whose_majority_it_uses_and_writes_csv(saved, tmp_path, capsys):
    from ecomkit.data import write_csv

    model = review_model(saved, tmp_path, baselines=False)
    data = write_csv(REVIEW_ROWS[:3], tmp_path / "reviews.csv")
    main(["--model", str(model), "--input", str(data), "--output", str(tmp_path / "answers.csv")])
    with open(tmp_path / "answers.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["input.cat"] == "手机" and rows[0]["input.id"] == "a" and rows[0]["target"] == "category"
    assert json.loads(rows[0]["labels"]) == ["手机", "服装"]
    scores = json.loads((tmp_path / "answers.scores.json").read_text(encoding="utf-8"))
    assert scores["category"]["gen_majority_labels"] == ["手机"] and "this file's own labels" in scores["category"]["baseline"]
    assert "this file's own labels" in capsys.readouterr().err


def test_predict_column_map_overrides_the_runs_and_says_did_you_mean(saved, tmp_path, capsys):
    from ecomkit.data import write_jsonl

    model = review_model(saved, tmp_path)
    data = write_jsonl([{"comment": r["review"], "id": r["id"]} for r in REVIEW_ROWS[:2]], tmp_path / "new.jsonl")
    with pytest.raises(SystemExit):
        main(["--model", str(model), "--input", str(data), "--column-map", '{"coment": "review"}'])
    assert "Did you mean 'comment'?" in capsys.readouterr().err
    main(["--model", str(model), "--input", str(data), "--column-map", '{"comment": "review"}'])
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["input"]["id"], p["target"]) for p in printed] == [("a", "category"), ("a", "sentiment"),
                                                                  ("b", "category"), ("b", "sentiment")]
    with pytest.raises(SystemExit):   # a --labels name one typo off a learned label
        main(["--model", str(model), "--labels", "negative,positve", "好"])
    assert "Did you mean 'positive'?" in capsys.readouterr().err


def test_predict_help_describes_every_flag():
    from ecomkit.train.predict import build_parser

    actions = [a for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in actions} >= {"input", "output", "column_map", "label_map", "span_end"}
    assert all(a.help and len(a.help) > 10 for a in actions), [a.dest for a in actions if not a.help]
