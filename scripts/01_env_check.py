"""Chapter 01: check the software stack, the devices, the environment and the interconnect.

Run it before any training job: it prints versions, devices and CPU threads,
lints the NCCL / torch.distributed environment variables, checks that an
all-reduce across all ranks returns the right sums (exit status 1 if not), and
measures all-reduce bandwidth from 1 KiB to 64 MiB like nccl-tests does.

Launch lines (the script is the same everywhere; torchrun sets the ranks):

    # one process (notebook kernel, laptop, 1 GPU): report, lint, local copy speed
    python scripts/01_env_check.py
    torchrun --standalone --nproc_per_node 1 scripts/01_env_check.py

    # one node with N GPUs (or N CPU processes with gloo)
    torchrun --standalone --nproc_per_node 8 scripts/01_env_check.py --json-out runs/env_check/env_check.json

    # two nodes, 8 GPUs each: run the same line on both nodes (c10d rendezvous)
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d \
        --rdzv_endpoint HOST:29500 --rdzv_id job1 scripts/01_env_check.py

Flags: --sizes MIN:MAX (default 1K:64M), --factor (size step, default 4),
--iters (timed iterations for small sizes; big sizes use fewer), --json-out PATH.
"""

from __future__ import annotations

import argparse
import sys

from ecomkit.dist import distributed_session
from ecomkit.envcheck.collectives import size_range
from ecomkit.envcheck.run import run_env_check
from ecomkit.launch import write_json
from ecomkit.errors import ConfigError, exit_on_user_error


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1K:64M", help="message sizes MIN:MAX in bytes, units K/M/G (binary)")
    p.add_argument("--factor", type=int, default=4, help="multiply the size by this between steps")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (fewer for big sizes)")
    p.add_argument("--timeout", type=float, default=120.0, help="process-group timeout in seconds")
    p.add_argument("--json-out", default=None, help="also write the full result as JSON here (rank 0)")
    return p.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.iters < 1:
        raise ConfigError(f"--iters {args.iters}: need at least 1 timed iteration per size.")
    sizes = size_range(args.sizes, args.factor)
    with distributed_session(timeout_s=args.timeout) as env:
        result = run_env_check(env, sizes, args.iters)
        if env.is_main and args.json_out:
            print(f"wrote {write_json(result, args.json_out)}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
