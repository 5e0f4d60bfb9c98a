"""The measuring instruments themselves: saved-tensor counting and the CPU live-tensor tracker."""

from __future__ import annotations

import torch

from ecomlab.measure.activations import LiveTensorTracker, SavedTensorCounter, measure_step_memory


def test_saved_counter_skips_parameters_and_counts_each_storage_once():
    lin = torch.nn.Linear(16, 32)
    x = torch.randn(8, 16, requires_grad=True)
    with SavedTensorCounter(exclude=lin.parameters()) as counter:
        y = lin(x)                 # saves x (and the weight, excluded)
        z = (y * y).sum()          # saves y twice: one storage
    z.backward()
    assert counter.bytes == x.numel() * 4 + y.numel() * 4
    assert len(counter.records) == 2


def test_live_tracker_sees_allocations_frees_and_the_peak():
    with LiveTensorTracker() as tracker:
        a = torch.ones(1024)             # 4 KiB
        b = torch.ones(2048)             # 8 KiB
        assert tracker.live() == 12 * 1024
        del b
        assert tracker.live() == 4 * 1024
        c = a * 2                        # another 4 KiB
        assert tracker.mark("end") == 8 * 1024
    assert tracker.peak == 12 * 1024
    del a, c


def test_step_memory_on_a_linear_model():
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50))
    model.config = None

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask):
            return type("Out", (), {"logits": self.inner(input_ids)})()

    ids = torch.randint(0, 50, (2, 6))
    m = measure_step_memory(Wrapper(), ids, torch.ones_like(ids))
    # embedding saves the ids (int64), the linear saves its input, the loss keeps fp32 log-probs [2·5, 50]
    assert m.saved_bytes >= ids.numel() * 8 + 2 * 6 * 8 * 4 + 2 * 5 * 50 * 4
    assert m.live_after_forward >= m.saved_bytes - ids.numel() * 8
    assert m.peak >= m.live_after_forward
