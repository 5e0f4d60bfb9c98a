"""The suite's forkserver launcher (tests/fastlaunch.py) gives a rank what torchrun gives it.

Most 2-process tests start their ranks through :mod:`fastlaunch` to skip the agent's and the ranks'
imports. These check that a rank cannot tell: the same worker variables as a real
``torchrun --standalone`` launch (only the port and run id differ), a working gloo group through the
launcher's store, its own argv and cwd, stdout and stderr kept apart, torchrun's exit status
when one rank fails while the other waits in a collective, and torchrun's restarts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import fastlaunch
import pytest

WORKER = textwrap.dedent("""
    import gc, json, os, sys
    import torch, torch.distributed as dist
    KEYS = {keys!r}
    if os.environ["TORCHELASTIC_MAX_RESTARTS"] != "0":  # torchrun keeps its store across restarts: each attempt's keys
        from ecomkit.dist import restart_safe_rendezvous
        dist.init_process_group("gloo", **restart_safe_rendezvous(int(os.environ["RANK"]),
                                                                  int(os.environ["WORLD_SIZE"]), 60))
    else:
        dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    env = {{k: os.environ.get(k) for k in KEYS}}
    print("RESULT " + json.dumps({{"env": env, "sum": t.item(), "argv": sys.argv[1:], "cwd": os.getcwd(),
                                   "threads": torch.get_num_threads(), "frozen": gc.get_freeze_count()}}), flush=True)
    print("to stderr", file=sys.stderr)
    fail = "--fail" in sys.argv or ("--fail-once" in sys.argv and env["TORCHELASTIC_RESTART_COUNT"] == "0")
    if dist.get_rank() == 1 and fail:
        sys.exit(3)
    if fail:
        dist.barrier()  # rank 0 waits here for a rank that has gone: the launcher must stop it
    dist.destroy_process_group()
