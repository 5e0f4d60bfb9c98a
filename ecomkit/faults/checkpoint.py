"""Checkpoints that survive a killed rank: DCP, atomic directories, keep-last-k, async saves, run state.

Why DCP: each rank writes its own shards and a checkpoint loads at another world size. A save goes into
``.tmp-step_*`` and becomes ``step_*`` by one ``os.rename`` on rank 0, so a kill leaves the old or the new one, never
half of one; the folder must be shared by all ranks. Loading goes through :mod:`ecomkit.faults.safe_load`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ecomkit.errors import EcomkitError
from ecomkit.faults.safe_load import METADATA, SafeFileSystemReader, SafeLoadPlanner

# DCP warns "assuming ... single process" on every single-process call, also from async_save's thread.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

STEP_DIR = re.compile(r"^step_(\d{8})$")
TMP_PREFIX = ".tmp-"
TRAINER_STATE = "trainer_state.json"


def step_dir_name(step: int) -> str:
    """Zero-padded, so the names sort in step order in any file browser."""
    return f"step_{step:08d}"


def is_complete(path: Path) -> bool:
    """A final name, DCP's metadata (written last, by the coordinator) and the trainer state."""
    return bool(STEP_DIR.match(path.name)) and (path / METADATA).is_file() and (path / TRAINER_STATE).is_file()


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first; temp dirs are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(STEP_DIR.match(p.name).group(1)), p) for p in root.iterdir()
             if p.is_dir() and STEP_DIR.match(p.name) and is_complete(p)]
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest *complete* checkpoint, the one a restarted job resumes from (None: start fresh)."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def remove_stale_temp_dirs(root: Path) -> list[Path]:
    """Delete ``.tmp-*`` directories left by a job killed mid-save (call on rank 0 before any save)."""
    stale = [p for p in root.glob(TMP_PREFIX + "*") if p.is_dir()] if root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def prune_checkpoints(root: Path, keep_last: int) -> list[Path]:
    """Keep the newest ``keep_last`` complete checkpoints (``keep_last <= 0`` keeps all)."""
    if keep_last <= 0:
        return []
    old = [p for _, p in list_checkpoints(root)[:-keep_last]]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


def _fsync_dir(path: Path) -> None:
    """Make a rename durable: the directory entry itself must reach the disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: Path, final: Path) -> None:
    """The atomic step: rename the finished temp dir to its final name (rank 0 only)."""
    if final.exists():  # only if the same step is saved twice in one directory
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(final.parent)


def write_json_file(path: Path, obj: Any) -> None:
    """JSON, flushed and fsynced before the directory is committed, so a committed checkpoint is whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def read_json_file(path: Path) -> Any:
    """A checkpoint's JSON file, with an error that says which step directory to delete when it is damaged."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EcomkitError(f"{path} is missing: the checkpoint directory {path.parent} is incomplete. "
                           "Delete it (or pick an older step_* directory) and resume again.") from None
    except json.JSONDecodeError as exc:
        raise EcomkitError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg}); the checkpoint is damaged. "
                           "Delete this step_* directory to resume from the previous one.") from None


def _single_process() -> bool:
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns "assuming single process" even when told ``no_dist=True``; that is our intent, so hush it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def load_dcp(path: str | os.PathLike, state: dict[str, Any], group: Any = None) -> None:
    """Load a DCP checkpoint into ``state`` in place (safe reader), unwrapping DCP's ``CheckpointException``."""
    SafeFileSystemReader(str(path)).read_metadata()  # refuse a crafted .metadata with our own error
    try:
        with _quiet_single_process():
            dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner(),
                     process_group=group, no_dist=_single_process())
    except CheckpointException as exc:
        for rank, (inner, _trace) in sorted(exc.failures.items()):
            if isinstance(inner, EcomkitError):
                raise type(inner)(f"{path} (rank {rank}): {inner}") from None
        raise


@dataclass
class SaveRecord:
    """Timing of one save: ``blocking_s`` is what the training loop waited for."""

    step: int
    path: str
    blocking_s: float
    total_s: float | None = None
    asynchronous: bool = False


