"""Packing: best-fit decreasing bins, the packed sampler and collator, and packed rows equal to unpacked rows."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset

from ecomkit.config import TrainConfig
from ecomkit.data.packing import (CPU_PACK_MAX_SEQ_LEN, EMPTY, PACK_AUTO_MAX_ROW_SHARE, PackedBatchSampler, RowGroups,
                                  best_fit_decreasing, decide_packing, fill_rate, packed_collate, plan_sequences)
from ecomkit.data.tokenize import IGNORE_INDEX
from ecomkit.errors import ConfigError
from ecomkit.fast.attention import install_attention
from ecomkit.models.attention import alibi_from_mask, attention_mask_for, document_causal_mask
from ecomkit.models.bloom import build_model
from ecomkit.fast.compile import head_loss_graphs
from ecomkit.models.loss import TokenLoss
from ecomkit.train.loop import training_loader
from ecomlab.artifacts import newest_artifacts
from ecomlab.derive.packing import bench_packing_jobs, cpu_packing_rule
from ecomlab.measure.compile_graphs import packed_step_graphs
from ecomlab.measure.packing import (equal_step_micro_batch, loss_and_gradients, packed_batch, packing_agreement,
                                     padded_batch, random_rows, row_isolation, seed_spread)

PAD = 3
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def lengths(n: int = 500, seed: int = 0, low: int = 5, high: int = 120) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, size=n)


def test_best_fit_decreasing_packs_every_row_once_within_capacity():
    lens = lengths()
    bins = best_fit_decreasing(lens, 128)
    assert sorted(i for b in bins for i in b) == list(range(len(lens)))
    assert all(lens[b].sum() <= 128 for b in bins)
    # within best-fit decreasing's worst case, 11/9 of the optimum (+1), against a lower bound of the optimum:
    # the tokens over the capacity, and the rows longer than half a bin, which no two can share
    lower = max(-(-lens.sum() // 128), int((lens > 64).sum()))
    assert lower <= len(bins) <= 11 / 9 * lower + 1
    short = lengths(low=5, high=60)
    assert fill_rate(short, best_fit_decreasing(short, 128), 128) > 0.98


def test_best_fit_decreasing_puts_each_row_in_the_fullest_bin_that_holds_it():
    # 70, 60 open two bins (room 58, 68); 50 goes where it fits tightest (room 58 -> 8); 10 then to room 68
    assert best_fit_decreasing([70, 60, 50, 10], 128) == [[0, 2], [1, 3]]


def test_best_fit_decreasing_refuses_rows_longer_than_a_sequence():
    with pytest.raises(ConfigError, match="cannot pack a row of 200 tokens into sequences of 128"):
        best_fit_decreasing([10, 200], 128)


def test_plan_is_deterministic_per_seed_and_epoch_and_changes_between_epochs():
    lens = lengths()
    a, b = plan_sequences(lens, 128, seed=1, epoch=0), plan_sequences(lens, 128, seed=1, epoch=0)
    assert a == b
    assert plan_sequences(lens, 128, seed=1, epoch=1) != a and plan_sequences(lens, 128, seed=2, epoch=0) != a
    assert len(plan_sequences(lens, 128, seed=1, epoch=1)) == len(a)   # the same bins' count every epoch


def test_packed_sampler_gives_every_row_once_per_epoch_across_ranks_in_full_micro_batches():
    lens = lengths(300)
    samplers = [PackedBatchSampler(lens, 128, micro_batch_size=3, grad_accum=2, num_replicas=2, rank=r, seed=0)
                for r in range(2)]
    for epoch in (0, 1):
        seen = []
        for s in samplers:
            s.set_epoch(epoch)
            micro = list(s)
            assert len(micro) == len(s) == s.steps_per_epoch * 2
            assert all(len(m) == 3 for m in micro)       # filler sequences keep every micro-batch full
            seen += [i for m in micro for seq in m for i in seq]
        assert sorted(seen) == list(range(len(lens)))
    total = len(samplers[0].sequences())
    assert total % samplers[0].global_batch_size == 0 and samplers[0].sequences().count(EMPTY) < 12


def test_packed_sampler_resumes_after_the_consumed_global_batches():
    lens = lengths(300)
    first = PackedBatchSampler(lens, 128, 2, 1, 1, 0, seed=3)
    it = iter(first)
    done = [next(it) for _ in range(5)]
    state = first.state_dict()
    second = PackedBatchSampler(lens, 128, 2, 1, 1, 0, seed=3)
    second.load_state_dict(state)
    rest = list(second)
    assert done + rest == list(PackedBatchSampler(lens, 128, 2, 1, 1, 0, seed=3))
    with pytest.raises(ConfigError, match="--seq-len"):
        PackedBatchSampler(lens, 256, 2, 1, 1, 0, seed=3).load_state_dict(state)


def test_decide_packing_auto_follows_the_mean_row_share():
    assert decide_packing("auto", 60.0, 256)[0] and not decide_packing("auto", 200.0, 256)[0]
    assert decide_packing("auto", 256 * PACK_AUTO_MAX_ROW_SHARE, 256)[0]
    assert decide_packing("on", 200.0, 256) == (True, "--packing on as given")
    assert decide_packing("off", 60.0, 256)[0] is False


def test_decide_packing_auto_on_a_cpu_packs_only_at_the_precisions_and_lengths_measured_faster():
    for precision in ("fp32", "bf16"):
        for seq_len in (128, 256, 512, 1152):
            packed, why = decide_packing("auto", seq_len * 0.25, seq_len, "cpu", precision)
            assert packed == (seq_len <= CPU_PACK_MAX_SEQ_LEN.get(precision, 0)), why
            if not packed:
                assert "--packing on" in why and f"at {precision} and seq_len {seq_len}" in why
    assert decide_packing("on", 60.0, 256, "cpu", "fp32")[0]
    assert decide_packing("auto", 256.0, 1024, "cuda", "fp32")[0]      # a GPU: the rows' share alone


def test_cpu_packing_rule_is_the_longest_seq_len_every_job_up_to_it_was_faster():
    assert cpu_packing_rule([("fp32", 256, [0.7, 0.8, 0.75]), ("bf16", 256, [1.1, 1.2, 1.15]),
                             ("bf16", 1152, [0.6, 0.7, 0.68])]) == {"bf16": 256}
    assert cpu_packing_rule([("bf16", 256, [1.2]), ("bf16", 512, [1.1])]) == {"bf16": 512}
    assert cpu_packing_rule([("bf16", 128, [0.9]), ("bf16", 512, [1.3])]) == {}   # not at the shortest: never
    assert cpu_packing_rule([("bf16", 256, [1.04, 1.05, 1.06])]) == {}             # within PACKING_MIN_GAIN


def test_the_cpu_packing_rule_is_what_bench_packing_measured():
    """The constant against the newest artifact: the median of each job's paired rounds."""
    path = newest_artifacts(RESULTS).get("bench_packing")
    if path is None:
        pytest.skip("no bench_packing artifact in benchmarks/results yet")
    doc = json.loads(path.read_text())
    if doc.get("gpu"):
        pytest.skip("the newest bench_packing artifact is from a GPU")
    assert cpu_packing_rule(bench_packing_jobs(doc)) == CPU_PACK_MAX_SEQ_LEN


