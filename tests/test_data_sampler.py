"""Global-batch planning and the distributed batch sampler, with ranks simulated in one process."""

from collections import Counter

import numpy as np
import pytest

from ecomkit.data import (DistributedBatchSampler, compare_padding, epoch_micro_batches, padding_rate,
                          plan_global_batches)
from ecomkit.data.padding import compare_rank_wait, rank_step_costs, wait_fraction
from ecomkit.errors import ConfigError


@pytest.fixture(scope="module")
def lengths():
    rng = np.random.default_rng(0)
    return np.clip(rng.lognormal(4.3, 0.5, 1003).astype(int), 10, 400)


def _samplers(lengths, mb, accum, world, seed=0, epoch=0, **kw):
    out = [DistributedBatchSampler(lengths, mb, accum, world, rank, seed, **kw) for rank in range(world)]
    for s in out:
        s.set_epoch(epoch)
    return out


def _steps(sampler):
    """The sampler's micro-batches grouped per global step (grad_accum per step)."""
    batches = list(sampler)
    a = sampler.grad_accum
    return [sum(batches[i:i + a], []) for i in range(0, len(batches), a)]


@pytest.mark.parametrize("bucketed", [True, False])
def test_plan_is_deterministic_and_epochs_differ(lengths, bucketed):
    a = plan_global_batches(lengths, 32, seed=1, epoch=0, bucketed=bucketed)
    assert a == plan_global_batches(lengths, 32, seed=1, epoch=0, bucketed=bucketed)
    assert a != plan_global_batches(lengths, 32, seed=1, epoch=1, bucketed=bucketed)
    assert a != plan_global_batches(lengths, 32, seed=2, epoch=0, bucketed=bucketed)


@pytest.mark.parametrize("bucketed", [True, False])
def test_plan_drop_last_and_keep_last(lengths, bucketed):
    full = plan_global_batches(lengths, 32, 0, 0, bucketed=bucketed, drop_last=True)
    assert len(full) == len(lengths) // 32 and all(len(b) == 32 for b in full)
    assert len(set(sum(full, []))) == 32 * len(full)
    kept = plan_global_batches(lengths, 32, 0, 0, bucketed=bucketed, drop_last=False)
    assert sorted(sum(kept, [])) == list(range(len(lengths)))
    assert len(kept[-1]) == len(lengths) % 32 and all(len(b) == 32 for b in kept[:-1])


def test_bucketed_batches_are_length_sorted_but_batch_order_is_shuffled(lengths):
    plan = plan_global_batches(lengths, 16, 0, 0, bucketed=True)
    for batch in plan:
        assert list(lengths[batch]) == sorted(lengths[batch])
    means = [lengths[b].mean() for b in plan]
    assert means != sorted(means)


