#!/usr/bin/env python
"""Chapter 07: diagnose a distributed set-up before (or after) a job fails.

Runs, on every rank: the environment lint of chapter 01, a collective test
(all-reduce with known sums, all-gather of host names, a timed barrier) and a
checkpoint round trip (DCP save of a small DDP model + AdamW into a directory
every rank must see, load into a fresh copy, bit-for-bit comparison). Exit
status 1 if anything failed.

    python scripts/07_troubleshoot.py                                   # one process
    torchrun --standalone --nproc_per_node 2 scripts/07_troubleshoot.py --workdir runs/diagnose
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:29500 \
        scripts/07_troubleshoot.py --workdir /shared/ckpt_test      # must be a shared folder

Explain an error from a log (no process group needed):

    python scripts/07_troubleshoot.py --explain-file job.log
    python scripts/07_troubleshoot.py --explain "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ecomkit.dist import distributed_session, install_stack_dump_signal
from ecomkit.errors import ConfigError, exit_on_user_error
from ecomkit.faults.diagnose import diagnose
from ecomkit.faults.known_errors import explain_error


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="runs/diagnose", help="folder for the checkpoint check (shared by all ranks)")
    p.add_argument("--timeout", type=float, default=60.0, help="process-group timeout in seconds")
    p.add_argument("--json-out", default=None, help="also write the result as JSON here (rank 0)")
    p.add_argument("--explain", default=None, help="an error message to look up in the catalogue, then exit")
    p.add_argument("--explain-file", default=None, help="a log file to look up in the catalogue, then exit")
    return p.parse_args(argv)


def explain(text: str) -> int:
    found = explain_error(text)
    if not found:
        print("no known error matches; see notebooks/07_troubleshooting.ipynb for the catalogue")
        return 1
    for e in found:
        print(f"== {e.title}\ncause: {e.cause}\nfix:   {e.fix}\n")
    return 0


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.explain or args.explain_file:
        if args.explain_file and not Path(args.explain_file).is_file():
            raise ConfigError(f"--explain-file {args.explain_file}: no such file.")
        return explain(args.explain or Path(args.explain_file).read_text(errors="replace"))
    install_stack_dump_signal()
    with distributed_session(timeout_s=args.timeout) as env:
        result = diagnose(env, args.workdir)
        if env.is_main and args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
            print(f"wrote {args.json_out}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
