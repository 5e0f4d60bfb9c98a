"""The error catalogue and its CPU reproductions: each provoked error is recognised by its own entry."""

from __future__ import annotations

import pytest
import torch

from ecomkit.faults.diagnose import StallDemoResult, hang_watchdog_reports, main_thread_stack, pids_in_line
from ecomkit.faults.known_errors import (
    KNOWN_ERRORS,
    backend_message,
    error_table,
    explain_collective_failure,
    explain_error,
    is_collective_failure,
)
from ecomkit.faults.reproduce import (
    Reproduction,
    reproduce_embedding_mismatch,
    reproduce_oom,
    reproduce_port_in_use,
    reproduce_unsafe_checkpoint,
    reproduce_world_size_mismatch,
    reproduction_table,
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


def test_backend_message_is_the_backends_own_words():
    gloo = RuntimeError("Timed out waiting 10000ms for recv operation to complete")
    assert backend_message(explain_collective_failure(gloo, 10)) == str(gloo)
    peer = RuntimeError("Connection closed by peer [10.0.0.2]:1234")
    assert backend_message(explain_collective_failure(peer, 10)) == str(peer)


def test_reproduction_table_shows_what_was_seen_where():
    reps = [Reproduction("oom", True, "OutOfMemoryError", "CUDA out of memory", 0.0),
            Reproduction("vocab_mismatch", True, "IndexError", "index out of range in self", 0.1, fixed="resized"),
            Reproduction("address_in_use", False, None, "no error was raised", 0.0)]
    rows = {r["error"]: r for r in reproduction_table(reps, {"collective_timeout": "(stall demo) Timed out"})}
    by_key = {e.key: rows[e.title] for e in KNOWN_ERRORS}
    assert len(rows) == len(KNOWN_ERRORS)
    assert by_key["oom"]["message seen here"] == "OutOfMemoryError: CUDA out of memory"
    assert by_key["vocab_mismatch"]["message seen here"].endswith("→ fix applied: resized")
    assert by_key["address_in_use"]["message seen here"] == "—"  # not reproduced: nothing to show
    assert by_key["collective_timeout"]["message seen here"] == "(stall demo) Timed out"
    assert by_key["duplicate_gpu"]["message seen here"] == "—"
    assert all(row["cause"] and row["fix"] for row in rows.values())


PY_SPY_DUMP = """Process 4242: /usr/bin/python scripts/07_stall_demo.py
Python v3.11.9 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2801)
    _reduce_counts (ecomkit/train/loop.py:120)
Thread 4250 (idle): "ecomkit-hang-watchdog"
    _run (ecomkit/faults/health.py:250)
"""


def test_main_thread_stack_keeps_only_the_main_thread():
    main = main_thread_stack(PY_SPY_DUMP)
    assert "all_reduce" in main and "_reduce_counts" in main and "hang-watchdog" not in main
    assert main_thread_stack("py-spy is not installed") == "py-spy is not installed"


def test_pids_are_read_from_interleaved_rank_lines():
    # two ranks' start-up lines in one output line (their writes interleaved): both pids are read
    assert pids_in_line("[rank 0] pid 101 on h[rank 1] pid 202 on h") == {0: 101, 1: 202}
    assert pids_in_line("[rank 1] stalling for 600 s after step 4 (pid 202): ...") == {}


def test_hang_watchdog_reports_are_cut_from_the_job_output():
    output = ("[rank 0] pid 1 on host\nstep 3 ok\n"
              "[rank 1 on host, pid 7] step 5 has taken 6 s (> fault.hang_dump_s=5); Python stacks follow:\n"
              "--- thread MainThread\n  a\n  b\n  c\n  time.sleep(self.seconds)\n"
              "[rank 0] error: something else\n")
    reports = hang_watchdog_reports(output, tail_lines=2)
    assert reports == ["[rank 1 on host, pid 7] step 5 has taken 6 s (> fault.hang_dump_s=5); Python stacks "
                       "follow:\n  c\n  time.sleep(self.seconds)"]


def test_stall_demo_verdict_needs_a_failure_the_explanation_and_the_timeout():
    explained = explain_collective_failure(RuntimeError("Timed out waiting 10000ms for recv"), 10, rank=0)
    ok = StallDemoResult(1, "", stall_to_exit_s=14.0, wall_s=30.0, explanation=explained)
    assert ok.ended_by_timeout(10) and ok.backend_said() == "Timed out waiting 10000ms for recv"
    assert not StallDemoResult(0, "", 14.0, 30.0, explanation=explained).ended_by_timeout(10)   # it did not fail
    assert not StallDemoResult(1, "", 14.0, 30.0).ended_by_timeout(10)                          # no explanation
    assert not StallDemoResult(1, "", 95.0, 120.0, explanation=explained).ended_by_timeout(10)  # hung too long
    assert not StallDemoResult(1, "", None, 120.0, explanation=explained).ended_by_timeout(10)  # never stalled
