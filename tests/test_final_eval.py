"""The final evaluation: where its time went (the LM head over every prompt position, one record per forward)
and what it shows (one progress bar with an ETA, not "decode n/393" lines)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from ecomkit.data import pad_collate
from ecomkit.data.catalog import CATEGORIES
from ecomkit.data.targets import build_classification_example
from ecomkit.dist import DistEnv
from ecomkit.models.bloom import load_model
from ecomkit.models.loss import token_loss_sum
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.train.evaluate import held_out_loss
from ecomkit.train.nlu_accuracy import encode_candidates, encode_examples, evaluate_nlu_accuracy, plan_groups


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("local", Path(os.environ["ECOMKIT_CACHE"]))


class Recording:
    """The tiny model behind ``forward_logits``; records each call's batch shape and kept positions."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def forward_logits(self, input_ids, attention_mask, positions=None):
        self.calls.append((tuple(input_ids.shape), None if positions is None else len(positions)))
        kwargs = {} if positions is None else {"logits_to_keep": positions}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits


@pytest.fixture(scope="module")
def tiny(tokenizer):
    model = load_model("tiny", vocab_size=len(tokenizer), seed=0)
    model.eval()
    return model


def records(n: int) -> list[dict]:
    return [{"title": f"Acme 手机 {i} Pro" + " 超长标题" * (i % 7), "category": CATEGORIES[i % 4],
             "sentiment": "positive" if i % 3 else "negative", "review": "很好用,推荐!", "brand": "Acme"}
            for i in range(n)]


def test_the_held_out_loss_computes_the_head_at_answer_positions_only_and_equals_the_full_logits_loss(tiny):
    """The cause of most of the final evaluation's time: the LM head (B × T × vocab) over every prompt position,
    whose logits no figure reads. The loss from the kept positions equals the one from every position."""
    rows = [{"input_ids": list(range(5, 5 + n)), "attention_mask": [1] * n, "labels": [-100] * (n - 3) + [7, 8, 2]}
            for n in (12, 30, 9, 21, 17)]
    collate = lambda feats: pad_collate(feats, 0, 1)   # noqa: E731
    stub = Recording(tiny)
    got = held_out_loss(stub, rows, collate, DistEnv(), 2, None)
    batches = [collate(rows[i:i + 2]) for i in range(0, 5, 2)]
    with torch.no_grad():
        total = sum(float(token_loss_sum(tiny(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits,
                                         b["labels"])) for b in batches)
    assert got["eval_loss"] == pytest.approx(total / 15, rel=1e-5) and got["eval_loss_examples"] == 5
    for (batch, width), kept in stub.calls:
        assert kept is not None and kept < width   # the answer positions, not the whole row
    # rows are read shortest first: batches of similar lengths pad less (9+12, 17+21, 30)
    assert [width for (_, width), _ in stub.calls] == [12, 21, 30]


def test_candidate_scoring_scores_several_records_per_forward_with_the_same_figures(tiny, tokenizer):
    recs = records(24)
    one = Recording(tiny)
    alone = evaluate_nlu_accuracy(one, tokenizer, recs, DistEnv(), None, category_labels=CATEGORIES[:4])
    grouped = Recording(tiny)
    together = evaluate_nlu_accuracy(grouped, tokenizer, recs, DistEnv(), None, category_labels=CATEGORIES[:4],
                                     batch_positions=8 * 128)
    assert len(one.calls) == 48                       # one forward per record and target
    assert len(grouped.calls) < len(one.calls) / 3    # several records per forward
    assert all(rows * width <= 8 * 128 or rows <= 4 for (rows, width), _ in grouped.calls)
    for key in ("acc_category", "acc_sentiment", "macro_f1_category", "scored_category"):
        assert together[key] == pytest.approx(alone[key]), key


def test_plan_groups_fills_a_budget_shortest_first_and_never_drops_an_example():
    sizes = [(4, 100), (4, 30), (2, 500), (4, 40), (4, 90)]
    groups = plan_groups(sizes, 400)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    assert groups == [[1, 3], [4], [0], [2]]          # 8 rows × 40; 4 × 90; 4 × 100; the 500-wide row alone
    assert plan_groups(sizes, None) == [[1], [3], [4], [0], [2]]


def test_batched_encoding_equals_encoding_one_candidate_at_a_time(tokenizer):
    examples = [build_classification_example(r, t, CATEGORIES[:4] if t == "category" else None, "seqgpt")
                for r in records(6) for t in ("category", "sentiment")]
    for max_length in (None, 24):
        assert encode_examples(tokenizer, examples, max_length) == [
            encode_candidates(tokenizer, ex.prompt, ex.candidates, max_length) for ex in examples]


@pytest.mark.slow
def test_the_final_evaluation_shows_one_bar_with_an_eta_and_the_summary_says_why_it_did_not_learn(tmp_path, capsys):
    from ecomkit.config import TrainConfig
    from ecomkit.metrics import print_run_summary
    from ecomkit.train.loop import train_in_session

    cfg = TrainConfig(model="tiny", task="nlu", n_rows=300, seq_len=96, micro_batch_size=4, max_steps=2,
                      eval_interval=0, precision="fp32", output_dir=str(tmp_path / "run"), progress=True,
                      save_model=False)
    summary = train_in_session(cfg, DistEnv(rank=0, world_size=1, local_world_size=1, device=torch.device("cpu")))
    out = capsys.readouterr().out
    assert not re.search(r"^decode \d+/", out, re.M)                 # no per-phase "decode n/N" lines
    bar = re.findall(r"^eval (\d+)/(\d+) \[.*, ETA .*\]$", out, re.M)
    assert bar and len({total for _, total in bar}) == 1 and bar[-1][0] == bar[-1][1]   # one bar, to its end
    assert summary["eval_methods"]["acc_category"] == "candidate scoring"
    assert summary["eval_methods"]["gen_acc"] == "generation, exact match"
    print_run_summary(summary)
    printed = capsys.readouterr().out
    assert summary["baseline"]["cleared"] is False
    line = next(x for x in printed.splitlines() if x.startswith("NOT LEARNED: "))
    assert "Likely: too few steps: 2 steps saw" in line and "--max-steps 0" in line and "--epochs 3" in line
    assert "kept weights    the last step's, step 2: no periodic evaluation" in printed
