"""Chapter 07: diagnose a distributed job, explain its errors, and reproduce the common ones on CPU.

- :func:`diagnose`: environment lint (chapter 01's rules), a collective test
  and a checkpoint round trip through a directory every rank must see.
- :data:`KNOWN_ERRORS` and :func:`explain_error`: the errors people meet when
  training on several GPUs, each with its cause and fix, matched by text.
- ``reproduce_*``: the CPU-reproducible ones, run for real (OOM, address in
  use, world-size mismatch, tokenizer/embedding mismatch, unsafe checkpoint).
- Hangs: :class:`StallInjector` / :class:`SlowRank` (callbacks used by
  ``scripts/07_stall_demo.py``), :func:`explain_collective_failure` (turns
  gloo's "Timed out waiting 10000ms for recv" into a message that names the
  collective, its caller and the timeout) and :func:`run_stall_demo`, which
  launches the demo and takes ``py-spy dump`` of every rank while it hangs.

Getting the stacks of all ranks of a hung job, from cheapest to most detailed:
``fault.hang_dump_s`` (each rank prints its stacks when a step is too slow),
``kill -USR1 <worker pid>`` (faulthandler, registered by
:func:`install_stack_dump_signal`; never send it to the torchrun agent, which
would die of it), ``py-spy dump --pid <pid>`` (works even when Python is
stuck holding the GIL), ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (gloo names the ranks
that never arrived; checks collective shapes match), ``NCCL_DEBUG=INFO`` and,
on GPU, the NCCL flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE=2000``,
``TORCH_NCCL_DUMP_ON_TIMEOUT=1``: each rank writes its last collectives to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` on a timeout; read them with
``python -m torch.distributed.flight_recorder.fr_trace <dir>``).
"""

from __future__ import annotations

import datetime as _dt
import faulthandler
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ecomkit.dist import DistEnv, install_stack_dump_signal  # noqa: F401  (re-exported for chapter 07)
from ecomkit.errors import EcomkitError

# ---------------------------------------------------------------------- error catalogue
@dataclass(frozen=True)
class KnownError:
    """One error people meet, how to recognise it, why it happens and what to do."""

    key: str
    title: str
    patterns: tuple[str, ...]      # regular expressions matched against the error text
    cause: str
    fix: str
    reproduce: str                 # how this chapter reproduces it (or why it cannot on CPU)

    def matches(self, text: str) -> bool:
        return any(re.search(p, text, re.IGNORECASE) for p in self.patterns)


