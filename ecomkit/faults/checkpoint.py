"""Checkpoints that survive a killed rank: DCP, atomic directories, keep-last-k, async saves, safe loading.

Why ``torch.distributed.checkpoint`` (DCP) rather than ``torch.save`` on rank 0:
each rank writes its own shards in parallel (FSDP2/TP never gather the full
model), replicated DDP tensors are written once, and a checkpoint can be loaded
at another world size because DCP re-plans the reads from the saved metadata.

On-disk layout (``<output_dir>/checkpoints`` by default)::

    step_00000040/            complete: .metadata, __<rank>_<n>.distcp, trainer_state.json, rng_rank<r>.json
    .tmp-step_00000045/       being written, or left by a job killed mid-write: ignored, deleted at the next start

A checkpoint is written into a ``.tmp-`` directory and becomes visible only
through one ``os.rename`` (atomic on POSIX within one filesystem), done by rank 0
after DCP has finished on every rank. A job killed at any moment therefore
leaves either the previous checkpoint or the new one, never a half-written
``step_*`` directory. The directory must be one folder that every rank sees
(a shared filesystem on several nodes).

``async_save`` is the correct form of the EcomGPT guide's "start a subprocess
that runs torch.save" (which builds a shell string, cannot see the model of
the parent process and races with the next save): DCP copies the state to CPU
memory synchronously, then writes it from a background thread that talks over
its *own* gloo group (on the default group its collectives interleave with the
training ones and deadlock; shared CPU notes, trap 9). The future is waited on
before the next save and before exit.

Safe loading: DCP itself reads ``.metadata`` with ``pickle.load`` and non-tensor
entries with ``torch.load(weights_only=False)``, so a crafted checkpoint runs
code on load. :class:`SafeFileSystemReader` unpickles the metadata with an
allow-list of DCP's own classes and :class:`SafeLoadPlanner` loads non-tensor
entries with ``weights_only=True``; trainer state and RNG states are plain JSON.
:func:`load_weights_file` does the same for single ``.safetensors``/``.pt`` files.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import pickle
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from ecomkit.config import TrainConfig
from ecomkit.dist import log
from ecomkit.errors import ConfigError, EcomkitError

# DCP warns "assuming the intent is to save/load in a single process" on every single-process call, also
# from async_save's writer thread where a local catch_warnings cannot reach; that is our intent here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

STEP_DIR = re.compile(r"^step_(\d{8})$")
TMP_PREFIX = ".tmp-"
TRAINER_STATE = "trainer_state.json"
METADATA = ".metadata"
AUTO_MAX_INTERVAL = 100
STRATEGIES_WITHOUT_DCP = {"zero": "DeepSpeed keeps its own sharded engine state (use --zero-checkpoint-interval, "
                                  "ecomkit.parallel.zero.checkpoint)",
                          "pp": "pipeline stages hold different sub-modules on each rank"}


class UnsafeCheckpointError(EcomkitError):
    """A checkpoint file asked to unpickle something other than tensors and plain data."""


# ---------------------------------------------------------------------- directories
def checkpoint_root(cfg: TrainConfig) -> Path:
    return Path(cfg.fault.checkpoint_dir or Path(cfg.output_dir) / "checkpoints")


def step_dir_name(step: int) -> str:
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
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def read_json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EcomkitError(f"{path} is missing: the checkpoint directory {path.parent} is incomplete. "
                           "Delete it (or pick an older step_* directory) and resume again.") from None
    except json.JSONDecodeError as exc:
        raise EcomkitError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg}); the checkpoint is damaged. "
                           "Delete this step_* directory to resume from the previous one.") from None


# ---------------------------------------------------------------------- safe reading
_SAFE_GLOBALS = {
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
}
_SAFE_CLASS_MODULES = ("torch.distributed.checkpoint.metadata",)


class _MetadataUnpickler(pickle.Unpickler):
    """Only DCP's metadata dataclasses, torch dtypes/sizes and paths: nothing that can run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module in _SAFE_CLASS_MODULES:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and obj.__module__ == module:
                return obj
        raise UnsafeCheckpointError(
            f"refusing to load checkpoint metadata that references {module}.{name}: a DCP .metadata file only "
            "holds DCP's own metadata classes, so this file was crafted or corrupted. Never load checkpoints from "
            "an untrusted source; if you wrote this file yourself, re-save it with this version of ecomkit.")