""")
KEYS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "OMP_NUM_THREADS"]
PER_LAUNCH = ["MASTER_PORT", "TORCHELASTIC_RUN_ID"]  # set by both, values differ per launch


def results(stdout: str) -> list[dict]:
    """Every rank's RESULT object; two ranks' lines may share a line (torchrun's workers write unbuffered,
    so a print's text and its newline are two writes that the other rank's can come between)."""
    decoder = json.JSONDecoder()
    rows = [decoder.raw_decode(stdout, m.end())[0] for m in re.finditer(r"RESULT ", stdout)]
    return sorted(rows, key=lambda r: int(r["env"]["RANK"]))


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER.format(keys=KEYS + PER_LAUNCH))
    return path


@pytest.mark.dist
def test_a_rank_sees_what_torchrun_gives_it(worker, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    real = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(worker), "--flag", "x"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    fast = fastlaunch.run(worker, ["--flag", "x"], 2, env=env, cwd=tmp_path, timeout=120)
    assert real.returncode == fast.returncode == 0, fast.stderr[-3000:] + real.stderr[-3000:]
    for theirs, ours in zip(results(real.stdout), results(fast.stdout), strict=True):
        assert {k: ours["env"][k] for k in KEYS} == {k: theirs["env"][k] for k in KEYS}
        assert all(ours["env"][k] for k in PER_LAUNCH)
        assert ours["sum"] == theirs["sum"] == 3.0  # 1 + 2: the group works through the launcher's store
        assert ours["argv"] == theirs["argv"] == ["--flag", "x"] and ours["cwd"] == str(tmp_path)
        assert ours["threads"] == theirs["threads"] == 1
        assert ours["frozen"] > 0 == theirs["frozen"]  # the one difference: inherited objects skip collections
    assert len(results(fast.stdout)) == 2 and fast.stderr.count("to stderr") == 2
    assert "RESULT" not in fast.stderr


@pytest.mark.dist
def test_one_rank_failing_ends_the_launch_with_torchruns_status(worker, tmp_path):
    start = time.monotonic()
    fast = fastlaunch.run(worker, ["--fail"], 2, cwd=tmp_path, timeout=120)
    assert fast.returncode == 1  # torchrun's status when a worker fails, whatever the worker's own code
    assert time.monotonic() - start < fastlaunch.STOP_GRACE_S + 60  # rank 0 was stopped, not left in barrier


@pytest.mark.dist
def test_a_restart_starts_every_rank_again_as_torchrun_does(worker, tmp_path):
    """Rank 1 fails in the first attempt only: both launchers stop rank 0, start both ranks again with the
    next restart count, and end with status 0; the second attempt's ranks see the same variables."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    real = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "--max-restarts", "1", str(worker), "--fail-once"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    fast = fastlaunch.run(worker, ["--fail-once"], 2, env=env, cwd=tmp_path, timeout=180, max_restarts=1)
    assert real.returncode == fast.returncode == 0, fast.stderr[-3000:] + real.stderr[-3000:]
    for run in (real, fast):   # attempt 0's two ranks, then attempt 1's, on the store the first attempt used
        assert sorted(r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in results(run.stdout)) == ["0", "0", "1", "1"]
        assert len({r["env"]["MASTER_PORT"] for r in results(run.stdout)}) == 1
    second = [[r for r in results(run.stdout) if r["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"] for run in (real, fast)]
    for theirs, ours in zip(*second, strict=True):
        assert {k: ours["env"][k] for k in KEYS} == {k: theirs["env"][k] for k in KEYS}
        assert ours["env"]["TORCHELASTIC_MAX_RESTARTS"] == "1" and ours["sum"] == 3.0
    assert fastlaunch.run(worker, ["--fail"], 2, env=env, cwd=tmp_path, timeout=180, max_restarts=1).returncode == 1


def test_variables_read_at_import_are_refused(monkeypatch):
    monkeypatch.delenv(fastlaunch.TORCHRUN_ENV, raising=False)  # the forked path, also under the torchrun switch
    env = {**fastlaunch.server_env(), "TORCHINDUCTOR_COMPILE_THREADS": "7"}
    assert fastlaunch.import_time_vars(env) == ["TORCHINDUCTOR_COMPILE_THREADS"]
    with pytest.raises(ValueError, match="TORCHINDUCTOR_COMPILE_THREADS"):
        fastlaunch.run("unused.py", env=env)
    assert fastlaunch.import_time_vars({**fastlaunch.server_env(), "PYTHONPATH": "/x", "ECOMKIT_CACHE": "/y"}) == []


@pytest.mark.dist
def test_a_variable_read_when_called_reaches_the_rank_with_the_launchs_value(monkeypatch, tmp_path):
    """Importing deepspeed in a pytest worker sets PYTORCH_NVML_BASED_CUDA_CHECK there after its forkserver
    started; later launches go on forking, and the ranks see the value torchrun would have given them."""
    monkeypatch.delenv(fastlaunch.TORCHRUN_ENV, raising=False)
    keys = sorted(fastlaunch.READ_AT_CALL) + ["RANK"]
    (tmp_path / "worker.py").write_text(WORKER.format(keys=keys))
    drifted = {**fastlaunch.server_env(), "OMP_NUM_THREADS": "1"}
    drifted.update({k: f"{drifted.get(k)}-changed" for k in fastlaunch.READ_AT_CALL})
    assert fastlaunch.import_time_vars(drifted) == []
    fast = fastlaunch.run(tmp_path / "worker.py", [], 2, env=drifted, cwd=tmp_path, timeout=120)
    assert fast.returncode == 0, fast.stderr[-3000:]
    rows = results(fast.stdout)
    assert [r["env"]["RANK"] for r in rows] == ["0", "1"], fast.stdout[-3000:]  # both ranks answered
    for row in rows:
        assert {k: row["env"][k] for k in fastlaunch.READ_AT_CALL} == {k: drifted[k] for k in fastlaunch.READ_AT_CALL}
    assert fastlaunch.import_time_vars({**drifted, "PYTORCH_CUDA_ALLOC_CONF": "x"}) == ["PYTORCH_CUDA_ALLOC_CONF"]


PLAIN = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    env = {{k: os.environ.get(k) for k in {keys!r}}}
    print("RESULT " + json.dumps({{"env": env, "group": dist.is_initialized(), "argv": sys.argv[1:],
                                   "cwd": os.getcwd(), "main": __name__}}), flush=True)
    print("to stderr", file=sys.stderr)
    if "--raise" in sys.argv:
        raise RuntimeError("raised by the script")
    sys.exit(int(sys.argv[-1]))
""")


@pytest.mark.parametrize("how", ["exit 2", "exit 0", "raise"])
def test_a_plain_launch_is_python_itself_with_the_imports_done(tmp_path, monkeypatch, how):
    """``fastlaunch.plain`` (``run_script(nproc=0)``): no torchrun variable, no group, the script's own status."""
    monkeypatch.delenv(fastlaunch.TORCHRUN_ENV, raising=False)
    script = tmp_path / "plain.py"
    script.write_text(PLAIN.format(keys=KEYS + PER_LAUNCH + ["TORCHELASTIC_RUN_ID"]))
    args = ["--flag", "x", *(["--raise"] if how == "raise" else []), how.split()[-1] if how != "raise" else "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    real = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    fast = fastlaunch.plain(script, args, env=env, cwd=tmp_path, timeout=120)
    assert fast.args[0] == "fastlaunch"   # forked, not a new interpreter
    assert fast.returncode == real.returncode == {"exit 2": 2, "exit 0": 0, "raise": 1}[how], fast.stderr[-3000:]
    ours, theirs = results_any(fast.stdout), results_any(real.stdout)
    assert ours == theirs and ours["group"] is False, (ours, theirs)
    assert {k: v for k, v in ours["env"].items() if v is not None} == {"OMP_NUM_THREADS": "1"}, ours
    assert ours["argv"] == args and ours["cwd"] == str(tmp_path) and ours["main"] == "__main__"
    assert fast.stderr.count("to stderr") == 1 and ("RuntimeError: raised by the script" in fast.stderr) == (how == "raise")


def results_any(stdout: str) -> dict:
    """The one RESULT object a plain launch printed."""
    (row,) = [json.JSONDecoder().raw_decode(stdout, m.end())[0] for m in re.finditer(r"RESULT ", stdout)]
    return row