@pytest.mark.parametrize("bucketed", [True, False])
def test_ranks_are_disjoint(lengths, bucketed):
    r0, r1 = _samplers(lengths, 4, 2, 2, bucketed=bucketed)
    seen0, seen1 = sum(list(r0), []), sum(list(r1), [])
    assert not set(seen0) & set(seen1)
    assert len(seen0) == len(seen1) == (len(lengths) // 16) * 8


@pytest.mark.parametrize("n", [1003, 1000, 999, 993])
def test_coverage_mode_sees_every_sample_exactly_once(lengths, n):
    samplers = _samplers(lengths[:n], 4, 2, 2, drop_last=False)
    counts = Counter(i for s in samplers for batch in s for i in batch)
    assert counts == Counter(range(n))
    for s in samplers:
        assert len(list(s)) == len(s)
        assert all(1 <= len(b) <= 4 for b in s)


def test_coverage_mode_with_fewer_leftovers_than_ranks():
    samplers = _samplers(np.arange(10, 27), 2, 1, 4, drop_last=False)  # 17 = 2 * 8 + 1
    per_rank = [list(s) for s in samplers]
    assert Counter(i for b in sum(per_rank, []) for i in b) == Counter(range(17))
    assert [len(p) for p in per_rank] == [len(s) for s in samplers] == [3, 2, 2, 2]


@pytest.mark.parametrize("world,accum", [(2, 2), (4, 1)])
def test_union_of_rank_slices_equals_one_rank_global_batch(lengths, world, accum):
    """Same global batch (16) and micro-batch (4): 1 process x 4 accum == world processes x accum."""
    (single,) = _samplers(lengths, 4, 4, 1, seed=5, epoch=3)
    many = _samplers(lengths, 4, accum, world, seed=5, epoch=3)
    reference = _steps(single)
    per_rank = [_steps(s) for s in many]
    assert len(reference) == single.steps_per_epoch == many[0].steps_per_epoch
    for k, global_batch in enumerate(reference):
        assert sum((steps[k] for steps in per_rank), []) == global_batch


def test_len_counts_micro_batches(lengths):
    for s in _samplers(lengths, 4, 3, 2) + _samplers(lengths, 4, 3, 2, drop_last=False):
        assert len(s) == len(list(s))
    s = _samplers(lengths, 4, 3, 2)[0]
    assert len(s) == s.steps_per_epoch * 3 and s.steps_per_epoch == len(lengths) // 24


def test_set_epoch_changes_the_order(lengths):
    (s,) = _samplers(lengths, 8, 1, 1)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert first != second and len(first) == len(second) == len(lengths) // 8
    for epoch_batches in (first, second):  # each epoch: distinct samples, all but the dropped remainder
        seen = sum(epoch_batches, [])
        assert len(set(seen)) == len(seen) == (len(lengths) // 8) * 8
    s.set_epoch(0)
    assert list(s) == first


@pytest.mark.parametrize("stop_after", [0, 5, 31])
def test_resume_continues_exactly_where_it_stopped(lengths, stop_after):
    world, accum = 2, 2
    uninterrupted = [list(s) for s in _samplers(lengths, 4, accum, world, epoch=2)]
    resumed = []
    for rank, sampler in enumerate(_samplers(lengths, 4, accum, world, epoch=2)):
        it = iter(sampler)
        head = [next(it) for _ in range(stop_after * accum)]  # stop_after optimizer steps
        state = sampler.state_dict()
        assert state["epoch"] == 2 and state["consumed_global_batches"] == stop_after
        fresh = DistributedBatchSampler(lengths, 4, accum, world, rank, seed=0)
        fresh.load_state_dict(state)
        fresh.set_epoch(2)  # a training loop calls this at the top of the epoch: keeps the resume point
        resumed.append(head + list(fresh))
    assert resumed == uninterrupted


def test_resume_on_a_different_number_of_processes(lengths):
    """The plan is global: 2 ranks x accum 2 can resume as 1 rank x accum 4 (same global batch)."""
    r0, r1 = _samplers(lengths, 4, 2, 2, epoch=1)
    steps_done = 7
    for s in (r0, r1):
        it = iter(s)
        for _ in range(steps_done * 2):
            next(it)
    single = DistributedBatchSampler(lengths, 4, 4, 1, 0, seed=0)
    single.load_state_dict(r0.state_dict())
    (reference,) = _samplers(lengths, 4, 4, 1, epoch=1)
    assert _steps(single) == _steps(reference)[steps_done:]


def test_resume_at_epoch_end_then_next_epoch(lengths):
    (s,) = _samplers(lengths, 8, 1, 1, epoch=0)
    list(s)
    state = s.state_dict()
    assert state["consumed_global_batches"] == s.steps_per_epoch
    fresh = DistributedBatchSampler(lengths, 8, 1, 1, 0, seed=0)
    fresh.load_state_dict(state)
    fresh.set_epoch(0)
    assert list(fresh) == []
    fresh.set_epoch(1)
    (reference,) = _samplers(lengths, 8, 1, 1, epoch=1)
    expected = list(reference)
    assert list(fresh) == expected and len(expected) == s.steps_per_epoch  # the next epoch, from its start
    assert list(fresh) == expected  # a finished epoch iterated again replays it


def test_resume_refuses_a_different_plan(lengths):
    state = DistributedBatchSampler(lengths, 4, 2, 2, 0, seed=0).state_dict()
    with pytest.raises(ConfigError, match="global_batch_size"):
        DistributedBatchSampler(lengths, 4, 1, 2, 0, seed=0).load_state_dict(state)
    with pytest.raises(ConfigError, match="seed"):
        DistributedBatchSampler(lengths, 4, 2, 2, 0, seed=1).load_state_dict(state)


def test_invalid_arguments():
    with pytest.raises(ConfigError, match="no step"):
        DistributedBatchSampler(list(range(10)), 4, 2, 2, 0, seed=0)
    with pytest.raises(ConfigError, match="rank"):
        DistributedBatchSampler(list(range(100)), 4, 2, 2, 2, seed=0)
    with pytest.raises(ConfigError, match="--micro-batch-size"):
        DistributedBatchSampler(list(range(100)), 0, 2, 2, 0, seed=0)


def test_padding_rate_definition():
    assert padding_rate([2, 4, 3, 3], [[0, 1], [2, 3]]) == pytest.approx(2 / 14)
    assert padding_rate([5, 5], [[0, 1]]) == 0.0


def test_bucketing_cuts_padding(lengths):
    result = compare_padding(lengths, micro_batch_size=8)
    assert result.bucketed < 0.05 < 0.2 < result.random
    assert result.ratio == pytest.approx(result.random / result.bucketed)
    assert "bucketed" in result.summary()


def _step_length_ranges(lengths, mb, accum, world, bucketed):
    """(shortest, longest) sample of each optimizer step, over all ranks' micro-batches of that step."""
    per_rank = [_steps(s) for s in _samplers(lengths, mb, accum, world, bucketed=bucketed)]
    ranges = []
    for k in range(len(per_rank[0])):
        step = [lengths[steps[k]] for steps in per_rank]
        ranges.append((min(x.min() for x in step), max(x.max() for x in step)))
    return ranges


def _overlapping_steps(ranges):
    ordered = sorted(ranges)
    return sum(1 for (_, hi), (lo, _) in zip(ordered, ordered[1:]) if lo < hi)


@pytest.mark.parametrize("world,accum", [(2, 2), (4, 1)])
def test_all_ranks_of_a_step_draw_from_one_length_bucket(lengths, world, accum):
    """The fixture is one mega-chunk (62 global batches <= 64): steps cut it into disjoint length ranges.

    So all ranks' micro-batches of a step lie within the step's bucket: no sample of another step is
    strictly longer than the step's shortest and shorter than its longest. Random batching breaks it.
    """
    assert _overlapping_steps(_step_length_ranges(lengths, 4, accum, world, bucketed=True)) == 0
    assert _overlapping_steps(_step_length_ranges(lengths, 4, accum, world, bucketed=False)) > 10
    # within a step, rank r's samples are not longer than rank r+1's (the r-th part of the sorted bucket)
    for steps in zip(*(_steps(s) for s in _samplers(lengths, 4, accum, world))):
        for mine, next_rank in zip(steps, steps[1:]):
            assert lengths[mine].max() <= lengths[next_rank].min()


def test_wait_fraction_hand_built():
    # step 1: ranks do 2 and 4 units (the first waits 2 of 8 rank-units); step 2: balanced (4 and 4)
    assert wait_fraction([[2, 4], [4, 4]]) == pytest.approx(2 / 16)
    assert wait_fraction([[3, 3], [3, 3]]) == 0.0
    assert wait_fraction([[0, 0]]) == 0.0


@pytest.mark.parametrize("world,accum", [(2, 2), (4, 1)])
def test_rank_costs_are_the_plan_padded_positions(lengths, world, accum):
    costs = rank_step_costs(lengths, 4, accum, world, seed=0, epoch=1)
    assert costs.shape == (world, len(lengths) // (4 * accum * world))
    micro = epoch_micro_batches(lengths, 4, accum, world, seed=0, epoch=1, bucketed=True)
    assert costs.sum() == sum(len(b) * lengths[b].max() for b in micro)


def test_one_bucket_per_step_keeps_ranks_from_waiting(lengths):
    wait = compare_rank_wait(lengths, 4, 2, 2)
    assert wait.bucketed < 0.03 and wait.random > 0.08   # measured here: ~1.7 % and ~11 %
    assert "bucketed" in wait.summary()