class SafeFileSystemReader(FileSystemReader):
    """DCP's filesystem reader with an allow-list unpickler for ``.metadata`` (upstream uses ``pickle.load``)."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        name = METADATA if rank is None else f"__{rank}{METADATA}"
        path = Path(str(self.path)) / name
        try:
            with open(path, "rb") as fh:
                metadata = _MetadataUnpickler(fh).load()
        except FileNotFoundError:
            raise EcomkitError(f"{path} does not exist: {path.parent} is not a complete DCP checkpoint "
                               "(it was probably interrupted while being written).") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor entries (optimizer hyper-parameters, ...) are loaded with ``weights_only=True``."""

    def load_bytes(self, read_item, value) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpointError(
                f"refusing to unpickle checkpoint entry '{read_item.dest_index.fqn}': it holds more than tensors "
                f"and plain Python values (torch.load(weights_only=True) said: {str(exc).splitlines()[0]}). "
                "Never load checkpoints from an untrusted source.") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_weights_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a single weights file safely: safetensors, or ``torch.load(weights_only=True)`` for .pt/.bin."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains pickled Python objects that are not tensors or plain data "
            f"(torch.load(weights_only=True) said: {str(exc).splitlines()[0]}). Loading it with "
            "weights_only=False would run whatever code the file names; only do that for a file you made "
            "yourself, and prefer safetensors.") from None


def _single_process() -> bool:
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns "assuming single process" even when told ``no_dist=True``; that is our intent, so hush it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def load_dcp(path: str | os.PathLike, state: dict[str, Any], group: Any = None) -> None:
    """Load a DCP checkpoint into ``state`` in place, with the safe reader and planner.

    DCP wraps every rank's exception into one ``CheckpointException`` (a
    ``BaseException``); ours are unwrapped so the caller sees the clear message.
    """
    from torch.distributed.checkpoint.api import CheckpointException

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


# ---------------------------------------------------------------------- writing
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

    ``group`` is the process group DCP coordinates over (a dedicated gloo group in
    training: required for async, harmless for sync). All ranks call :meth:`save`
    at the same step with the same ``step``.
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
        """Write ``state`` (DCP) plus per-rank JSON files into a temp dir, then commit it.

        ``json_files`` maps file names to JSON-able objects this rank writes
        (rank 0 writes the trainer state, every rank its RNG state).
        """
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


# ---------------------------------------------------------------------- training state
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


