"""Chapter 07's catalogue of the errors people meet on several GPUs, and explanations of collective failures.

In code, not prose, so one list answers ``--explain-file``, fills the notebook's table and is tested against the
real messages :mod:`ecomkit.faults.reproduce` provokes. :func:`explain_collective_failure` turns gloo's "Timed out
waiting 10000ms for recv" into a paragraph naming the collective, its caller, the timeout and what to do.
"""

from __future__ import annotations

import os
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

from ecomkit.errors import EcomkitError


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
        "Get every rank's stack (--fault-hang-dump-s, kill -USR1, py-spy dump, TORCH_DISTRIBUTED_DEBUG=DETAIL, the "
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
        "node_rejoin_timeout", "A lost node did not rejoin the rendezvous (multi-node restart)",
        (r"RendezvousTimeoutError", r"wait timeout after \d+ms, keys: \S*(torchelastic/role_info/\d+|/MASTER_ADDR)"),
        "After a failure the torchrun agents meet in a new rendezvous round and wait for --nnodes agents (the MIN "
        "of MIN:MAX). A node that died and was not started again, or cannot reach the rendezvous host, never "
        "joins, so the round ends after join_timeout (600 s unless --rdzv-conf join_timeout=S) with a bare "
        "RendezvousTimeoutError. With torchrun's shared store (torch's default) even a node that is started again "
        "cannot rejoin in torch 2.13: the survivors wait for its role_info keys and it waits for MASTER_ADDR "
        "until the store's 60 s read timeout (DistStoreError: wait timeout).",
        "Launch every node with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and start the lost node's torchrun again, "
        "same command line, within join_timeout (an elastic --nnodes MIN:MAX, untested here, goes on with "
        "fewer); otherwise restart the whole job, which resumes from the last checkpoint in the shared "
        "--output-dir. The node that hosts the rendezvous store (--rdzv-endpoint) cannot be replaced while the "
        "job runs: docs/multinode.md.",
        "tests/test_multinode.py: two agents on one host, one killed and not started again (join_timeout=15)"),
    KnownError(
        "rendezvous_store_lost", "The rendezvous store host is gone (multi-node)",
        (r"RendezvousConnectionError", r"connection to the C10d store has failed"),
        "The torchrun agent on the --rdzv-endpoint machine holds the rendezvous state in memory; it exited or its "
        "node died, so every other agent lost the store. If that agent failed first for another reason (a bad "
        "flag, a crashed rank), this line is a consequence: read the first error in the log.",
        "Nothing can rejoin a job whose store host is gone: restart the whole job (same --output-dir on shared "
        "storage), and it resumes from its last complete checkpoint. Keep checkpoints frequent enough; to "
        "survive the loss of node 0, host the store on a machine that does not train (docs/multinode.md).",
        "the SLURM dry run with a failing script (scripts/slurm_local.py): the store host exits first"),
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
        "Save weights as safetensors or DCP; load with weights_only=True "
        "(ecomkit.faults.safe_load.load_weights_file). Only for a file you made yourself: "
        "torch.serialization.add_safe_globals([...]) for the exact classes.",
        "reproduce_unsafe_checkpoint(): a .pt file with an object that would run code"),
)


def explain_error(text: str) -> list[KnownError]:
    """Known errors whose patterns occur in ``text`` (a message, a traceback or a whole log)."""
    return [e for e in KNOWN_ERRORS if e.matches(text)]


def error_table() -> list[dict[str, str]]:
    """The catalogue as rows (title, cause, fix, reproduction) for a notebook table."""
    return [{"error": e.title, "cause": e.cause, "fix": e.fix, "reproduced by": e.reproduce} for e in KNOWN_ERRORS]


class CollectiveTimeoutError(EcomkitError):
    """A collective did not complete within the process-group timeout (a peer rank never arrived)."""


BACKEND_SAID = "Backend said: "  # precedes gloo's/NCCL's own text in an explanation
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
    """A backend error from a collective (timeout or vanished peer), as opposed to a bug in the training code."""
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
                f"is on that rank: read torchrun's 'Root Cause' block. {BACKEND_SAID}{raw}")
    return (f"{who}{what}{where} timed out after {timeout_s:g} s, the process-group timeout (--timeout-s, "
            f"TrainConfig.timeout_s): at least one other rank never reached it. {BACKEND_SAID}{raw}. To see where "
            "every rank is: --fault-hang-dump-s N (stacks when a step is slow), kill -USR1 <worker pid>, "
            "py-spy dump --pid <pid>, TORCH_DISTRIBUTED_DEBUG=DETAIL (names the missing ranks), and on GPU "
            "NCCL_DEBUG=INFO plus TORCH_NCCL_TRACE_BUFFER_SIZE (flight recorder).")


def raise_explained(exc: BaseException, timeout_s: float, rank: int | None = None) -> None:
    """Re-raise a collective failure as :class:`CollectiveTimeoutError` with the explanation; others unchanged."""
    if is_collective_failure(exc):
        err = CollectiveTimeoutError(explain_collective_failure(exc, timeout_s, rank))
        err.root_cause = not _PEER_GONE_TEXT.search(str(exc))   # a gone peer: that peer's failure is the root cause
        raise err from exc
    raise exc


def backend_message(explanation: str) -> str:
    """The backend's own words inside an :func:`explain_collective_failure` paragraph (for a table cell)."""
    said = explanation.split(BACKEND_SAID, 1)[-1]
    return said.split(". To see where", 1)[0].strip()


__all__ = [
    "KNOWN_ERRORS", "CollectiveTimeoutError", "KnownError", "backend_message", "error_table", "explain_collective_failure",
    "explain_error", "is_collective_failure", "raise_explained",
]