KNOWN_ERRORS: tuple[KnownError, ...] = (
    KnownError(
        "oom", "Out of memory",
        (r"CUDA out of memory", r"OutOfMemoryError", r"can't allocate memory", r"Cannot allocate memory"),
        "Parameters + gradients + optimizer states + activations of one micro-batch exceed the device memory "
        "(activations grow with micro-batch × sequence length); on GPU also fragmentation.",
        "Lower --micro-batch-size and raise --grad-accum (same global batch); --seq-len; bf16; activation "
        "checkpointing; ZeRO-2/3 or FSDP2 to shard states; optimizer offload; on GPU "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation. Plan with chapter 03's memory model.",
        "reproduce_oom(): one allocation larger than the machine"),
    KnownError(
        "collective_timeout", "Collective timeout (a hang that ends)",
        (r"Timed out waiting \d+ms", r"failed to pass monitoredBarrier", r"Watchdog caught collective operation "
         r"timeout", r"collective .* timed out", r"DistBackendError"),
        "At least one rank never reached the collective the others wait in: it stalled (slow storage, a "
        "throttled GPU, a deadlock), died, or took another code path (a rank-dependent `if` around a "
        "collective, unequal numbers of batches per rank).",
        "Get every rank's stack (fault.hang_dump_s, kill -USR1, py-spy dump, TORCH_DISTRIBUTED_DEBUG=DETAIL, the "
        "NCCL flight recorder) and find the rank that is elsewhere; make every rank run the same collectives. "
        "Keep the timeout short enough to fail fast (--timeout-s); raising it only hides the hang.",
        "scripts/07_stall_demo.py: one rank sleeps, the other fails after --timeout-s"),
    KnownError(
        "duplicate_gpu", "NCCL: Duplicate GPU detected",
        (r"Duplicate GPU detected",),
        "Two ranks use the same GPU: torch.cuda.set_device(LOCAL_RANK) missing, every rank given the same "
        "CUDA_VISIBLE_DEVICES, or --nproc_per_node larger than the number of GPUs.",
        "Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group (ecomkit.dist does, "
        "and refuses LOCAL_RANK >= GPU count); pass device_id to init_process_group; --nproc_per_node <= GPUs.",
        "needs NVIDIA GPUs and NCCL: cannot be reproduced on CPU (gloo lets two ranks share a CPU)"),
    KnownError(
        "address_in_use", "Address already in use (rendezvous port)",
        (r"EADDRINUSE", r"address already in use", r"failed to listen on any local network address"),
        "The rendezvous port (torchrun's default 29500) is held by another job or by a leftover process of a "
        "crashed run, so the TCPStore server of the new job cannot listen on it.",
        "torchrun --standalone (picks a free port) on one node; otherwise a distinct --master_port / "
        "--rdzv_endpoint HOST:PORT per job; find the holder with `ss -ltnp | grep PORT` and end it.",
        "reproduce_port_in_use(): two rendezvous servers on one port"),
    KnownError(
        "world_size_mismatch", "Rendezvous never completes (world size mismatch)",
        (r"clients joined", r"waiting for clients", r"rendezvous.*timed out"),
        "WORLD_SIZE (or --nnodes × --nproc_per_node) says more processes than actually start: a node was not "
        "launched, launched with another --nproc_per_node, or cannot reach the rendezvous host.",
        "Launch the same torchrun line (same --nnodes, --nproc_per_node, --rdzv_id, --rdzv_endpoint) on every "
        "node; check each node can reach HOST:PORT; use --nnodes MIN:MAX for elastic jobs.",
        "reproduce_world_size_mismatch(): a rendezvous for 3 that only 2 processes join"),
    KnownError(
        "vocab_mismatch", "Tokenizer/embedding size mismatch after adding tokens",
        (r"index out of range in self", r"srcIndex < srcSelectDimSize", r"device-side assert triggered"),
        "Tokens were added to the tokenizer (e.g. '®', 'SKU-' as special tokens) but the embedding matrix was not "
        "resized, so new ids are >= num_embeddings (on GPU this surfaces as a device-side assert).",
        "After adding tokens: model.resize_token_embeddings(len(tokenizer)) "
        "(ecomkit.models.tokenizer.resize_embeddings_for), before wrapping the model (DDP/FSDP/ZeRO) and building the "
        "optimizer; save the tokenizer next to the model.",
        "reproduce_embedding_mismatch(): add tokens, forward, IndexError; resize, forward works"),
    KnownError(
        "peer_died", "A peer rank died (connection closed/reset)",
        (r"Connection closed by peer", r"Connection reset by peer", r"NCCL communicator was aborted",
         r"exitcode\s*:\s*-9", r"SIGKILL"),
        "Another rank crashed or was killed (the kernel's OOM killer: exit code -9), so its sockets closed; this "
        "rank's error is a consequence, not the cause.",
        "Read torchrun's 'Root Cause (first observed failure)' block and that rank's log; for -9 check `dmesg` for "
        "the OOM killer. With --max-restarts N and checkpoints the job resumes by itself.",
        "the fault-injection run of this chapter (--fail-at-step K --fail-rank R)"),
    KnownError(
        "unsafe_checkpoint", "Checkpoint refused: pickled objects",
        (r"Weights only load failed", r"refusing to (load|unpickle)"),
        "The file contains pickled Python objects; unpickling runs whatever code the file names.",
        "Save weights as safetensors or DCP; load with weights_only=True (ecomkit.faults.checkpoint.load_weights_file). "
        "Only for a file you made yourself: torch.serialization.add_safe_globals([...]) for the exact classes.",
        "reproduce_unsafe_checkpoint(): a .pt file with an object that would run code"),
)


def explain_error(text: str) -> list[KnownError]:
    """Known errors whose patterns occur in ``text`` (a message, a traceback or a whole log)."""
    return [e for e in KNOWN_ERRORS if e.matches(text)]


def error_table() -> list[dict[str, str]]:
    """The catalogue as rows (title, cause, fix, reproduction) for a notebook table."""
    return [{"error": e.title, "cause": e.cause, "fix": e.fix, "reproduced by": e.reproduce} for e in KNOWN_ERRORS]


# ---------------------------------------------------------------------- collective failures
class CollectiveTimeoutError(EcomkitError):
    """A collective did not complete within the process-group timeout (a peer rank never arrived)."""


