"""``python -m ecomkit.predict`` on a saved model: the same prompt, decoding and parser as evaluation.

The model is the tiny preset with larger random weights (answers differ from text to text), saved with the
local tokenizer; what it answers is nonsense, but the test is that predict's answers are exactly what
evaluation's decoding and parser make of the same prompts, and that its input checks are clear.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ecomkit.data.formats import build_prompt, parse_answer
from ecomkit.dist import DistEnv
from ecomkit.errors import DataError
from ecomkit.train.generate import DecodeSettings, generate_texts
from ecomkit.data.formats import read_task_file
from ecomkit.train.predict import Predictor, Recorded, main, normalise_row, recorded_prompt_format, split_labels
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
    assert answers[0]["id"] == 7 and answers[0]["task"] == "classify" and "label" in answers[0]
    assert answers[1]["labels"] == ["品牌"] and isinstance(answers[1]["spans"], dict)
    direct = Predictor(str(out)).predict([normalise_row(r, "extract", ("品牌",), "x") for r in rows])
    assert [a["generated"] for a in direct] == [a["generated"] for a in answers]


def test_predict_remembers_the_task_labels_length_and_budget_the_run_saved(saved, tmp_path, capsys):
    """Issue #43 item 4: ``--model runs/x/final "…"`` alone. On main it exited with "no task; give --task", and its
    --max-length/--max-new-tokens defaults ignored the run's. Flags still override each."""
    import shutil

    from ecomkit.data.formats import write_task_file

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
    # a model that learned two classification label sets: the Python API names them, with the flag to pick one
    write_task_file(out, prompt_format="seqgpt", task="nlu", labels={"category": ("a", "b"), "sentiment": ("x", "y")},
                    kinds=["category", "sentiment"])
    with pytest.raises(DataError, match=r"category: --labels a,b; sentiment: --labels x,y"):
        normalise_row({"text": "a"}, None, (), "command line", Recorded(read_task_file(out), str(out)))
    main(["--model", str(out), "--labels", "x,y", TEXTS[0]])
    assert json.loads(capsys.readouterr().out)["label"] in ("x", "y", None)


def test_predict_answers_every_target_a_model_learned_one_line_each(saved, tmp_path, capsys):
    """Issue 49 item 7: ``--model runs/mine/final "…"`` on a model that learned category and sentiment exited
    asking for --labels; it answers both, one line per target (and per text), each prompt with that target's
    labels. --task keeps one kind; --labels asks one set; a row's own labels are one question."""
    import shutil

    from ecomkit.data.formats import write_task_file
    from ecomkit.train.predict import answer_rows

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
    asked = answer_rows({"text": "a"}, None, (), "x", recorded)
    assert [(r["task"], r["labels"]) for r in asked] == [("classify", ("手机", "服装")), ("classify", ("正面", "负面")),
                                                         ("extract", ("品牌",))]
    assert [r["target"] for r in answer_rows({"text": "a"}, "classify", (), "x", recorded)] == ["category", "sentiment"]
    assert answer_rows({"text": "a", "task": "extract"}, None, (), "x", recorded)[0]["labels"] == ("品牌",)
    assert len(answer_rows({"text": "a"}, "classify", ("正面", "负面"), "x", recorded)) == 1
    with pytest.raises(DataError, match="no task"):
        answer_rows({"text": "a", "task": "summarise"}, None, (), "x", recorded)
    with pytest.raises(DataError, match="string field 'text'"):
        answer_rows({"txt": "a"}, None, (), "x", recorded)


def test_input_errors_name_the_place_and_the_fix(saved, tmp_path):
    with pytest.raises(DataError, match="line 2: not JSON"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"text": "a"}\n{oops\n', encoding="utf-8")
        from ecomkit.train.predict import read_rows
        read_rows(str(bad), "extract", ("品牌",))
    with pytest.raises(DataError, match="no labels"):
        normalise_row({"text": "a"}, "extract", (), "command line")
    with pytest.raises(DataError, match="no task"):
        normalise_row({"text": "a"}, None, ("x",), "command line")
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
