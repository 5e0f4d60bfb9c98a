"""The whole chapter-01 check for one job: report, lint, all-reduce check, bandwidth sweep.

Every rank runs :func:`run_env_check` (the collectives need all); rank 0 prints each section as soon as it is done.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from typing import Any, Callable

from ecomkit.dist import DistEnv, gather_objects
from ecomkit.envcheck.alpha_beta import fit_sweep_rows, format_fit
from ecomkit.envcheck.collectives import (
    AllReduceCheck,
    all_ranks_passed,
    check_all_reduce,
    format_bandwidth,
    measure_all_reduce_bandwidth,
    measure_local_copy_bandwidth,
)
from ecomkit.envcheck.lint import Finding, format_findings, lint_current_env
from ecomkit.envcheck.system import format_report, system_report


def _rank_layout(env: DistEnv) -> list[dict[str, Any]]:
    me = {"rank": env.rank, "local_rank": env.local_rank, "host": socket.gethostname(), "device": str(env.device)}
    return gather_objects(me, env)


def lint_per_host(env: DistEnv) -> dict[str, list[dict[str, str]]]:
    """Lint on every node (environments can differ between nodes), keyed by host name."""
    mine = [f.as_dict() for f in lint_current_env(env.local_world_size)] if env.local_rank == 0 else None
    hosts = gather_objects((socket.gethostname(), mine), env)
    return {host: findings for host, findings in hosts if findings is not None}


def _all_reduce_check(env: DistEnv) -> AllReduceCheck:
    if not env.distributed:
        return AllReduceCheck(passed=True, skipped=True, cases={},
                              note="single process: no peer to reduce with; launch with torchrun --nproc_per_node 2+")
    mine = check_all_reduce(env.rank, env.world_size, env.device)
    everyone = all_ranks_passed(mine.passed, env.device)
    return replace(mine, passed=everyone, note="every rank passed" if everyone else "at least one rank FAILED")


def format_all_reduce(check: AllReduceCheck) -> str:
    if check.skipped:
        return f"all-reduce check: SKIPPED ({check.note})"
    lines = [f"all-reduce check: {'PASS' if check.passed else 'FAIL'} ({check.note})"]
    lines += [f"  {'ok  ' if ok else 'FAIL'} {name}" for name, ok in check.cases.items()]
    return "\n".join(lines)


def run_env_check(env: DistEnv, sizes: list[int], iters: int,
                  echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every check on every rank (all get the same result dict); only rank 0 echoes the sections."""
    say = echo if env.is_main else (lambda _s: None)
    start = time.perf_counter()
    report = system_report()
    layout = _rank_layout(env)
    say(format_report(report))
    say(f"job: world_size={env.world_size} backend={env.backend}")
    say("\n".join(f"  rank {r['rank']} (local {r['local_rank']}) on {r['host']}: {r['device']}" for r in layout))
    lint = lint_per_host(env)
    for host, findings in lint.items():
        say(f"[{host}] " + format_findings([Finding(**f) for f in findings]))
    check = _all_reduce_check(env)
    say(format_all_reduce(check))
    if env.distributed:
        kind, rows = "all_reduce", measure_all_reduce_bandwidth(sizes, iters, env.world_size, env.device)
    else:
        kind, rows = "local_copy", measure_local_copy_bandwidth(sizes, iters, env.device)
    say(format_bandwidth(rows, kind))
    fit = fit_sweep_rows([r.as_dict() for r in rows], env.world_size) if kind == "all_reduce" and len(rows) > 1 else None
    if fit is not None:
        say(format_fit(fit))
    result = {
        "world_size": env.world_size,
        "backend": env.backend,
        "ranks": layout,
        "report": report,
        "lint": lint,
        "all_reduce": check.as_dict(),
        "bandwidth": {"kind": kind, "rows": [r.as_dict() for r in rows]},
        "alpha_beta": fit.as_dict() if fit is not None else None,
        "ok": check.passed,
        "elapsed_s": round(time.perf_counter() - start, 3),
    }
    say(f"env check {'OK' if result['ok'] else 'FAILED'} in {result['elapsed_s']:.1f} s")
    return result

