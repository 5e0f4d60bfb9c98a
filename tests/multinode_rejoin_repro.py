#!/usr/bin/env python
"""Smallest reproduction: a replaced node cannot rejoin torchrun's shared rendezvous store (torch 2.13).

No ecomkit code runs in the workers: each one all-reduces a counter for ``--steps`` seconds.

  python tests/multinode_rejoin_repro.py                # torch's default store sharing: fails
  python tests/multinode_rejoin_repro.py --fresh-store  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: recovers

Two agents (``--nnodes 2 --nproc_per_node 1 --max_restarts 2``) on 127.0.0.1. Agent A starts first and hosts
the store. After 4 s agent B's whole process tree is killed and B is started again. With the shared store,
both agents end after the store's 60 s read timeout with ``DistStoreError: wait timeout``. A waits for
``.../torchelastic/role_info/{0,1}`` and the new B for ``.../MASTER_ADDR``. docs/multinode.md explains why.
An elastic range (``--nnodes 1:2``) ends the same way. Related: pytorch/pytorch#147064, #67742, #135712.
Takes about 1.5 minutes.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import psutil


def worker(steps: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    for _ in range(steps * 10):
        dist.all_reduce(t)
        time.sleep(0.1)
    print(f"rank {dist.get_rank()} finished", flush=True)
    dist.destroy_process_group()


def agent(port: int, fresh: bool, steps: int, nnodes: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1" if fresh else "0"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc_per_node", "1",
           "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "repro",
           "--max_restarts", "2", "--rdzv_conf", "keep_alive_interval=1,keep_alive_max_attempt=3",
           __file__, "--worker", "--steps", str(steps)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fresh-store", action="store_true", help="set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    p.add_argument("--steps", type=int, default=20, help="seconds each worker all-reduces")
    p.add_argument("--nnodes", default="2", help="torchrun's --nnodes: 2, or an elastic range such as 1:2")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.steps)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = agent(port, args.fresh_store, args.steps, args.nnodes)
    time.sleep(3)  # A binds the port first: it hosts the store
    b = agent(port, args.fresh_store, args.steps, args.nnodes)
    time.sleep(4 + 10)  # workers start (~10 s), then run 4 s
    for proc in [psutil.Process(b.pid), *psutil.Process(b.pid).children(recursive=True)]:
        proc.kill()
    b.wait()
    b2 = agent(port, args.fresh_store, args.steps, args.nnodes)
    codes = []
    for name, proc in (("A", a), ("B (started again)", b2)):
        out, _ = proc.communicate(timeout=300)
        codes.append(proc.returncode)
        errors = [ln for ln in out.splitlines() if "Error:" in ln or "finished" in ln]
        print(f"agent {name}: exit status {proc.returncode}\n  " + "\n  ".join(errors[-3:] or ["(no error line)"]))
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main())
