"""Beyond one host, on one host: two "nodes" are two launcher processes on 127.0.0.1 (gloo, one worker each).

Launch lines covered (each compared with a one-node 2-process run of the same flags):
- ``torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:P`` × 2 agents,
  FSDP2 (scripts/04_mixed_parallel.py): every loss and the final weights equal;
- the same two agents, DDP (scripts/02_data_parallel.py) with ``--max-restarts 2`` and
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: the agent that does not host the store loses its whole process
  tree after the first checkpoint and is started again; the job resumes and every loss and the final
  replicas equal the one-node run;
- the same, but the lost node is not started again: the job ends with torch's RendezvousTimeoutError within
  join_timeout, which the error catalogue explains;
- ``deepspeed --hostfile H --no_ssh --num_nodes 2 --node_rank i --master_addr 127.0.0.1 --master_port P
  --num_gpus 1 scripts/03_zero3.py`` for i = 0, 1 (via scripts/03_deepspeed_launcher.sh): ZeRO-3 losses equal
  torchrun's;
- ``python scripts/slurm_local.py scripts/slurm_2nodes.sbatch scripts/02_data_parallel.py ...``: the batch
  script's own torchrun line on two fake nodes, DDP, equal to one node.

What these cannot show: real inter-node bandwidth or NCCL over a network (docs/multinode.md).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest
from safetensors.torch import load_file

from conftest import REPO, run_script
from ecomkit.dist import check_multinode_restarts, free_port
from ecomkit.errors import EcomkitError
from ecomkit.faults.known_errors import explain_error

COMMON = ["--precision", "fp32", "--model", "tiny", "--n-rows", "300", "--seq-len", "64", "--eval-interval", "0", "--eval-batches", "1",
          "--warmup-steps", "2", "--no-progress"]
DDP = COMMON + ["--max-steps", "8", "--no-save-model"]
FSDP = COMMON + ["--max-steps", "4", "--dp", "2", "--micro-batch-size", "4"]
ZERO3 = COMMON + ["--max-steps", "4", "--zero-stage", "3", "--strategy", "zero", "--no-save-model"]
FAST_RDZV = "keep_alive_interval=1,keep_alive_max_attempt=3"  # a dead agent is noticed in ~3 s, not 15
# Tests that count on keep-alive and join timeouts of a few seconds are marked `serial`: make test runs them
# alone, where a second job on the same cores cannot stall an agent's heartbeat.


def rows(out: Path, kind: str = "train") -> list[dict]:
    return [r for r in (json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip())
            if r.get("type") == kind]


def losses(out: Path) -> dict[int, float]:
    """Loss per step; after a resume the redone step's last row wins."""
    return {r["step"]: r["loss"] for r in rows(out)}


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def assert_same_ddp_run(out: Path, ref: Path) -> None:
    """Every step's loss bit-identical and the same final replicas (checksums of the weights on every rank)."""
    assert losses(out) == losses(ref) and len(losses(ref)) == 8, (losses(out), losses(ref))
    got, want = summary(out)["replica_checksums"], summary(ref)["replica_checksums"]
    assert got == want and len(set(want)) == 1, (got, want)


# ---------------------------------------------------------------------- launching agents by hand
def agent_cmd(script: str, args: list[str], port: int, *, max_restarts: int = 0, rdzv_conf: str = "") -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "mn",
            "--max_restarts", str(max_restarts), *(["--rdzv_conf", rdzv_conf] if rdzv_conf else []),
            str(REPO / "scripts" / script), *args]


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # deepspeed, torchrun
    full_env = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                **(env or {})}
    with log.open("w") as fh:  # the child keeps its own handle
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    proc.log_path = log  # type: ignore[attr-defined]
    _STARTED.append(proc)
    return proc


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_agent_outlives_its_test():
    """A failed assertion must not leave launchers (and their workers) running into the next test."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            kill_tree(proc)


def wait_until(cond: Callable[[], bool], timeout: float, what: str, procs: list[subprocess.Popen] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise AssertionError(f"gave up waiting for {what} (exit codes {[p.poll() for p in procs]})")
        time.sleep(0.02)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_two_agents(cmd: list[str], tmp: Path, env: dict[str, str] | None = None
                     ) -> tuple[subprocess.Popen, subprocess.Popen]:
    """Both agents at once (the first round's join_timeout runs from each agent's start); returns
    (store host, the other), the store host being the agent that listens on the rendezvous port."""
    port = int(cmd[cmd.index("--rdzv_endpoint") + 1].rsplit(":", 1)[1])
    agents = [start(cmd, tmp / "agent_a.log", env), start(cmd, tmp / "agent_b.log", env)]
    wait_until(lambda: listening(port), 120, "the rendezvous store", agents)
    host = [a for a in agents if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                                     for c in psutil.Process(a.pid).net_connections(kind="tcp"))]
    assert len(host) == 1, "exactly one agent hosts the rendezvous store"
    return host[0], next(a for a in agents if a is not host[0])


def kill_tree(proc: subprocess.Popen) -> list[int]:
    """SIGKILL an agent and every process under it, as a node's power cut would.

    torchrun starts its workers in sessions of their own, so killing the agent's process group alone
    leaves the worker training on.
    """
    try:
        victims = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:  # already gone
        victims = []
    for p in victims:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=30)
    proc.wait()
    return [p.pid for p in victims]


def finish(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    """Exit codes; anything still running after ``timeout`` is killed (tree) and the test fails."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    kill_tree(q)
            raise AssertionError(f"agents still running after {timeout} s")
    return codes


