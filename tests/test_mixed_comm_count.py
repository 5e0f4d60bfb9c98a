"""The collective counter sees c10d and functional collectives with their bytes (1-process gloo group)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ecomkit.parallel.comm_count import CollectiveCounter, CollectiveStats, merge_stats


def test_counter_records_kind_count_and_payload(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        import torch.distributed._functional_collectives as funcol

        x = torch.ones(10, dtype=torch.float32)
        with CollectiveCounter() as counter:
            dist.all_reduce(x)
            out = [torch.empty(10)]
            dist.all_gather(out, x)
            y = funcol.all_reduce(torch.ones(3, dtype=torch.float64), "sum", dist.group.WORLD)
            funcol.wait_tensor(y)
            torch.ones(4) @ torch.ones(4)  # not a collective
        stats = counter.pop_stats()
        assert stats.by_kind["all_reduce"].count == 2
        assert stats.by_kind["all_reduce"].payload_bytes == 10 * 4 + 3 * 8
        assert stats.by_kind["all_gather"].payload_bytes == 10 * 4
        assert stats.count == 3
        assert stats.wire_bytes == 0  # a group of one sends nothing
        assert counter.pop_stats().count == 0  # popped: the next step starts from zero
    finally:
        dist.destroy_process_group()


def test_wire_bytes_follow_the_ring_formulas():
    stats = CollectiveStats()
    stats.add("all_reduce", 1000, 4)
    stats.add("all_gather", 1000, 4)
    stats.add("recv", 1000, 2)
    assert stats.by_kind["all_reduce"].wire_bytes == 2 * 3 / 4 * 1000
    assert stats.by_kind["all_gather"].wire_bytes == 3 / 4 * 1000
    assert stats.by_kind["recv"].wire_bytes == 0
    merged = merge_stats([stats, stats])
    assert merged.count == 6 and merged.as_dict()["comm_payload_bytes"] == 6000