_TIMEOUT_TEXT = re.compile(r"Timed out|timed out|monitoredBarrier|Watchdog caught", re.IGNORECASE)
_PEER_GONE_TEXT = re.compile(r"Connection (closed|reset) by peer|communicator was aborted", re.IGNORECASE)


def _collective_frames(exc: BaseException) -> tuple[str | None, str | None]:
    """(public collective called, its callers outside torch) from the traceback of ``exc``.

    The outermost ``distributed_c10d`` frame is the API the program called
    (``all_reduce``), deeper ones are its helpers.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    for i, fr in enumerate(frames):
        if fr.filename.endswith("distributed_c10d.py"):
            outside = [f for f in frames[:i] if f"{os.sep}torch{os.sep}" not in f.filename]
            # innermost three callers, innermost first
            caller = " <- ".join(f"{_short_path(f.filename)}:{f.lineno} {f.name}()" for f in outside[::-1][:3])
            return fr.name, caller or None
    return None, None


def _short_path(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("ecomkit", "scripts", "tests"):
        if anchor in parts:
            return str(Path(*parts[parts.index(anchor):]))
    return path


def is_collective_failure(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, RuntimeError) and bool(_TIMEOUT_TEXT.search(text) or _PEER_GONE_TEXT.search(text))


def explain_collective_failure(exc: BaseException, timeout_s: float, rank: int | None = None) -> str:
    """One paragraph: which collective, where it was called, the timeout, the backend's words, what to do."""
    name, caller = _collective_frames(exc)
    who = f"rank {rank}: " if rank is not None else ""
    what = f"collective `{name}`" if name else "a collective"
    where = f" (called from {caller})" if caller else ""
    raw = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if _PEER_GONE_TEXT.search(str(exc)):
        return (f"{who}{what}{where} failed because a peer rank is gone (it crashed or was killed). The root cause "
                f"is on that rank: read torchrun's 'Root Cause' block. Backend said: {raw}")
    return (f"{who}{what}{where} timed out after {timeout_s:g} s, the process-group timeout (--timeout-s, "
            f"TrainConfig.timeout_s): at least one other rank never reached it. Backend said: {raw}. To see where "
            "every rank is: --fault-hang-dump-s N (stacks when a step is slow), kill -USR1 <worker pid>, "
            "py-spy dump --pid <pid>, TORCH_DISTRIBUTED_DEBUG=DETAIL (names the missing ranks), and on GPU "
            "NCCL_DEBUG=INFO plus TORCH_NCCL_TRACE_BUFFER_SIZE (flight recorder).")


def raise_explained(exc: BaseException, timeout_s: float, rank: int | None = None) -> None:
    """Re-raise a collective failure as :class:`CollectiveTimeoutError` with the explanation; others unchanged."""
    if is_collective_failure(exc):
        raise CollectiveTimeoutError(explain_collective_failure(exc, timeout_s, rank)) from exc
    raise exc


# ---------------------------------------------------------------------- fault injection for demos
class StallInjector:
    """Callback: rank ``rank`` sleeps ``seconds`` after step ``at_step`` (a hung data loader, a dead GPU...)."""

    def __init__(self, rank: int, at_step: int, seconds: float):
        self.rank, self.at_step, self.seconds = rank, at_step, seconds

    def on_train_start(self, run: Any) -> None:
        print(f"[rank {run.env.rank}] pid {os.getpid()} on {socket.gethostname()}", flush=True)

    def on_step_end(self, run: Any, row: dict[str, Any]) -> None:
        if run.env.rank == self.rank and run.step == self.at_step:
            print(f"[rank {run.env.rank}] stalling for {self.seconds:g} s after step {run.step} "
                  f"(pid {os.getpid()}): the other ranks now wait in their next collective", flush=True)
            time.sleep(self.seconds)


class SlowRank:
    """Callback: every forward of rank ``rank`` takes ``ms`` longer (a throttled GPU), for straggler detection."""

    def __init__(self, rank: int, ms: float):
        self.rank, self.ms = rank, ms
        self._handle = None

    def on_train_start(self, run: Any) -> None:
        if run.env.rank != self.rank or self.ms <= 0:
            return
        inner = next(iter(run.strategy.raw_model.children()))  # inside the model, so the forward timer sees it
        self._handle = inner.register_forward_hook(lambda *_: time.sleep(self.ms / 1000.0))

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        if self._handle is not None:
            self._handle.remove()


