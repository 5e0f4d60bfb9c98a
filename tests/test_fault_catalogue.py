"""The error catalogue and its CPU reproductions: each provoked error is recognised by its own entry."""

from __future__ import annotations

import pytest
import torch

from ecomkit.faults.diagnose import (
    KNOWN_ERRORS,
    error_table,
    explain_collective_failure,
    explain_error,
    is_collective_failure,
    reproduce_embedding_mismatch,
    reproduce_oom,
    reproduce_port_in_use,
    reproduce_unsafe_checkpoint,
    reproduce_world_size_mismatch,
)


def keys(text: str) -> list[str]:
    return [e.key for e in explain_error(text)]


@pytest.mark.parametrize("text, key", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("[unbound_buffer.cc:78] Timed out waiting 600000ms for recv operation to complete", "collective_timeout"),
    ("[Rank 0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)",
     "collective_timeout"),
    ("ncclInvalidUsage: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000", "duplicate_gpu"),
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 8/16 clients joined.",
     "world_size_mismatch"),
    ("RuntimeError: CUDA error: device-side assert triggered", "vocab_mismatch"),
    ("Connection closed by peer [10.0.0.2]:1234", "peer_died"),
])
def test_known_error_texts_are_explained(text, key):
    assert key in keys(text)


def test_every_entry_has_cause_fix_and_a_reproduction_note():
    assert len({e.key for e in KNOWN_ERRORS}) == len(KNOWN_ERRORS)
    for row in error_table():
        assert row["error"] and all(len(row[k]) > 20 for k in ("cause", "fix", "reproduced by")), row


def test_oom_reproduces_and_is_recognised():
    rep = reproduce_oom()
    assert rep.reproduced and "oom" in keys(rep.message)


def test_port_in_use_reproduces_and_is_recognised():
    rep = reproduce_port_in_use()
    assert rep.reproduced and rep.error_type == "DistNetworkError" and "address_in_use" in keys(rep.message)


def test_world_size_mismatch_reproduces_and_is_recognised():
    rep = reproduce_world_size_mismatch(timeout_s=2)
    assert rep.reproduced and "2/3 clients joined" in rep.message and "world_size_mismatch" in keys(rep.message)


def test_embedding_mismatch_reproduces_then_resize_fixes_it():
    rep = reproduce_embedding_mismatch()
    assert rep.reproduced and rep.error_type == "IndexError" and "vocab_mismatch" in keys(rep.message)
    assert "forward OK" in rep.fixed


def test_unsafe_checkpoint_reproduction_is_refused(tmp_path, capsys):
    rep = reproduce_unsafe_checkpoint(tmp_path)
    assert rep.reproduced and rep.error_type == "UnsafeCheckpointError"
    assert "code from the checkpoint ran" not in capsys.readouterr().out
    assert "unsafe_checkpoint" in keys(rep.message)


def test_collective_failure_message_names_collective_caller_and_timeout():
    def stuck_collective():
        try:
            torch.distributed.all_reduce(torch.ones(1))  # not initialised: gives us a real c10d frame
        except Exception as exc:
            raise RuntimeError("Timed out waiting 10000ms for recv operation to complete") from exc

    with pytest.raises(RuntimeError) as info:
        stuck_collective()
    assert is_collective_failure(info.value)
    text = explain_collective_failure(info.value.__cause__, 10)  # the c10d exception carries the frames
    assert "collective `all_reduce`" in text and "stuck_collective()" in text
    assert not is_collective_failure(ValueError("Timed out"))
