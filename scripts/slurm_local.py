#!/usr/bin/env python
"""Dry-run a SLURM batch script on this one machine: N "nodes" that are N processes here.

Why: a batch script's own logic (the head node from ``scontrol show hostnames``,
the port from the job id, the workers per node, the node count handed to
torchrun, the output folder) first runs on the cluster, after the job waited in
the queue. This runs the same file with ``bash`` here, with the ``SLURM_*``
variables SLURM would set and two stand-ins first on ``PATH``:

- ``srun CMD...`` starts CMD once per node, all at once, with ``SLURM_NODEID``,
  ``SLURM_PROCID`` and ``SLURMD_NODENAME`` set per node, prefixes each output
  line with ``[nodeI]`` and fails if any node failed (srun's own options are
  skipped; options that take a separate value are not understood);
- ``scontrol show hostnames LIST`` expands ``a,b`` and ``prefix[0-3]`` lists.

The batch script derives the port from the job id (a random one here) unless
``MASTER_PORT`` is set. Every "node" is this host, so the node list defaults to ``127.0.0.1,127.0.0.1``
(the head node must be an address torchrun can reach). What it proves: the
script's arithmetic and its torchrun line train to the end with the real
rendezvous. What it cannot: your cluster's network, GPUs per node, module
loads or file systems (docs/multinode.md).

Preemption and requeue (``--preempt-at-step K``): once ``$OUT_DIR/metrics.jsonl`` has step K, the
signal of the script's ``#SBATCH --signal=[B:]SIG@T`` line goes where SLURM sends it (``B:``: the batch
shell; otherwise every process of the job step: the torchrun agents and their workers), as the time limit
approaching would. ``scontrol requeue $SLURM_JOB_ID`` then runs the batch script again, with the same job
id and ``SLURM_RESTART_COUNT`` + 1, as SLURM requeues a job.

  python scripts/slurm_local.py scripts/slurm_2nodes.sbatch scripts/02_data_parallel.py --max-steps 4
  python scripts/slurm_local.py --preempt-at-step 2 scripts/slurm_2nodes.sbatch scripts/02_data_parallel.py
  NPROC_PER_NODE=1 is set unless given (GPUs per node on a CPU machine: one worker per node).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from ecomkit.faults.preempt_demo import last_logged_step
from ecomkit.launch import child_env, repo_root, stream_command

FAKE_SRUN = r"""#!/usr/bin/env bash
# stand-in for srun (scripts/slurm_local.py): one copy of the command per "node", all on this host
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
  node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n "$((i + 1))p")
  echo "[node$i] srun (slurm_local): $node runs: $*"
  ( set -o pipefail
    SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURMD_NODENAME=$node "$@" 2>&1 | sed -u "s/^/[node$i] /"
  ) &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
"""

FAKE_SCONTROL = r"""#!/usr/bin/env bash
# stand-in for `scontrol show hostnames LIST` and `scontrol requeue JOBID` (scripts/slurm_local.py)
if [[ $1 == requeue ]]; then echo "$2" >> "$SLURM_LOCAL_REQUEUE"; exit 0; fi
if [[ $1 != show || $2 != hostnames ]]; then echo "fake scontrol: only 'show hostnames' and 'requeue'" >&2; exit 2; fi
IFS=',' read -ra parts <<< "$3"
for p in "${parts[@]}"; do
  if [[ $p =~ ^(.*)\[([0-9]+)-([0-9]+)\]$ ]]; then
    for ((n = BASH_REMATCH[2]; n <= BASH_REMATCH[3]; n++)); do echo "${BASH_REMATCH[1]}$n"; done
  else
    echo "$p"
  fi