# ---------------------------------------------------------------------- the stall demo, watched from outside
@dataclass
class StallDemoResult:
    returncode: int
    output: str
    stall_to_exit_s: float | None    # from the "stalling" line to the end of the job
    wall_s: float
    stacks: dict[int, str] = field(default_factory=dict)   # rank -> py-spy dump taken during the hang
    explanation: str | None = None   # the CollectiveTimeoutError paragraph, if printed


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # py-spy colours its output even into a pipe
_PID_LINE = re.compile(r"\[rank (\d+)\] pid (\d+)")
_STALL_LINE = re.compile(r"\[rank (\d+)\] stalling for")


def _py_spy_dump(pid: int) -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return "py-spy is not installed (pip install py-spy)"
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
        return _ANSI.sub("", out.stdout + out.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {exc}"


def run_stall_demo(args: Sequence[str] = (), nproc: int = 2, dump_after_s: float = 2.0, timeout: float = 300,
                   env: dict[str, str] | None = None, live: bool = True) -> StallDemoResult:
    """Launch ``scripts/07_stall_demo.py`` under torchrun; during the stall, ``py-spy dump`` every rank.

    The job is *expected* to fail: returns its output and timings instead of raising.
    """
    from ecomkit.launch import _child_env, _stream, repo_root

    root = repo_root()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(root / "scripts" / "07_stall_demo.py"), *map(str, args)]
    t0 = time.perf_counter()
    pids: dict[int, int] = {}
    stacks: dict[int, str] = {}
    t_stall: float | None = None

    def watch(line: str) -> None:
        nonlocal t_stall
        if m := _PID_LINE.search(line):
            pids[int(m.group(1))] = int(m.group(2))
        if t_stall is None and _STALL_LINE.search(line):
            t_stall = time.perf_counter()
            threading.Thread(target=_dump_all, args=(pids, stacks, dump_after_s), daemon=True).start()

    proc = _stream(cmd, cwd=root, env=_child_env(env), timeout=timeout, live=live, on_line=watch)
    t_end = time.perf_counter()
    out = proc.stdout
    expl = next((ln.split("error: ", 1)[1].strip() for ln in out.splitlines()
                 if "error: " in ln and "timed out after" in ln), None)
    return StallDemoResult(proc.returncode, out, (t_end - t_stall) if t_stall else None, t_end - t0, stacks, expl)


def _dump_all(pids: dict[int, int], stacks: dict[int, str], delay: float) -> None:
    time.sleep(delay)
    for rank, pid in sorted(pids.items()):
        stacks[rank] = _py_spy_dump(pid)


# ---------------------------------------------------------------------- CPU reproductions
@dataclass
class Reproduction:
    """What happened when an error was provoked on purpose."""

    key: str
    reproduced: bool
    error_type: str | None
    message: str
    seconds: float
    fixed: str | None = None       # what the fix did, when the reproduction also applies it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _capture(key: str, action: Callable[[], Any]) -> Reproduction:
    t0 = time.perf_counter()
    try:
        action()
    except Exception as exc:  # the point: show the error text people see
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return Reproduction(key, True, type(exc).__name__, first, round(time.perf_counter() - t0, 3))
    return Reproduction(key, False, None, "no error was raised", round(time.perf_counter() - t0, 3))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reproduce_oom(device: str | torch.device = "cpu", nbytes: int = 1 << 50) -> Reproduction:
    """Ask for one block bigger than any machine (1 PiB): the allocator's out-of-memory error, instantly."""
    return _capture("oom", lambda: torch.empty(nbytes, dtype=torch.uint8, device=device))


def reproduce_port_in_use() -> Reproduction:
    """Two rendezvous servers (TCPStore, what torchrun starts on --master_port) on one port."""
    port = free_port()
    first = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    try:
        return _capture("address_in_use", lambda: dist.TCPStore("127.0.0.1", port, is_master=True,
                                                                wait_for_workers=False))
    finally:
        del first


def reproduce_world_size_mismatch(timeout_s: float = 3.0) -> Reproduction:
    """A rendezvous told to expect 3 processes (WORLD_SIZE=3) that only 2 join: it times out, naming 2/3."""
    port = free_port()
    timeout = _dt.timedelta(seconds=timeout_s)
    clients: list[Any] = []

    def join() -> None:
        time.sleep(0.2)
        clients.append(dist.TCPStore("127.0.0.1", port, world_size=3, is_master=False, timeout=timeout))

    t = threading.Thread(target=join, daemon=True)
    t.start()
    rep = _capture("world_size_mismatch", lambda: dist.TCPStore("127.0.0.1", port, world_size=3, is_master=True,
                                                                timeout=timeout, wait_for_workers=True))
    t.join(timeout_s + 5)
    clients.clear()
    return rep