# ---------------------------------------------------------------------- rows, packed and unpacked
def rows(n: int = 9, seed: int = 0, prompted: bool = False) -> list[dict]:
    return random_rows(n, 400, seed=seed, prompted=prompted)


def packed(data: list[dict], seq_len: int = 96) -> dict[str, torch.Tensor]:
    return packed_batch(data, seq_len, PAD)


def test_packed_collate_lays_rows_end_to_end_with_document_ids_and_a_fresh_start_per_row():
    data = rows(5)
    batch = packed(data, 96)
    docs, labels, ids = batch["document_ids"], batch["labels"], batch["input_ids"]
    assert batch["attention_mask"].equal((docs > 0).long()) and ids.shape[1] == 96
    assert int(batch["attention_mask"].sum()) == sum(len(r["input_ids"]) for r in data)
    for s in range(docs.shape[0]):
        starts = [t for t in range(96) if docs[s, t] > 0 and (t == 0 or docs[s, t] != docs[s, t - 1])]
        assert all(labels[s, t] == IGNORE_INDEX for t in starts)     # nothing before a row predicts its first token
        assert (ids[s][docs[s] == 0] == PAD).all()


def test_document_mask_is_block_diagonal_causal_and_padding_never_sees_nothing():
    docs = torch.tensor([[1, 1, 2, 2, 2, 0, 0]])
    allowed = document_causal_mask(docs)[0, 0] == 0
    expected = torch.tensor([[1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0],
                             [0, 0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1, 0],
                             [0, 0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert allowed.equal(expected) and allowed.any(dim=-1).all()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("prompted", [False, True])
def test_packed_rows_give_the_unpacked_loss_and_gradients_in_fp32(impl, chunked, prompted):
    model = build_model("tiny", vocab_size=400)
    install_attention(model, impl)
    data = rows(9, prompted=prompted)
    agreement = packing_agreement(model, data, 96, PAD, TokenLoss("chunked", 64) if chunked else TokenLoss())
    assert agreement.sequences < agreement.rows == 9              # rows really share sequences
    assert agreement.within(1e-5), agreement


def test_packed_rows_keep_the_unpacked_label_count():
    data = rows(9, prompted=True)
    p, u = packed(data), padded_batch(data, PAD)
    assert int((p["labels"][:, 1:] != -100).sum()) == int((u["labels"][:, 1:] != -100).sum())


@pytest.mark.parametrize("packing", [True, False])
def test_training_batches_carry_their_host_counted_label_count(packing):
    """``label_count`` (train/loop.py's Counted) is what the chunked loss selects by: it must equal the labels' count."""
    data = rows(40, prompted=True)
    cfg = TrainConfig(seq_len=96, micro_batch_size=4, precision="fp32")
    lens = np.array([len(r["input_ids"]) for r in data])
    _, loader = training_loader(Dataset.from_list(data), lens, cfg, (0, 1), 1, packing, PAD, None)
    batches = list(loader)
    assert batches
    for batch, counts in batches:
        assert batch["label_count"] == counts.label_tokens == int((batch["labels"][:, 1:] != -100).sum())


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_changing_one_packed_row_changes_no_other_rows_logits(impl):
    model = build_model("tiny", vocab_size=400)
    install_attention(model, impl)
    assert row_isolation(model, rows(9), 96, PAD, 400) == (True, True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention trains on CUDA only")
def test_flex_packed_rows_give_the_unpacked_loss_on_cuda():
    model = build_model("tiny", vocab_size=400, device="cuda")
    install_attention(model, "flex")
    data = rows(9)
    p = {k: v.cuda() for k, v in packed(data).items()}
    u = {k: v.cuda() for k, v in padded_batch(data, PAD).items()}
    loss_p, grads_p = loss_and_gradients(model, p)
    loss_u, grads_u = loss_and_gradients(model, u)
    assert abs(loss_p - loss_u) <= 1e-5 * abs(loss_u)
    assert all(float((grads_p[k] - g).norm() / g.norm()) <= 1e-5 for k, g in grads_u.items())


def test_row_groups_read_one_sequence_as_columns():
    from datasets import Dataset
    table = Dataset.from_dict({"input_ids": [[1, 2], [3], [4, 5, 6]], "labels": [[1, 2], [3], [4, 5, 6]]})
    groups = RowGroups(table)
    assert groups[(2, 0)]["input_ids"] == [[4, 5, 6], [1, 2]] and groups[EMPTY] == {"input_ids": []}
    batch = packed_collate([groups[(2, 0)], groups[EMPTY]], 8, PAD)
    assert batch["input_ids"].tolist() == [[4, 5, 6, 1, 2, PAD, PAD, PAD], [PAD] * 8]
    assert batch["document_ids"].tolist() == [[1, 1, 1, 2, 2, 0, 0, 0], [0] * 8]


def test_compiled_packed_training_does_not_recompile_after_the_first_step():
    """--compile on packed batches: one shape every step, so the graphs of step 1 serve every later step.

    The steps differ in how rows are laid out and how many positions are labeled (the chunked loss keeps
    only those); dynamo's frame counters (the ``eager`` backend: inductor's graphs and guards without its
    code generation) must not move after the first step (measure/compile_graphs.py). How many graphs the
    head + loss is, is this torch's (one from 2.12, two before: a speed note, fast/compile.py), not a
    failure; the blocks are one graph on every torch.
    """
    frames = packed_step_graphs(5)
    assert frames == [(1, head_loss_graphs())] * 5, frames


def test_seed_spread_and_the_equal_step_micro_batch():
    assert seed_spread([1.40, 1.42, 1.44], [1.43, 1.45, 1.41]).within_noise        # gap 0.01 <= spread 0.04
    far = seed_spread([1.40, 1.41, 1.42], [2.60, 2.70, 2.69])
    assert not far.within_noise and far.gap == pytest.approx(1.28) and far.noise == pytest.approx(0.10)
    with pytest.raises(ValueError):
        seed_spread([1.0], [1.0, 1.1])
    assert equal_step_micro_batch(8, 85, 237) == 3 and equal_step_micro_batch(8, 13, 59) == 2
    assert equal_step_micro_batch(8, 10, 400) == 1


@pytest.mark.parametrize("batch", [
    {"document_ids": torch.tensor([[0, 0, 1, 1, 1, -1]])},                                       # packed
    {"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), "has_padding": True},         # padded
    {"attention_mask": torch.ones(2, 4, dtype=torch.long), "has_padding": False},               # plain causal
], ids=["packed", "padded", "causal"])
def test_a_training_mask_and_its_plan_are_freed_without_the_garbage_collector(batch):
    """A [B, 1, T, T] mask a step built is gone when the step drops it, not when the collector next runs
    (a mask whose plan referred to the mask itself lived on: RSS rose ~19 MiB a step, test_bf16_memory.py)."""
    gc.disable()
    try:
        mask = attention_mask_for(batch)
        alibi = alibi_from_mask(mask, 4, torch.float32)
        freed = weakref.ref(mask)
        del mask, alibi
        assert freed() is None
    finally:
        gc.enable()
