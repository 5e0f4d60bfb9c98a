"""Candidate scoring and NLU accuracy (``ecomkit.train.nlu_accuracy``), on a tiny model built from a config.

No downloads: the model is the ``tiny`` preset with random weights and the
tokenizer is the local catalog BPE (cached under ``ECOMKIT_CACHE``).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from ecomkit.data.catalog import CATEGORIES
from ecomkit.data.targets import build_classification_example
from ecomkit.data.tasks import SENTIMENT_LABELS
from ecomkit.dist import DistEnv
from ecomkit.models.bloom import load_model
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.train.nlu_accuracy import (CandidateScore, best_candidate, candidate_log_probs, evaluate_nlu_accuracy,
                                        macro_f1, majority_share, score_candidates)


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("local", Path(os.environ["ECOMKIT_CACHE"]))


class ModelStrategy:
    """The two things evaluation needs from a strategy: ``model`` and ``forward_logits``."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def forward_logits(self, input_ids, attention_mask, positions=None):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits if positions is None else logits[:, positions]


class FavouringStrategy:
    """Logits that favour a fixed set of token ids at every position, whatever the input.

    ``noise`` adds Gaussian noise to the logits of the last 6 positions: with category prompts those hold
    every position a candidate's score reads (≤ 4 answer tokens + EOS after a shared prompt), and leaving
    the prompt positions alone keeps the test fast.
    """

    def __init__(self, vocab: int, favoured: set[int], noise: float = 0.0, seed: int = 0):
        self.model = torch.nn.Module()  # evaluation toggles train/eval on it
        self.vocab, self.favoured, self.noise = vocab, sorted(favoured), noise
        self.gen = torch.Generator().manual_seed(seed)

    def forward_logits(self, input_ids, attention_mask, positions=None):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        if self.noise:
            tail = logits[:, -6:]
            tail += self.noise * torch.randn(*tail.shape, generator=self.gen)
        logits[..., self.favoured] += 8.0
        return logits if positions is None else logits[:, positions]


@pytest.fixture(scope="module")
def tiny(tokenizer):
    model = load_model("tiny", vocab_size=len(tokenizer), seed=0)
    model.eval()
    return ModelStrategy(model)