DEMO_NEW_TOKENS = ("<新品>", "<秒杀>")  # "new arrival", "flash sale": tags a shop might add


def reproduce_embedding_mismatch(tokenizer: Any = None, model_preset: str = "tiny") -> Reproduction:
    """Add tokens to the tokenizer, forget to resize the embeddings, run a forward; then apply the fix."""
    from ecomkit.models.bloom import build_model
    from ecomkit.models.tokenizer import add_ecom_special_tokens, get_tokenizer, resize_embeddings_for

    tok = tokenizer if tokenizer is not None else get_tokenizer("local")
    model = build_model(model_preset, vocab_size=len(tok))
    rows_before = model.get_input_embeddings().weight.shape[0]
    added = add_ecom_special_tokens(tok) + tok.add_tokens(list(DEMO_NEW_TOKENS))
    batch = tok(f"Apple iPhone 15 SKU-123 ® {DEMO_NEW_TOKENS[0]}", return_tensors="pt")
    rep = _capture("vocab_mismatch", lambda: model(**batch))
    rows_after = resize_embeddings_for(model, tok)
    logits = model(**batch).logits
    rep.fixed = (f"{added} token(s) added, max id {int(batch['input_ids'].max())} vs {rows_before} embedding rows; "
                 f"after resize_embeddings_for: {rows_after} rows, forward OK (logits {tuple(logits.shape)})")
    return rep


class _RunsCode:
    """What an attacker would put into a checkpoint: unpickling it calls ``print`` (could be ``os.system``)."""

    def __reduce__(self):
        return (print, ("!!! code from the checkpoint ran !!!",))


def reproduce_unsafe_checkpoint(directory: str | os.PathLike) -> Reproduction:
    """Write a .pt whose unpickling would call a function, then load it the safe way: refused."""
    from ecomkit.faults.checkpoint import load_weights_file

    path = Path(directory) / "untrusted.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"weight": torch.zeros(2), "payload": _RunsCode()}, path)
    return _capture("unsafe_checkpoint", lambda: load_weights_file(path))


def reproduce_cpu_errors(workdir: str | os.PathLike, tokenizer: Any = None) -> list[Reproduction]:
    """Every CPU-reproducible entry of the catalogue, in catalogue order."""
    return [reproduce_oom(), reproduce_port_in_use(), reproduce_world_size_mismatch(),
            reproduce_embedding_mismatch(tokenizer), reproduce_unsafe_checkpoint(workdir)]


# ---------------------------------------------------------------------- diagnose
def _collective_test(env: DistEnv) -> dict[str, Any]:
    from ecomkit.envcheck.collectives import all_ranks_passed, check_all_reduce

    if not env.distributed:
        return {"ok": True, "skipped": True, "note": "one process: nothing to communicate with"}
    t0 = time.perf_counter()
    check = check_all_reduce(env.rank, env.world_size, env.device)
    ok = all_ranks_passed(check.passed, env.device)
    hosts: list[Any] = [None] * env.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    tb = time.perf_counter()
    dist.barrier()
    return {"ok": ok, "skipped": False, "cases": check.cases, "hosts": hosts,
            "barrier_ms": round((time.perf_counter() - tb) * 1e3, 3), "seconds": round(time.perf_counter() - t0, 3)}


