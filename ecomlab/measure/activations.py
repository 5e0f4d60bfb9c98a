"""Measure activation memory: saved-tensor bytes, live tensor bytes on CPU, ``max_memory_allocated`` on GPU.

Why three instruments:

- :class:`SavedTensorCounter` sums what autograd *saves for backward* (the
  textbook "activations"), with ``torch.autograd.graph.saved_tensors_hooks``.
  Each storage is counted once at its full size, and parameters are skipped
  (a ``Linear`` saves its weight, which is model state, not activation). This
  is what the planner's activation formula predicts term by term. Caveat: the
  default (non-reentrant) activation checkpoint keeps each block's *input*
  alive through a closure, not through a saved tensor, so the hooks cannot see
  it; use ``use_reentrant=True`` when counting checkpointed models with hooks.
- :class:`LiveTensorTracker` follows every storage an operator creates (a
  ``TorchDispatchMode``) and drops it when the storage is freed, so it gives the
  bytes alive at any moment and the peak: on CPU, the analogue of CUDA's
  ``max_memory_allocated``. ``tracemalloc`` does not see tensor memory and RSS
  mixes in the Python runtime; this sees tensors only.
- :func:`cuda_peak` wraps ``torch.cuda.reset_peak_memory_stats`` /
  ``max_memory_allocated`` for the same step on a GPU.

:func:`measure_step_memory` runs one forward + backward of a causal LM and
returns all of them for that step.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ecomkit.models.bloom import disable_activation_checkpointing, enable_activation_checkpointing
from ecomkit.models.loss import token_loss_sum
from ecomkit.parallel.state_bytes import storage_key
from ecomlab.timing import timed


class SavedTensorCounter:
    """Context manager: bytes of the distinct storages autograd saves for backward (parameters excluded).

    ``records`` keeps (shape, dtype, bytes) of each counted storage, in the
    order they were saved, so a notebook can show which operation keeps what.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = {k[0] for k in (storage_key(t) for t in exclude) if k is not None}
        self._seen: dict[int, int] = {}
        self.records: list[tuple[tuple[int, ...], str, int]] = []
        self._hooks: Any = None

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key is not None and key[0] not in self._excluded and key[0] not in self._seen:
            self._seen[key[0]] = key[1]
            self.records.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), key[1]))
        return t

    def __enter__(self) -> "SavedTensorCounter":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, dtype, nbytes in self.records:
            out[dtype] = out.get(dtype, 0) + nbytes
        return out


class LiveTensorTracker(TorchDispatchMode):
    """Bytes of tensor storages created inside the context that are still alive; ``peak`` is their maximum.

    Storages that existed before entering (parameters, optimizer states) are
    not counted, so ``live()`` right after a forward is the memory that
    forward left behind (saved activations, checkpoint inputs, logits), and
    ``peak`` over forward + backward is the step's activation + temporary peak.
    The check for freed storages runs after every operator, so the peak is
    exact to one operator. Overhead: a few microseconds per operator.
    """

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, tuple[StorageWeakRef, int]] = {}
        self._live = 0
        self.peak = 0
        self.marks: dict[str, int] = {}

    def _sweep(self) -> None:
        dead = [k for k, (ref, _) in self._refs.items() if ref.expired()]
        for k in dead:
            self._live -= self._refs.pop(k)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if st.nbytes() and st._cdata not in self._refs:
                    self._refs[st._cdata] = (StorageWeakRef(st), st.nbytes())
                    self._live += st.nbytes()
        self.peak = max(self.peak, self._live)
        self._sweep()
        return out

    def live(self) -> int:
        """Bytes alive now (of storages created inside the context)."""
        self._sweep()
        return self._live

    def mark(self, name: str) -> int:
        """Record ``live()`` under ``name`` (e.g. "after_forward") and return it."""
        self.marks[name] = self.live()
        return self.marks[name]


@contextlib.contextmanager
def cuda_peak(device: torch.device | None = None) -> Iterator[dict[str, int]]:
    """``with cuda_peak() as r:`` → ``r["peak"]`` = max_memory_allocated above the starting allocation."""
    result: dict[str, int] = {}
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    result["start"] = start
    try:
        yield result
    finally:
        torch.cuda.synchronize(device)
        result["peak"] = torch.cuda.max_memory_allocated(device) - start
        result["end"] = torch.cuda.memory_allocated(device) - start


