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

  python scripts/slurm_local.py scripts/slurm_2nodes.sbatch scripts/02_data_parallel.py --max-steps 4
  NPROC_PER_NODE=1 is set unless given (GPUs per node on a CPU machine: one worker per node).
"""

from __future__ import annotations

import argparse
import os
import random
import stat
import sys
import tempfile
from pathlib import Path

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
# stand-in for `scontrol show hostnames LIST` (scripts/slurm_local.py): a,b and prefix[0-3] lists
if [[ $1 != show || $2 != hostnames ]]; then echo "fake scontrol: only 'show hostnames' exists" >&2; exit 2; fi
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
    p.add_argument("batch_script", help="the sbatch file, e.g. scripts/slurm_2nodes.sbatch")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="what `sbatch FILE ...` would pass the batch script (the training script and its flags)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nodelist = args.nodelist or ",".join(["127.0.0.1"] * args.nodes)
    job_id = args.job_id if args.job_id is not None else random.randint(100_000, 999_999)
    root = repo_root()
    with tempfile.TemporaryDirectory(prefix="slurm_local_") as tmp:
        env = child_env(slurm_env(args.nodes, nodelist, job_id, write_stand_ins(Path(tmp))))
        print(f"slurm_local: job {job_id}, {args.nodes} nodes ({nodelist}), "
              f"{env['NPROC_PER_NODE']} worker(s) per node", flush=True)
        result = stream_command(["bash", str(Path(args.batch_script).resolve()), *args.script_args], cwd=root, env=env,
                                timeout=args.timeout, live=True)
    print(f"slurm_local: the batch script exited with status {result.returncode}", flush=True)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
