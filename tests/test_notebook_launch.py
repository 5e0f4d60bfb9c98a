"""The suite's notebook kernels launch through the forkserver (tests/notebook_launch.py) and get what the real
helpers give: every rank's output in one text, a failure as EcomkitError with its tail, restarts."""

from __future__ import annotations

import textwrap

import fastlaunch
import nbformat
import notebook_launch
import pytest
from nbclient import NotebookClient

from conftest import REPO
from ecomkit.errors import EcomkitError

pytestmark = pytest.mark.dist

WORKER = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    from ecomkit.dist import restart_safe_rendezvous
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", **restart_safe_rendezvous(rank, world, 60))
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} sum {t.item():.0f} args {sys.argv[1:]}", flush=True)
    print(f"rank {dist.get_rank()} to stderr", file=sys.stderr, flush=True)
    first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    if dist.get_rank() == 1 and ("--fail" in sys.argv or ("--fail-once" in sys.argv and first_attempt)):
        sys.exit("rank 1 refuses: a user error")
    dist.destroy_process_group()
""")


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def test_a_launch_returns_every_rank_s_output_as_run_torchrun_does(worker, capsys):
    result = notebook_launch.run_torchrun(worker, ["--flag"], nproc=2, live=True)
    assert result.returncode == 0 and result.stderr == ""
    for rank in (0, 1):
        assert f"rank {rank} sum 3 args ['--flag']" in result.stdout and f"rank {rank} to stderr" in result.stdout
    assert capsys.readouterr().out == result.stdout   # live: printed, as the real helper streams it


def test_a_failed_rank_raises_with_the_output_tail(worker, capsys):
    with pytest.raises(EcomkitError, match="exit status 1") as info:
        notebook_launch.run_torchrun(worker, ["--fail"], nproc=2, live=False)
    assert "rank 1 refuses: a user error" in str(info.value)
    assert capsys.readouterr().out == ""   # not live: nothing printed


def test_a_restart_runs_every_rank_again_and_returns_both_attempts(worker, capsys):
    result = notebook_launch.run_torchrun(worker, ["--fail-once"], nproc=2, max_restarts=1, live=False)
    assert result.returncode == 0 and "rank 1 refuses: a user error" in result.stdout
    assert [result.stdout.count(f"rank {rank} sum 3 args ['--fail-once']") for rank in (0, 1)] == [2, 2]


def test_import_time_variables_keep_torchrun(worker, monkeypatch):
    calls = []
    monkeypatch.setitem(notebook_launch.ORIGINAL, "run_torchrun", lambda *a, **k: calls.append(k) or "real")
    assert notebook_launch.run_torchrun(worker, nproc=2, env={"HF_HUB_CACHE": "/elsewhere"}) == "real"
    monkeypatch.setenv("ECOMKIT_TESTS_TORCHRUN", "1")
    assert notebook_launch.run_torchrun(worker, nproc=2, max_restarts=1) == "real"
    assert [c["max_restarts"] for c in calls] == [0, 1]
    # a kernel's variable that the serving worker's forkserver imported under another value: the real launcher
    job = {"env": {**fastlaunch.server_env(), "TORCHINDUCTOR_COMPILE_THREADS": "7"}}
    assert notebook_launch._run(job) is None


def test_a_kernel_started_under_the_suite_launches_through_the_worker_s_forkserver(worker):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import fastlaunch\n"
        "from ecomkit.launch import run_python, run_torchrun\n"
        "print(run_torchrun.__module__, run_python.__module__)\n"
        f"out = run_torchrun({str(worker)!r}, ['--flag'], nproc=2, live=False).stdout\n"
        "print('rank 1 sum 3' in out, fastlaunch._context is None)")])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    # the helpers are the suite's; the launch ran, and not from a forkserver the kernel started itself
    printed = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout")
    assert printed.split() == ["notebook_launch", "notebook_launch", "True", "True"], nb.cells[0].outputs