@dataclass
class PendingSave:
    """An async save in flight; :meth:`finish` waits for it and commits on rank 0."""

    future: Any
    tmp: Path
    final: Path
    record: SaveRecord
    started: float
    is_main: bool
    keep_last: int
    written_at: float | None = None

    def __post_init__(self) -> None:
        self.future.add_done_callback(self._mark_written)

    def _mark_written(self, _future: Any) -> None:
        self.written_at = time.perf_counter()

    def done(self) -> bool:
        return self.future.done()

    def finish(self) -> SaveRecord:
        self.future.result()  # re-raises a failed background write here, in the training thread
        self.record.total_s = (self.written_at or time.perf_counter()) - self.started
        if self.is_main:
            commit(self.tmp, self.final)
            prune_checkpoints(self.final.parent, self.keep_last)
        return self.record


@dataclass
class CheckpointWriter:
    """Writes ``step_*`` checkpoints under ``root`` atomically; optionally asynchronously.

    ``group``: the process group DCP coordinates over (a dedicated gloo group for async). All ranks call :meth:`save`.
    """

    root: Path
    keep_last: int = 2
    use_async: bool = False
    group: Any = None
    rank: int = 0
    pending: PendingSave | None = None
    records: list[SaveRecord] = field(default_factory=list)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def save(self, step: int, state: dict[str, Any], json_files: dict[str, Any] | None = None) -> SaveRecord:
        """Write ``state`` (DCP) plus this rank's JSON files (``name -> object``) into a temp dir, then commit it."""
        self.wait()  # never two saves in flight: the second would race the first's commit
        t0 = time.perf_counter()
        tmp, final = self.root / f"{TMP_PREFIX}{step_dir_name(step)}", self.root / step_dir_name(step)
        tmp.mkdir(parents=True, exist_ok=True)
        for name, obj in (json_files or {}).items():
            write_json_file(tmp / name, obj)
        writer = FileSystemWriter(str(tmp), sync_files=True)
        if self.use_async:
            with _quiet_single_process():
                future = dcp.async_save(state, storage_writer=writer, process_group=self.group,
                                        no_dist=_single_process())
            record = SaveRecord(step, str(final), time.perf_counter() - t0, asynchronous=True)
            self.pending = PendingSave(future, tmp, final, record, t0, self.is_main, self.keep_last)
        else:
            with _quiet_single_process():
                dcp.save(state, storage_writer=writer, process_group=self.group, no_dist=_single_process())
            record = SaveRecord(step, str(final), 0.0)
            if self.is_main:
                commit(tmp, final)
                prune_checkpoints(self.root, self.keep_last)
            record.blocking_s = record.total_s = time.perf_counter() - t0
        self.records.append(record)
        return record

    def poll(self) -> None:
        """Commit a finished async save without blocking (call once per step)."""
        if self.pending is not None and self.pending.done():
            self.wait()

    def wait(self) -> None:
        """Block until the async save in flight (if any) is written and committed."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.finish()


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states as JSON (no pickle)."""
    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rng_state`: dropout masks after a resume are the ones the uninterrupted run drew."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_from_b64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([_from_b64(s) for s in state["cuda"]])


def _base_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """Accelerate wraps the optimizer; DCP's state-dict helpers need the torch one."""
    return getattr(optimizer, "optimizer", optimizer)


# Optimizer state flat, one key per parameter and setting: pipeline stages' param_groups differ, and DCP writes a
# non-tensor key that several ranks save only once.
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def model_optimizer_state(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` by canonical names, so DDP, FSDP2, pipeline stages and a module agree."""
    msd, osd = get_state_dict(model, _base_optimizer(optimizer), options=_FLAT)
    return {"model": msd, "optim": osd}


def apply_model_optimizer_state(model: torch.nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Put a loaded :func:`model_optimizer_state` back (DCP loads into the tensors of a fresh state dict)."""
    set_state_dict(model, _base_optimizer(optimizer), model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_FLAT)



def read_checkpoint_summary(path: str | os.PathLike) -> dict[str, Any]:
    """Trainer state of one checkpoint (for notebooks): step, epoch, sampler position, world size."""
    return read_json_file(Path(path) / TRAINER_STATE)


__all__ = [
    "STEP_DIR", "TMP_PREFIX", "TRAINER_STATE", "CheckpointWriter", "PendingSave", "SaveRecord",
    "apply_model_optimizer_state", "capture_rng_state", "commit", "is_complete",
    "latest_checkpoint", "list_checkpoints", "load_dcp", "model_optimizer_state", "prune_checkpoints",
    "read_checkpoint_summary", "read_json_file", "remove_stale_temp_dirs", "restore_rng_state", "step_dir_name",
    "write_json_file",
]