done
"""


def write_stand_ins(folder: Path) -> Path:
    """``srun`` and ``scontrol`` scripts in ``folder`` (put first on PATH)."""
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def slurm_env(nodes: int, nodelist: str, job_id: int, bin_dir: Path) -> dict[str, str]:
    """The variables a batch script reads, as SLURM would set them on the first node of the allocation."""
    python_bin = str(Path(sys.executable).parent)  # torchrun, deepspeed and python of this environment
    return {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": "ecomkit", "SLURM_NNODES": str(nodes),
            "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_JOB_NODELIST": nodelist, "SLURM_NODEID": "0",
            "SLURM_NTASKS_PER_NODE": "1", "NPROC_PER_NODE": os.environ.get("NPROC_PER_NODE", "1"),
            "PATH": os.pathsep.join([str(bin_dir), python_bin, os.environ.get("PATH", "")])}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--nodes", type=int, default=2, help="how many nodes to pretend (SLURM_NNODES)")
    p.add_argument("--nodelist", default=None,
                   help="SLURM_JOB_NODELIST; every name must reach this host (default: 127.0.0.1 once per node)")
    p.add_argument("--job-id", type=int, default=None, help="SLURM_JOB_ID (default: random)")
    p.add_argument("--timeout", type=float, default=None, help="kill the whole run after this many seconds")
    p.add_argument("--preempt-at-step", type=int, default=0,
                   help="once $OUT_DIR/metrics.jsonl has this step, send the #SBATCH --signal signal (0 = never)")
    p.add_argument("--max-requeues", type=int, default=3, help="honour at most this many `scontrol requeue`s")
    p.add_argument("batch_script", help="the sbatch file, e.g. scripts/slurm_2nodes.sbatch")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="what `sbatch FILE ...` would pass the batch script (the training script and its flags)")
    return p.parse_args(argv)


def sbatch_signal(batch_script: Path) -> tuple[signal.Signals, bool]:
    """``#SBATCH --signal=[B:]SIG@T``: the signal, and whether it goes to the batch shell only (``B:``)."""
    m = re.search(r"^#SBATCH\s+--signal=(B:)?([A-Z0-9]+)(@\d+)?", batch_script.read_text(), re.MULTILINE)
    if m is None:
        return signal.SIGTERM, False  # the time limit or a preemption without --signal: SIGTERM to the step
    name = m.group(2) if m.group(2).startswith("SIG") or m.group(2).isdigit() else "SIG" + m.group(2)
    return (signal.Signals(int(name)) if name.isdigit() else signal.Signals[name]), bool(m.group(1))


def step_processes(shell_pid: int) -> list[psutil.Process]:
    """What SLURM signals in a job step: the torchrun agents under (fake) srun, and their workers."""
    found = []
    for proc in psutil.Process(shell_pid).children(recursive=True):
        try:
            head = proc.cmdline()[:3]
            if any(Path(part).name == "torchrun" for part in head[:2]) or "torch.distributed.run" in head:
                found.append(proc)
                found.extend(proc.children(recursive=True))
        except psutil.Error:
            continue
    return found


def preempt_when_logged(out_dir: Path, step: int, batch_script: Path, shell_pid: Any, done: threading.Event) -> None:
    """Wait for ``step`` in metrics.jsonl, then deliver the batch script's --signal as SLURM would.

    The step's processes are paused around the delivery (SIGSTOP/SIGCONT) so that a tiny model's run cannot
    finish between the row and the signal; where it then stops does not change what the run must show.
    """
    sig, batch_only = sbatch_signal(batch_script)
    while not done.is_set() and last_logged_step(out_dir / "metrics.jsonl") < step:
        time.sleep(0.005)
    if done.is_set() or shell_pid[0] is None:
        return
    procs = step_processes(shell_pid[0])
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    targets = [psutil.Process(shell_pid[0])] if batch_only else procs
    print(f"slurm_local: step {step} logged: sending {sig.name} to "
          f"{'the batch shell' if batch_only else f'{len(procs)} process(es) of the job step'}", flush=True)
    for p in targets:
        p.send_signal(sig)
    time.sleep(0.3)
    for p in procs:
        p.send_signal(signal.SIGCONT)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nodelist = args.nodelist or ",".join(["127.0.0.1"] * args.nodes)
    job_id = args.job_id if args.job_id is not None else random.randint(100_000, 999_999)
    root = repo_root()
    batch = Path(args.batch_script).resolve()
    with tempfile.TemporaryDirectory(prefix="slurm_local_") as tmp:
        requeue_file = Path(tmp) / "requeue"
        env = child_env({**slurm_env(args.nodes, nodelist, job_id, write_stand_ins(Path(tmp))),
                         "SLURM_LOCAL_REQUEUE": str(requeue_file)})
        print(f"slurm_local: job {job_id}, {args.nodes} nodes ({nodelist}), "
              f"{env['NPROC_PER_NODE']} worker(s) per node", flush=True)
        for restart in range(args.max_requeues + 1):
            env["SLURM_RESTART_COUNT"] = str(restart)
            requeue_file.unlink(missing_ok=True)
            shell_pid: list[Any] = [None]
            done = threading.Event()
            watcher = None
            if args.preempt_at_step and restart == 0:
                out_dir = Path(os.environ.get("OUT_DIR", root / f"runs/slurm-{job_id}"))
                watcher = threading.Thread(target=preempt_when_logged, daemon=True,
                                           args=(out_dir, args.preempt_at_step, batch, shell_pid, done))
                watcher.start()
            result = stream_command(["bash", str(batch), *args.script_args], cwd=root, env=env,
                                    timeout=args.timeout, live=True, on_start=lambda p: shell_pid.__setitem__(0, p.pid))
            done.set()
            if watcher is not None:
                watcher.join()
            print(f"slurm_local: the batch script exited with status {result.returncode}", flush=True)
            if not requeue_file.is_file():
                return result.returncode
            print(f"slurm_local: job {job_id} requeued (SLURM_RESTART_COUNT={restart + 1})", flush=True)
        print(f"slurm_local: more than {args.max_requeues} requeues; stopping", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