def record(category: str, sentiment: str, i: int = 0) -> dict:
    return {"title": f"Acme® Gadget {i} Pro", "price": 10.0 + i, "category": category, "sentiment": sentiment,
            "review": "还行吧,一般般。" if sentiment == "neutral" else "很好用,推荐!", "brand": "Acme"}


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_candidate_scores_equal_a_brute_force_sum_computed_one_candidate_at_a_time(tiny, tokenizer):
    ex = build_classification_example(record("手机", "positive"), "category")
    lengths = {len(ids_of(tokenizer, c)) for c in ex.candidates}
    assert len(lengths) > 1, "the candidates must differ in length, so the batched forward pads"
    scores = candidate_log_probs(tiny, tokenizer, ex.prompt, ex.candidates, "cpu")
    prompt = ids_of(tokenizer, ex.prompt)
    for cand, score in zip(ex.candidates, scores):
        ids = prompt + ids_of(tokenizer, cand) + [tokenizer.eos_token_id]   # alone, no padding
        with torch.no_grad():
            logp = torch.log_softmax(tiny.model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
        brute = sum(float(logp[t - 1, ids[t]]) for t in range(len(prompt), len(ids)))
        assert score.n_tokens == len(ids) - len(prompt)          # answer tokens + EOS
        assert score.log_prob == pytest.approx(brute, abs=1e-4)  # float32 sums over ≤ 5 terms
    means = [s.log_prob / s.n_tokens for s in scores]
    assert score_candidates(tiny, tokenizer, ex.prompt, ex.candidates, "cpu") == means.index(max(means))


def test_accuracy_and_majority_baseline_on_a_hand_built_case(tokenizer):
    # 8 records: 3 × 手机 and 5 × 服饰; 2 positive, 6 neutral. The stub always answers 手机 / positive.
    cats = ["手机"] * 3 + ["服饰"] * 5
    sents = ["positive"] * 2 + ["neutral"] * 6
    records = [record(c, s, i) for i, (c, s) in enumerate(zip(cats, sents))]
    favoured = set(ids_of(tokenizer, "手机")) | set(ids_of(tokenizer, "positive")) | {tokenizer.eos_token_id}
    stub = FavouringStrategy(len(tokenizer), favoured)
    stub.model.train()
    train = {"category": {"服饰": 50, "手机": 20}, "sentiment": {"neutral": 9, "positive": 3}}
    out = evaluate_nlu_accuracy(stub, tokenizer, records, DistEnv(), n_samples=8, category_labels=CATEGORIES,
                                train_label_counts=train)
    assert out["acc_category"] == 3 / 8 and out["acc_sentiment"] == 2 / 8
    assert out["majority_category"] == 5 / 8 and out["majority_sentiment"] == 6 / 8
    assert (out["majority_label_category"], out["majority_label_sentiment"]) == ("服饰", "neutral")
    assert out["nlu_scored"] == 8
    assert evaluate_nlu_accuracy(stub, tokenizer, records, DistEnv(), n_samples=None)["scored_category"] == 8
    assert stub.model.training  # evaluation restores the mode it found
    # n_samples limits how many records are scored
    assert evaluate_nlu_accuracy(stub, tokenizer, records, DistEnv(), n_samples=3)["acc_category"] == 1.0


def test_majority_share_is_the_share_of_the_training_majority_label():
    assert majority_share([1.0, 3.0, 0.0], 1) == 0.75
    assert majority_share([1.0, 3.0, 0.0], 0) == 0.25     # the training majority need not be the eval one
    assert math.isnan(majority_share([0.0, 0.0], 0))


def test_candidate_scoring_baseline_comes_from_training_labels_not_the_scored_records(tokenizer):
    """Issue #43 item 1: train majority 'negative', eval majority 'positive'. On main ``majority_sentiment`` was
    the eval records' own majority share (0.75); from the training split it is the share of 'negative' (0.25)."""
    records = [{"review": "很好用,推荐!", "sentiment": "positive"}] * 3 + [{"review": "差评", "sentiment": "negative"}]
    stub = FavouringStrategy(len(tokenizer), set(ids_of(tokenizer, "negative")) | {tokenizer.eos_token_id})
    out = evaluate_nlu_accuracy(stub, tokenizer, records, DistEnv(), n_samples=8,
                                labels={"category": (), "sentiment": ("positive", "negative")},
                                train_label_counts={"sentiment": {"positive": 40, "negative": 60}})
    assert out["majority_label_sentiment"] == "negative" and out["majority_sentiment"] == 0.25
    assert out["acc_sentiment"] == 0.25      # always answering the training majority scores the baseline


def test_ties_go_to_the_lowest_index_and_the_mean_ranks():
    assert best_candidate([CandidateScore(-4.0, 2), CandidateScore(-6.0, 3), CandidateScore(-1.0, 1)]) == 2
    assert best_candidate([CandidateScore(-4.0, 2), CandidateScore(-6.0, 3)]) == 0   # both -2 per token
    with pytest.raises(ValueError):
        best_candidate([])


def test_uniform_predictions_give_every_candidate_the_same_score_whatever_its_length(tokenizer):
    """The rule: mean log-prob per scored token (answer + EOS). Under the sum, length alone would decide."""
    ex = build_classification_example(record("手机", "positive"), "category")
    uniform = FavouringStrategy(len(tokenizer), set())
    scores = candidate_log_probs(uniform, tokenizer, ex.prompt, ex.candidates, "cpu")
    assert {s.n_tokens for s in scores} == {3, 5}   # 数码配件 is 4 tokens, the other labels 2 (+ EOS)
    for s in scores:
        assert s.mean == pytest.approx(-math.log(len(tokenizer)), rel=1e-6)
    sums = [s.log_prob for s in scores]
    assert min(sums) < max(sums) - 1.0   # the sum would rank by length


def test_near_uniform_predictions_do_not_systematically_pick_the_shortest_candidate(tokenizer):
    """Uniform logits plus small noise: the mean rule spreads its picks; the sum rule never picks the long label."""
    noisy = FavouringStrategy(len(tokenizer), set(), noise=0.1, seed=0)
    long_label = max(range(len(CATEGORIES)), key=lambda i: len(ids_of(tokenizer, CATEGORIES[i])))
    by_mean, by_sum = Counter(), Counter()
    n = 200
    for i in range(n):
        ex = build_classification_example(record(CATEGORIES[i % len(CATEGORIES)], "neutral", i), "category")
        scores = candidate_log_probs(noisy, tokenizer, ex.prompt, ex.candidates, "cpu")
        by_mean[best_candidate(scores)] += 1
        by_sum[max(range(len(scores)), key=lambda j: scores[j].log_prob)] += 1
    assert by_sum[long_label] == 0                       # the bias the mean removes
    # Fair share is n / 10 = 20. The long label's mean averages more noise terms, so it is picked somewhat less
    # often (~8 seen); a third of the fair share leaves room for that, and is far from the sum rule's 0.
    assert by_mean[long_label] >= n / len(CATEGORIES) / 3
    assert max(by_mean.values()) <= 2 * n / len(CATEGORIES)   # no candidate takes more than twice its share
    assert len(by_mean) == len(CATEGORIES)


def test_sentiment_candidates_are_scored_as_in_training_with_eos(tiny, tokenizer):
    ex = build_classification_example(record("手机", "negative"), "sentiment")
    assert ex.candidates == SENTIMENT_LABELS
    scores = candidate_log_probs(tiny, tokenizer, ex.prompt, ex.candidates, "cpu")
    assert [s.n_tokens for s in scores] == [len(ids_of(tokenizer, c)) + 1 for c in SENTIMENT_LABELS]
    # a prompt cut to the training length scores differently from the full one (the cut is applied)
    cut = candidate_log_probs(tiny, tokenizer, ex.prompt, ex.candidates, "cpu", max_length=24)
    assert [s.n_tokens for s in cut] == [s.n_tokens for s in scores]
    assert cut[0].log_prob != pytest.approx(scores[0].log_prob, abs=1e-6)


def test_macro_f1_weights_every_label_equally():
    # gold × predicted: the majority label (index 0) always predicted: accuracy 0.75, macro-F1 ≈ 0.43
    always_first = [[3.0, 0.0], [1.0, 0.0]]
    assert macro_f1(always_first) == pytest.approx((2 * 3 / (3 + 4) + 0.0) / 2)
    assert macro_f1([[2.0, 0.0], [0.0, 5.0]]) == 1.0
    assert math.isnan(macro_f1([[0.0]]))


def test_each_target_is_scored_on_the_records_that_have_it_with_labels_from_the_data(tokenizer):
    # sentiment-only records (a review file with 0/1 labels mapped to two names); no category anywhere
    records = [{"review": "很好用,推荐!", "sentiment": "positive"}] * 3 + [{"review": "差评", "sentiment": "negative"}]
    favoured = set(ids_of(tokenizer, "positive")) | {tokenizer.eos_token_id}
    stub = FavouringStrategy(len(tokenizer), favoured)
    out = evaluate_nlu_accuracy(stub, tokenizer, records, DistEnv(), n_samples=8,
                                labels={"category": (), "sentiment": ("positive", "negative")},
                                train_label_counts={"sentiment": {"positive": 2, "negative": 1}})
    assert "acc_category" not in out and out["scored_sentiment"] == out["nlu_scored"] == 4
    assert out["acc_sentiment"] == out["majority_sentiment"] == 0.75
    assert out["macro_f1_sentiment"] == pytest.approx((2 * 3 / 7 + 0.0) / 2)


class CountingStrategy(FavouringStrategy):
    """Counts forwards and the rows they see (a row's id is its first token)."""

    def __init__(self, vocab: int):
        super().__init__(vocab, set())
        self.forwards, self.first_tokens = 0, []

    def forward_logits(self, input_ids, attention_mask, positions=None):
        self.forwards += 1
        self.first_tokens += input_ids[:, 0].tolist()
        return super().forward_logits(input_ids, attention_mask, positions)


@pytest.fixture
def two_ranks_apart(monkeypatch):
    """Each rank of a 2-process job evaluated alone: the all-reduce returns this rank's own sums."""
    import ecomkit.train.evaluate as evaluate
    import ecomkit.train.nlu_accuracy as nlu_accuracy
    for module in (evaluate, nlu_accuracy):
        monkeypatch.setattr(module, "all_reduce_sums", lambda values, env: values)
    return [DistEnv(rank=r, world_size=2) for r in range(2)]


def test_the_final_loss_covers_every_example_with_equal_forwards_per_rank(tokenizer, two_ranks_apart):
    """Issue #43 item 2: every held-out example is read (on main ``len // ranks`` per rank, the rest dropped), and
    a rank whose share is one short still runs as many forwards (sharded strategies need equal collectives)."""
    from ecomkit.data import pad_collate
    from ecomkit.train.evaluate import held_out_loss

    rows = [{"input_ids": [10 + i, 3, 4], "attention_mask": [1, 1, 1], "labels": [-100, 3, 4]} for i in range(7)]
    collate = lambda feats: pad_collate(feats, 0, 1)   # noqa: E731
    stubs, outs = [], []
    for rank in range(2):   # each shard alone (no process group: the sums are this rank's own)
        stub = CountingStrategy(len(tokenizer))
        outs.append(held_out_loss(stub, rows, collate, two_ranks_apart[rank], 2, None, shard=(rank, 2)))
        stubs.append(stub)
    assert sorted(t for s in stubs for t in s.first_tokens[:4 if s is stubs[0] else 3]) == [10 + i for i in range(7)]
    assert [s.forwards for s in stubs] == [2, 2]                      # shares of 4 and 3, batches of 2
    assert [o["eval_loss_examples"] for o in outs] == [4, 3] and sum(o["eval_loss_tokens"] for o in outs) == 14
    sample = held_out_loss(CountingStrategy(len(tokenizer)), rows, collate, two_ranks_apart[0], 2, 1, shard=(0, 2))
    assert sample["eval_loss_examples"] == 2                          # a periodic sample: 1 batch per rank
    capped = held_out_loss(CountingStrategy(len(tokenizer)), rows, collate, DistEnv(), 2, None, max_examples=5)
    assert capped["eval_loss_examples"] == 5


def test_final_candidate_scoring_reads_every_record_with_equal_forwards_per_rank(tokenizer, two_ranks_apart):
    records = [record("手机" if i % 2 else "服饰", "positive", i) for i in range(5)]
    counts = []
    for rank in range(2):
        stub = CountingStrategy(len(tokenizer))
        out = evaluate_nlu_accuracy(stub, tokenizer, records, two_ranks_apart[rank], None, category_labels=CATEGORIES,
                                    shard=(rank, 2), labels={"sentiment": ()})
        counts.append((stub.forwards, out["scored_category"], stub.first_tokens))
    assert [c[:2] for c in counts] == [(3, 5), (3, 5)]   # 3 + 2 records, the short share repeats one forward


def test_the_run_says_once_what_each_evaluation_reads_and_when_nlu_sampling_has_no_effect():
    """Issue #43 item 2: the final evaluation reads every held-out row (said at start-up), and on extraction-only
    data --eval-nlu-samples acts on nothing: the run says so once instead of ignoring the flag silently."""
    from ecomkit.config import TrainConfig
    from ecomkit.train.loop import evaluation_scope

    cfg = TrainConfig(task="nlu")
    extraction_only = [{"text": "华为 手机", "spans": '[["品牌", 0, 2, "华为"]]'}] * 3
    lines = evaluation_scope(cfg, 1343, extraction_only, {"extract": ("品牌",)})
    assert "final: every held-out row (1,343 examples" in lines[0]
    assert len(lines) == 2 and "--eval-nlu-samples has no effect" in lines[1]
    labelled = [{"title": "华为 手机", "category": "手机"}]
    assert len(evaluation_scope(cfg, 1, labelled, {"category": ("手机", "服饰")})) == 1
    capped = TrainConfig(task="nlu", final_eval_samples=50)
    assert "the first 50 of each" in evaluation_scope(capped, 1343, labelled, {"category": ("手机", "服饰")})[0]