def model_optimizer_state(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` keyed by canonical names, so DDP, FSDP2 and a plain module agree."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, _base_optimizer(optimizer))
    return {"model": msd, "optim": osd}


def apply_model_optimizer_state(model: torch.nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, _base_optimizer(optimizer), model_state_dict=state["model"], optim_state_dict=state["optim"])


def trainer_state(run: Any) -> dict[str, Any]:
    """Everything besides tensors needed to continue exactly where ``run`` is now."""
    strategy = run.strategy
    return {
        "step": run.step, "epoch": run.epoch, "total_steps": run.total_steps,
        "world_size": run.env.world_size, "global_batch": run.global_batch(), "strategy": strategy.name,
        "sampler": run.sampler.state_dict(),
        "scheduler": strategy.scheduler.state_dict() if strategy.scheduler is not None else None,
        "scaler": strategy.scaler.state_dict() if getattr(strategy, "scaler", None) is not None else None,
        "saved_at": time.time(),
    }


# ---------------------------------------------------------------------- config
def validate_fault_config(cfg: TrainConfig) -> None:
    f = cfg.fault
    if f.checkpoint_interval < -1:
        raise ConfigError(f"fault.checkpoint_interval={f.checkpoint_interval}: use a number of steps > 0, "
                          "0 to switch checkpoints off, or -1 for automatic.")
    if f.health_interval < 0 or f.hang_dump_s < 0:
        raise ConfigError("fault.health_interval and fault.hang_dump_s must be >= 0 (0 switches them off).")
    if f.straggler_factor <= 1:
        raise ConfigError(f"fault.straggler_factor={f.straggler_factor} must be > 1 (e.g. 2: warn when a rank "
                          "is twice as slow as the others).")
    reason = dcp_unsupported_reason(cfg)
    if f.checkpoint_interval > 0 and reason:
        raise ConfigError(
            f"--fault-checkpoint-interval is not supported with --strategy {cfg.strategy}: {reason}, which these "
            "DCP checkpoints do not cover. Use --strategy ddp/accelerate/fsdp/tp, or --fault-checkpoint-interval 0.")


def dcp_unsupported_reason(cfg: TrainConfig) -> str | None:
    """Why this run's state is not one DCP state dict of (model, optimizer), or None if it is."""
    if cfg.strategy == "mixed" and cfg.parallel.pp > 1:
        return STRATEGIES_WITHOUT_DCP["pp"]
    return STRATEGIES_WITHOUT_DCP.get(cfg.strategy)


def restarts_possible() -> bool:
    """torchrun exports its --max-restarts to the workers; > 0 means a restart could resume."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0


def checkpoints_requested(cfg: TrainConfig) -> bool:
    """Explicitly (interval > 0), or automatically (-1) when a restart or an injected fault can use them."""
    interval = cfg.fault.checkpoint_interval
    auto = interval == -1 and dcp_unsupported_reason(cfg) is None
    return interval > 0 or (auto and (cfg.fail_at_step >= 0 or restarts_possible()))


def effective_checkpoint_interval(cfg: TrainConfig, total_steps: int) -> int:
    """Steps between checkpoints; ``-1`` (auto) means ~5 % of the run, between 1 and 100 steps.

    Auto only switches checkpoints on when something can use them: torchrun
    was given ``--max-restarts > 0`` or a fault is injected. A plain run then
    writes nothing, and a rerun into the same output directory starts fresh.
    """
    if not checkpoints_requested(cfg):
        return 0
    if cfg.fault.checkpoint_interval > 0:
        return cfg.fault.checkpoint_interval
    return max(1, min(AUTO_MAX_INTERVAL, math.ceil(total_steps / 20)))


# ---------------------------------------------------------------------- the callback
class CheckpointCallback:
    """Saves every ``interval`` steps and, on start, resumes from the newest complete checkpoint.

    ``resuming`` is decided at construction (before the loop opens its metrics
    file), so a resumed run appends to ``metrics.jsonl`` instead of truncating it.
    """

    def __init__(self, cfg: TrainConfig):
        validate_fault_config(cfg)
        self.cfg, self.root = cfg, checkpoint_root(cfg)
        self.resume_from = latest_checkpoint(self.root) if cfg.fault.resume else None
        self.resuming = self.resume_from is not None
        self.interval = 0
        self.writer: CheckpointWriter | None = None
        self.resumed_step: int | None = None
        self.restore_s: float | None = None

    # ---- hooks
    def on_train_start(self, run: Any) -> None:
        env = run.env
        self.interval = effective_checkpoint_interval(self.cfg, run.total_steps)
        group = None
        if env.distributed:
            # Its own gloo group: DCP's background collectives never meet the training ones (trap 9).
            import datetime as _dt

            group = dist.new_group(backend="gloo", timeout=_dt.timedelta(seconds=self.cfg.timeout_s))
        self.writer = CheckpointWriter(self.root, self.cfg.fault.keep_last, self.cfg.fault.async_checkpoint,
                                       group, env.rank)
        if env.is_main and self.interval:
            for p in remove_stale_temp_dirs(self.root):
                log.info("checkpoint: removed %s (a save interrupted by the previous attempt)", p.name)
        path = self._agree_on_resume_path(env, group)
        if path is not None:
            self._restore(run, path)
        if env.distributed:
            dist.barrier(group=group)  # nobody writes into the root before rank 0 has cleaned it
        if env.is_main and self.interval:
            mode = "async (own gloo group)" if self.cfg.fault.async_checkpoint else "sync"
            log.info("checkpoint: every %d steps into %s, %s, keep last %d", self.interval, self.root, mode,
                     self.cfg.fault.keep_last)

    def on_step_end(self, run: Any, row: dict[str, Any]) -> None:
        if self.writer is None:
            return
        self.writer.poll()
        if self.interval and run.step % self.interval == 0 and run.step < run.total_steps:
            self.save(run)

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        if self.writer is None:
            return
        self.writer.wait()
        recs = self.writer.records
        summary["checkpoint"] = {
            "interval": self.interval, "async": self.cfg.fault.async_checkpoint, "dir": str(self.root.resolve()),
            "saves": len(recs), "saved_steps": [r.step for r in recs],
            "blocking_s": [round(r.blocking_s, 4) for r in recs],
            "total_s": [round(r.total_s, 4) if r.total_s is not None else None for r in recs],
            "resumed_from_step": self.resumed_step, "restore_s": self.restore_s,
        }

    # ---- work
    def save(self, run: Any) -> SaveRecord:
        state = model_optimizer_state(run.strategy.raw_model, run.strategy.optimizer)
        files: dict[str, Any] = {f"rng_rank{run.env.rank}.json": capture_rng_state()}
        if run.env.is_main:
            files[TRAINER_STATE] = trainer_state(run)
        return self.writer.save(run.step, state, files)

    def _agree_on_resume_path(self, env: Any, group: Any) -> Path | None:
        """Rank 0's choice wins; a rank that cannot see it has a checkpoint dir that is not shared."""
        if not env.distributed:
            return self.resume_from
        choice = [str(self.resume_from) if self.resume_from else None]
        dist.broadcast_object_list(choice, src=0, group=group)
        path = Path(choice[0]) if choice[0] else None
        if path is not None and not is_complete(path):
            raise EcomkitError(
                f"[rank {env.rank}] rank 0 resumes from {path}, but this rank cannot see that complete checkpoint. "
                "--fault-checkpoint-dir must be a folder that every node sees (a shared filesystem).")
        return path

    def _restore(self, run: Any, path: Path) -> None:
        t0 = time.perf_counter()
        strategy, env = run.strategy, run.env
        ts = read_json_file(path / TRAINER_STATE)
        if ts["total_steps"] != run.total_steps:
            log.warning("checkpoint %s was written by a run of %d steps; this run has %d, so the learning-rate "
                        "schedule continues on the new length", path.name, ts["total_steps"], run.total_steps)
        state = model_optimizer_state(strategy.raw_model, strategy.optimizer)
        load_dcp(path, state, self.writer.group)
        apply_model_optimizer_state(strategy.raw_model, strategy.optimizer, state)
        if strategy.scheduler is not None and ts.get("scheduler") is not None:
            strategy.scheduler.load_state_dict(ts["scheduler"])
        if getattr(strategy, "scaler", None) is not None and ts.get("scaler"):
            strategy.scaler.load_state_dict(ts["scaler"])
        run.sampler.load_state_dict(ts["sampler"])
        run.step, run.epoch = int(ts["step"]), int(ts["epoch"])
        rng_file = path / f"rng_rank{env.rank}.json"
        if ts["world_size"] == env.world_size and rng_file.is_file():
            restore_rng_state(read_json_file(rng_file))
        elif env.is_main:
            log.warning("resuming at world size %d from a checkpoint written at %d: random-number streams are "
                        "per rank, so they restart from the seed (data order is unaffected)",
                        env.world_size, ts["world_size"])
        self.resumed_step, self.restore_s = run.step, round(time.perf_counter() - t0, 4)
        if env.is_main:
            log.info("resumed from %s: step %d, epoch %d, %d global batches of this epoch already seen (%.2f s)",
                     path, run.step, run.epoch, ts["sampler"]["consumed_global_batches"], self.restore_s)


def add_fault_tolerance_callbacks(cfg: TrainConfig, callbacks: Iterable[Any] = ()) -> list[Any]:
    """``callbacks`` plus chapter 07's: checkpoints (when requested) and the health monitor (when on).

    Called by :func:`ecomkit.train.run_training`; kinds already present are not added twice.
    """
    from ecomkit.faults.health import HealthMonitor

    out = list(callbacks)
    validate_fault_config(cfg)
    if checkpoints_requested(cfg) and not any(isinstance(c, CheckpointCallback) for c in out):
        out.append(CheckpointCallback(cfg))
    if (cfg.fault.health_interval > 0 or cfg.fault.hang_dump_s > 0) and not any(
            isinstance(c, HealthMonitor) for c in out):
        out.append(HealthMonitor(cfg))
    return out


def read_checkpoint_summary(path: str | os.PathLike) -> dict[str, Any]:
    """Trainer state of one checkpoint (for notebooks): step, epoch, sampler position, world size."""
    return read_json_file(Path(path) / TRAINER_STATE)


__all__: Sequence[str] = (
    "CheckpointCallback", "CheckpointWriter", "SafeFileSystemReader", "SafeLoadPlanner", "UnsafeCheckpointError",
    "add_fault_tolerance_callbacks", "checkpoint_root", "effective_checkpoint_interval", "latest_checkpoint",
    "list_checkpoints", "load_dcp", "load_weights_file", "model_optimizer_state", "read_checkpoint_summary",
)