# ---------------------------------------------------------------------- one measured step
@dataclass
class StepMemory:
    """What one forward + backward kept and needed, in bytes (and how long it took)."""

    saved_bytes: int                  # distinct storages saved for backward (hooks)
    live_after_forward: int | None    # everything the forward left alive (CPU tracker or CUDA allocator)
    peak: int | None                  # peak over forward + backward, above the model states
    seconds: float                    # wall time of forward + backward (without the tracker when timed)
    by_dtype: dict[str, int] = field(default_factory=dict)
    instrument: str = "cpu-tracker"


def causal_lm_loss(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   autocast: torch.dtype | None = None) -> torch.Tensor:
    """The training loop's loss (sum of next-token losses), with optional autocast."""
    ctx = (torch.autocast(input_ids.device.type, dtype=autocast) if autocast is not None
           else contextlib.nullcontext())
    with ctx:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return token_loss_sum(logits, input_ids)


def measure_step_memory(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                        autocast: torch.dtype | None = None, track_live: bool = True,
                        wrap: Callable[[], contextlib.AbstractContextManager] | None = None) -> StepMemory:
    """One forward + backward: saved-tensor bytes, live bytes after forward, peak, and the time.

    ``wrap`` adds a context around forward *and* backward (e.g.
    ``torch.autograd.graph.save_on_cpu``). On CUDA the live/peak numbers come
    from the caching allocator; on CPU from :class:`LiveTensorTracker`
    (``track_live=False`` skips it). Gradients are cleared afterwards.
    """
    params = list(model.parameters())
    wrap = wrap or contextlib.nullcontext
    on_cuda = input_ids.device.type == "cuda"
    counter = SavedTensorCounter(exclude=params)
    tracker = LiveTensorTracker() if (track_live and not on_cuda) else None
    live_after = peak = None
    start = time.perf_counter()
    if on_cuda:
        with cuda_peak(input_ids.device) as r, wrap():
            with counter:
                loss = causal_lm_loss(model, input_ids, attention_mask, autocast)
            live_after = torch.cuda.memory_allocated(input_ids.device) - r["start"]
            loss.backward()
            del loss
        peak = r["peak"]
    else:
        outer = tracker if tracker is not None else contextlib.nullcontext()
        with outer, wrap():
            with counter:
                loss = causal_lm_loss(model, input_ids, attention_mask, autocast)
            if tracker is not None:
                live_after = tracker.mark("after_forward")
            loss.backward()
            del loss
        if tracker is not None:
            peak = tracker.peak
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return StepMemory(counter.bytes, live_after, peak, seconds, counter.by_dtype(),
                      "cuda-allocator" if on_cuda else ("cpu-tracker" if tracker else "hooks-only"))


def time_step(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
              autocast: torch.dtype | None = None, repeats: int = 3,
              wrap: Callable[[], contextlib.AbstractContextManager] | None = None) -> float:
    """Median seconds of forward + backward, without any instrument (one warm-up run first).

    Timed by ``ecomlab.timing.timed``, the one timer (CUDA work is synchronised
    before the clock is read); gradients are cleared after every run.
    """
    wrap = wrap or contextlib.nullcontext

    def step() -> None:
        with wrap():
            causal_lm_loss(model, input_ids, attention_mask, autocast).backward()
        model.zero_grad(set_to_none=True)

    return timed(step, repeats=repeats, warmup=1, device=input_ids.device)


def enable_checkpointing(model: torch.nn.Module, reentrant: bool = False) -> None:
    """Per-block activation checkpointing in train mode (:func:`ecomkit.models.bloom.enable_activation_checkpointing`).

    ``reentrant=True`` makes the checkpoint save each block's inputs with
    ``save_for_backward``, which :class:`SavedTensorCounter` can see.
    """
    enable_activation_checkpointing(model, {"use_reentrant": reentrant})
    model.train()


def disable_checkpointing(model: torch.nn.Module) -> None:
    """Undo :func:`enable_checkpointing` (the train mode stays)."""
    disable_activation_checkpointing(model)


__all__ = ["SavedTensorCounter", "LiveTensorTracker", "cuda_peak", "StepMemory", "measure_step_memory",
           "time_step", "causal_lm_loss", "enable_checkpointing", "disable_checkpointing"]