def checkpoint_sanity_check(env: DistEnv, directory: str | os.PathLike) -> dict[str, Any]:
    """Save a small DDP model + AdamW with DCP, load it into a fresh copy, compare bit for bit.

    Also proves the directory is shared: every rank must see rank 0's committed
    checkpoint (on several nodes a node-local disk fails here, not mid-run).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ecomkit.faults.checkpoint import (CheckpointWriter, TRAINER_STATE, apply_model_optimizer_state, latest_checkpoint,
                             load_dcp, model_optimizer_state, remove_stale_temp_dirs)

    root = Path(directory)
    group = dist.new_group(backend="gloo") if env.distributed else None
    if env.is_main:
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
    if env.distributed:
        dist.barrier(group=group)

    def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.nn.Module]:
        torch.manual_seed(seed)
        raw = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(env.device)
        wrapped = DDP(raw, device_ids=[env.device.index] if env.device.type == "cuda" else None) \
            if env.distributed else raw
        return raw, torch.optim.AdamW(wrapped.parameters(), lr=1e-2), wrapped

    raw, opt, wrapped = build(0)
    wrapped(torch.randn(4, 32, device=env.device)).square().mean().backward()
    opt.step()
    t0 = time.perf_counter()
    writer = CheckpointWriter(root, keep_last=1, group=group, rank=env.rank)
    writer.save(1, model_optimizer_state(raw, opt), {TRAINER_STATE: {"step": 1}} if env.is_main else {})
    save_s = time.perf_counter() - t0
    if env.distributed:
        dist.barrier(group=group)
    path = latest_checkpoint(root)
    visible = path is not None
    if env.distributed:
        flags: list[Any] = [None] * env.world_size
        dist.all_gather_object(flags, visible, group=group)
        visible = all(flags)
    identical = False
    load_s = None
    if visible:
        raw2, opt2, _ = build(1)
        t1 = time.perf_counter()
        state = model_optimizer_state(raw2, opt2)
        load_dcp(path, state, group)
        apply_model_optimizer_state(raw2, opt2, state)
        load_s = time.perf_counter() - t1
        same_params = all(torch.equal(a, b) for a, b in zip(raw.parameters(), raw2.parameters()))
        same_optim = all(torch.equal(opt.state[a]["exp_avg_sq"], opt2.state[b]["exp_avg_sq"])
                         for a, b in zip(raw.parameters(), raw2.parameters()))
        identical = same_params and same_optim
    size = sum(f.stat().st_size for f in path.iterdir()) if path is not None else 0
    free = shutil.disk_usage(root).free
    if env.distributed:
        dist.barrier(group=group)
        dist.destroy_process_group(group)
    if env.is_main:
        remove_stale_temp_dirs(root)
    return {"ok": bool(visible and identical), "shared_dir_visible_to_all": visible, "identical_after_load": identical,
            "save_s": round(save_s, 4), "load_s": round(load_s, 4) if load_s else None, "bytes": size,
            "disk_free_bytes": free, "dir": str(root.resolve())}


def diagnose(env: DistEnv, workdir: str | os.PathLike, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Environment lint, collective test, checkpoint round trip: the first thing to run on a new cluster."""
    from ecomkit.envcheck.lint import format_findings, lint_current_env
    from ecomkit.envcheck.run import gather_from_ranks

    say = echo if env.is_main else (lambda _s: None)
    mine = [f.as_dict() for f in lint_current_env(env.local_world_size)] if env.local_rank == 0 else None
    lint = {h: f for h, f in gather_from_ranks((socket.gethostname(), mine), env) if f is not None}
    lint_errors = sum(1 for fs in lint.values() for f in fs if f["severity"] == "error")
    from ecomkit.envcheck.lint import Finding

    for host, findings in lint.items():
        say(f"[{host}] " + format_findings([Finding(**f) for f in findings]))
    coll = _collective_test(env)
    say(f"collective test: {'SKIPPED' if coll.get('skipped') else ('PASS' if coll['ok'] else 'FAIL')} "
        + ("" if coll.get("skipped") else f"({', '.join(k for k in coll['cases'])}; barrier {coll['barrier_ms']} ms)"))
    ck = checkpoint_sanity_check(env, Path(workdir) / "checkpoint_check")
    say(f"checkpoint check: {'PASS' if ck['ok'] else 'FAIL'} (saved in {ck['save_s']} s, loaded in {ck['load_s']} s, "
        f"{ck['bytes']:,} bytes, identical={ck['identical_after_load']}, "
        f"visible to all ranks={ck['shared_dir_visible_to_all']}, {ck['disk_free_bytes'] / 2**30:.1f} GiB free)")
    ok = coll["ok"] and ck["ok"] and lint_errors == 0
    say(f"diagnose: {'OK' if ok else 'PROBLEMS FOUND'}")
    return {"ok": ok, "world_size": env.world_size, "backend": env.backend, "lint": lint, "lint_errors": lint_errors,
            "collectives": coll, "checkpoint": ck}


__all__ = [
    "CollectiveTimeoutError", "KNOWN_ERRORS", "KnownError", "Reproduction", "SlowRank", "StallDemoResult",
    "StallInjector", "checkpoint_sanity_check", "diagnose", "error_table", "explain_collective_failure",
    "explain_error", "install_stack_dump_signal", "raise_explained", "reproduce_cpu_errors",
    "reproduce_embedding_mismatch", "reproduce_oom", "reproduce_port_in_use", "reproduce_unsafe_checkpoint",
    "reproduce_world_size_mismatch", "run_stall_demo",
]
