"""No host read of a tensor in a training step between log intervals (``--log-interval``; train/loop.py's StepTensors).

A read (``.item()``, ``float(t)``, ``.tolist()``) of a CUDA tensor makes the host wait for the GPU, so the next
step's kernels are not queued in time. On this CPU the same reads show in the profiler as ``aten::item`` (and
``aten::_local_scalar_dense``) calls: the run below profiles steps 2 and 3 of a 4-step log interval and counts
them, with the steps' data loading, forward, backward, clipping and optimizer step all inside the window.

The same window also counts the operators whose output size depends on a tensor's values (``nonzero``,
``masked_select``, ``unique``): on the CPU they read nothing, but on a GPU each one makes the host wait to size
its result. On a CUDA machine a second test runs the window under ``torch.cuda.set_sync_debug_mode("error")``,
which raises at any synchronisation.

Excepted: the reads inside ``aten::_fused_adamw_``. Its CPU kernel reads each parameter's step counter, which
lives on the host for a CPU model; the CUDA kernel takes the counters as device tensors and reads nothing.
"""

from __future__ import annotations

import pytest
import torch

from ecomkit.config import TrainConfig
from ecomkit.train.loop import run_training

READS = ("aten::item", "aten::_local_scalar_dense",
         "aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2")  # the last four: sized by values
CPU_ONLY_READERS = ("aten::_fused_adamw_",)   # reads host step counters on CPU only (module docstring)


class SyncDebug:
    """Steps after ``first`` up to ``last`` under ``torch.cuda.set_sync_debug_mode("error")`` (CUDA only)."""

    def __init__(self, first: int, last: int):
        self.first, self.last, self.ran = first, last, False

    def on_step_end(self, run, row) -> None:
        if run.step == self.first:
            torch.cuda.set_sync_debug_mode("error")
        elif run.step == self.last:
            torch.cuda.set_sync_debug_mode("default")
            self.ran = True


class StepProfiler:
    """Profiles the steps after ``first`` up to ``last`` (training only: on_step_end bounds the window)."""

    def __init__(self, first: int, last: int):
        self.first, self.last, self.prof, self.reads = first, last, None, []

    def on_step_end(self, run, row) -> None:
        if run.step == self.first:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.prof.__enter__()
        elif run.step == self.last:
            self.prof.__exit__(None, None, None)
            self.reads = [e for e in self.prof.events() if e.name in READS and not _under(e, CPU_ONLY_READERS)]


def _under(event, names) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


@pytest.mark.parametrize("packing", ["on", "off"])
def test_steps_between_log_intervals_read_no_tensor(tmp_path, packing):
    prof = StepProfiler(first=1, last=3)      # steps 2 and 3; the log interval's read comes at step 4
    summary = run_training(TrainConfig(max_steps=8, log_interval=4, eval_interval=0, eval_batches=1, packing=packing,
                                       final_eval_samples=8, save_model=False, progress=False, report_to="none",
                                       output_dir=str(tmp_path)), [prof])
    assert summary["steps"] == 8 and summary["final_loss"] < summary["first_loss"]
    callers = sorted({" < ".join(_chain(e)) for e in prof.reads})
    assert not prof.reads, f"{len(prof.reads)} host reads in two steps between log intervals: {callers}"


def _chain(event) -> list[str]:
    out, parent = [event.name], event.cpu_parent
    while parent is not None and len(out) < 4:
        out.append(parent.name)
        parent = parent.cpu_parent
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU test above counts the same reads)")
@pytest.mark.parametrize("packing", ["on", "off"])
def test_cuda_steps_between_log_intervals_do_not_synchronise(tmp_path, packing):
    watch = SyncDebug(first=1, last=3)
    try:
        summary = run_training(TrainConfig(max_steps=8, log_interval=4, eval_interval=0, eval_batches=1,
                                           packing=packing, precision="bf16", final_eval_samples=8,
                                           save_model=False, progress=False, report_to="none",
                                           output_dir=str(tmp_path)), [watch])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert watch.ran and summary["steps"] == 8