def logs(tmp: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-5000:]}" for p in sorted(tmp.glob("agent_*.log")))


# ---------------------------------------------------------------------- one-node references
@pytest.fixture(scope="module")
def ddp_ref(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp_ref")
    run_script("02_data_parallel.py", DDP + ["--output-dir", str(out)], nproc=2, timeout=300)
    return out


@pytest.fixture(scope="module")
def fsdp_ref(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp_ref")
    run_script("04_mixed_parallel.py", FSDP + ["--output-dir", str(out)], nproc=2, timeout=300)
    return out


# ---------------------------------------------------------------------- tests
@pytest.mark.dist
def test_two_agents_fsdp2_equal_one_node(fsdp_ref, tmp_path):
    out = tmp_path / "out"
    a, b = start_two_agents(agent_cmd("04_mixed_parallel.py", FSDP + ["--output-dir", str(out)], free_port()),
                            tmp_path)
    assert finish([a, b], 300) == [0, 0], logs(tmp_path)
    assert summary(out)["world_size"] == 2
    assert losses(out) == losses(fsdp_ref) and len(losses(out)) == 4, (losses(out), losses(fsdp_ref))
    got, want = load_file(out / "final" / "model.safetensors"), load_file(fsdp_ref / "final" / "model.safetensors")
    assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want)


@pytest.mark.dist
@pytest.mark.serial
def test_lost_node_restarted_rejoins_and_finishes_like_one_node(ddp_ref, tmp_path):
    out = tmp_path / "out"
    cmd = agent_cmd("02_data_parallel.py", DDP + ["--output-dir", str(out), "--fault-checkpoint-interval", "2"],
                    free_port(), max_restarts=2, rdzv_conf=FAST_RDZV)
    a, b = start_two_agents(cmd, tmp_path)
    first = out / "checkpoints" / "step_00000002"
    wait_until(first.exists, 300, "the step-2 checkpoint", [a, b])
    kill_tree(b)  # B does not host the store: A's worker fails, A restarts and waits in the rendezvous
    b2 = start(cmd, tmp_path / "agent_b2.log")
    assert finish([a, b2], 300) == [0, 0], logs(tmp_path)
    log = logs(tmp_path)
    assert "resumed from" in log and "step_0000000" in log, log
    resumed = summary(out)["checkpoint"]["resumed_from_step"]
    assert resumed is not None and 2 <= resumed < 8, resumed
    assert_same_ddp_run(out, ddp_ref)


@pytest.mark.dist
@pytest.mark.serial
def test_node_that_does_not_come_back_ends_with_a_rendezvous_timeout(tmp_path):
    out, join_timeout = tmp_path / "out", 15  # long enough for two agents to start on a loaded machine
    cmd = agent_cmd("02_data_parallel.py", DDP + ["--output-dir", str(out)], free_port(), max_restarts=1,
                    rdzv_conf=f"join_timeout={join_timeout},{FAST_RDZV}")
    a, b = start_two_agents(cmd, tmp_path)
    wait_until(lambda: '"type": "train"' in ((out / "metrics.jsonl").read_text() if (out / "metrics.jsonl").exists()
                                             else ""), 300, "the first step", [a, b])
    kill_tree(b)
    killed_at = time.monotonic()
    assert finish([a], 120) != [0]
    waited = time.monotonic() - killed_at
    text = a.log_path.read_text(errors="replace")  # the store host's agent
    assert "RendezvousTimeoutError" in text, text[-4000:]
    assert waited < join_timeout + 60, waited
    found = {e.key: e for e in explain_error(text)}
    assert "node_rejoin_timeout" in found and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in found["node_rejoin_timeout"].fix


@pytest.mark.dist
def test_deepspeed_launcher_on_two_nodes_equals_torchrun(tmp_path):
    ref = tmp_path / "torchrun"
    run_script("03_zero3.py", ZERO3 + ["--output-dir", str(ref)], nproc=2, timeout=400)
    out, port = tmp_path / "ds", free_port()
    env = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu"}
    launcher = [str(REPO / "scripts" / "03_deepspeed_launcher.sh"), "1", *ZERO3, "--output-dir", str(out)]
    nodes = [start(launcher, tmp_path / f"agent_{i}.log", {**env, "NODE_RANK": str(i)}) for i in (0, 1)]
    assert finish(nodes, 400) == [0, 0], logs(tmp_path)
    text = logs(tmp_path)
    assert "--node_rank=1" in text, text[-3000:]  # the launcher's own command line for node 1
    assert summary(out)["world_size"] == 2 and summary(out)["strategy"] == "zero"
    assert losses(out) == losses(ref) and len(losses(ref)) == 4, (losses(out), losses(ref))


@pytest.mark.dist
def test_slurm_batch_script_trains_on_two_fake_nodes(ddp_ref, tmp_path):
    out = tmp_path / "slurm"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "slurm_local.py"), "--timeout", "300",
                           "--preempt-at-step", "2",
                           str(REPO / "scripts" / "slurm_2nodes.sbatch"), "scripts/02_data_parallel.py", *DDP,
                           "--fault-checkpoint-interval", "4"], cwd=REPO, capture_output=True, text=True,
                          env={**{k: v for k, v in os.environ.items() if k != "MASTER_PORT"}, "OMP_NUM_THREADS": "1",
                               "OUT_DIR": str(out)}, timeout=360)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]
    job_id = int(re.search(r"slurm_local: job (\d+)", text)[1])  # the port is derived from it by the batch script
    assert f"--rdzv_endpoint 127.0.0.1:{20000 + job_id % 20000} --rdzv_id slurm-{job_id}" in text, text[-3000:]
    assert "[node0] srun (slurm_local)" in text and "[node1] srun (slurm_local)" in text, text[-3000:]
    assert "--nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:" in text, text[-3000:]
    assert (out / "torchrun.log").is_file()
    # --signal=USR1@90 as the time limit nears: every process of the step gets SIGUSR1, the run checkpoints,
    # the batch script requeues the job (--requeue), and the requeued attempt resumes and finishes
    assert "sending SIGUSR1 to 4 process(es) of the job step" in text, text[-3000:]
    assert "preempted (SIGUSR1): checkpoint of step" in text and f"requeueing job {job_id}" in text, text[-4000:]
    assert f"slurm_local: job {job_id} requeued (SLURM_RESTART_COUNT=1)" in text, text[-3000:]
    s = summary(out)
    assert s["world_size"] == 2 and s["preemption"]["resumed_from_step"] >= 2
    assert_same_ddp_run(out, ddp_ref)  # every step once: nothing lost or repeated by the requeue


# ---------------------------------------------------------------------- no launch
def test_multinode_restarts_with_the_shared_store_are_refused_up_front(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    with pytest.raises(EcomkitError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        check_multinode_restarts(world_size=2)
    check_multinode_restarts(world_size=1)  # one node: the restart count is one agent's, consistent
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    check_multinode_restarts(world_size=2)  # no restarts: nothing can go stale


@pytest.mark.parametrize("text", [
    "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    "torch.distributed.DistStoreError: wait timeout after 60000ms, keys: /torch.rendezvous.mn.1/torchelastic/"
    "role_info/0, /torch.rendezvous.mn.1/torchelastic/role_info/1",
    "torch.distributed.DistStoreError: wait timeout after 60000ms, keys: /torch.rendezvous.mn.1/MASTER_ADDR",
])
def test_rejoin_failures_are_explained(text):
    assert "node_rejoin_timeout" in [e.key for e in explain_error(text)]


def test_a_lost_store_host_is_explained():
    text = ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store "
            "has failed. See inner exception for details.")
    assert [e.key for e in explain_error(text)] == ["rendezvous_store_lost"]
