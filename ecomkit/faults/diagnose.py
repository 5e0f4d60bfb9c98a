"""Chapter 07: diagnose a distributed job, watch a stalled one from outside, check a resumed one.

:func:`diagnose` lints the environment, tests a collective and round-trips a checkpoint; :func:`run_stall_demo`
takes ``py-spy dump`` of every rank of a hung job; :func:`compare_resumed_run` checks a killed-and-resumed run ends
where an uninterrupted one did. ``kill -USR1 <worker pid>`` prints a worker's stacks; the torchrun agent dies of it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ecomkit.dist import DistEnv, gather_objects
from ecomkit.envcheck.collectives import all_ranks_passed, check_all_reduce
from ecomkit.envcheck.lint import Finding, format_findings
from ecomkit.envcheck.run import lint_per_host
from ecomkit.faults.checkpoint import (
    TRAINER_STATE,
    CheckpointWriter,
    apply_model_optimizer_state,
    latest_checkpoint,
    load_dcp,
    model_optimizer_state,
    remove_stale_temp_dirs,
)
from ecomkit.faults.known_errors import backend_message
from ecomkit.launch import child_env, repo_root, stream_command


class StallInjector:
    """Callback: rank ``rank`` sleeps ``seconds`` after step ``at_step`` (a hung data loader, a dead GPU...)."""

    def __init__(self, rank: int, at_step: int, seconds: float):
        self.rank, self.at_step, self.seconds = rank, at_step, seconds

    def on_train_start(self, run: Any) -> None:
        # one write, not print(): print writes text and newline separately, so ranks' lines interleave
        sys.stdout.write(f"[rank {run.env.rank}] pid {os.getpid()} on {socket.gethostname()}\n")
        sys.stdout.flush()

    def on_step_end(self, run: Any, row: dict[str, Any]) -> None:
        if run.env.rank == self.rank and run.step == self.at_step:
            sys.stdout.write(f"[rank {run.env.rank}] stalling for {self.seconds:g} s after step {run.step} "
                             f"(pid {os.getpid()}): the other ranks now wait in their next collective\n")
            sys.stdout.flush()
            time.sleep(self.seconds)


class SlowRank:
    """Callback: every forward of rank ``rank`` takes ``ms`` longer (a throttled GPU), for straggler detection."""

    def __init__(self, rank: int, ms: float):
        self.rank, self.ms = rank, ms
        self._handle = None

    def on_train_start(self, run: Any) -> None:
        if run.env.rank != self.rank or self.ms <= 0:
            return
        inner = next(iter(run.strategy.raw_model.children()))  # inside the model, so the forward timer sees it
        self._handle = inner.register_forward_hook(lambda *_: time.sleep(self.ms / 1000.0))

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        if self._handle is not None:
            self._handle.remove()


@dataclass
class StallDemoResult:
    """What :func:`run_stall_demo` saw from outside the job: its output, timings and every rank's stacks."""

    returncode: int
    output: str
    stall_to_exit_s: float | None    # from the "stalling" line to the end of the job
    wall_s: float
    stacks: dict[int, str] = field(default_factory=dict)   # rank -> py-spy dump taken during the hang
    explanation: str | None = None   # the CollectiveTimeoutError paragraph, if printed

    def ended_by_timeout(self, timeout_s: float, slack_s: float = 30.0) -> bool:
        """The job failed with the explained timeout, within ``timeout_s`` (+ slack) of the stall: the demo's point."""
        return (self.returncode != 0 and self.explanation is not None and self.stall_to_exit_s is not None
                and self.stall_to_exit_s < timeout_s + slack_s)

    def backend_said(self) -> str | None:
        """gloo's/NCCL's own words inside the explanation ("Timed out waiting 10000ms for recv ...")."""
        return backend_message(self.explanation) if self.explanation else None

    def main_thread_stacks(self) -> dict[int, str]:
        """Rank -> the main thread's part of its ``py-spy dump`` (where the training loop was)."""
        return {rank: main_thread_stack(text) for rank, text in sorted(self.stacks.items())}

    def stack_shows(self, rank: int, frame: str) -> bool:
        """Did the ``py-spy dump`` of ``rank`` taken during the hang contain ``frame`` (False if py-spy failed)?"""
        return frame in self.stacks.get(rank, "")

    def watchdog_reports(self, tail_lines: int = 4) -> list[str]:
        """Each hang-watchdog report in the output: its header line and the innermost frames printed."""
        return hang_watchdog_reports(self.output, tail_lines)


def main_thread_stack(py_spy_text: str) -> str:
    """The ``"MainThread"`` section of a ``py-spy dump`` (the whole text when it names no main thread)."""
    if '"MainThread"' not in py_spy_text:
        return py_spy_text
    return py_spy_text.split('"MainThread"')[-1].split("Thread ")[0]


def hang_watchdog_reports(output: str, tail_lines: int = 4) -> list[str]:
    """The reports :class:`~ecomkit.faults.health.HangWatchdog` printed into a job's output, innermost frames last."""
    reports = []
    for block in output.split("\n[rank ")[1:]:
        if "has taken" in block:
            lines = block.splitlines()
            reports.append("[rank " + lines[0][:160] + "\n" + "\n".join(lines[-tail_lines:]))
    return reports


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # py-spy colours its output even into a pipe
_PID_LINE = re.compile(r"\[rank (\d+)\] pid (\d+)")
_STALL_LINE = re.compile(r"\[rank (\d+)\] stalling for")


def pids_in_line(line: str) -> dict[int, int]:
    """Rank -> pid of every ``[rank R] pid P`` in one output line (two ranks' lines can share one)."""
    return {int(m.group(1)): int(m.group(2)) for m in _PID_LINE.finditer(line)}


def _py_spy_dump(pid: int) -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return "py-spy is not installed (pip install py-spy)"
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
        return _ANSI.sub("", out.stdout + out.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {exc}"


def run_stall_demo(args: Sequence[str] = (), nproc: int = 2, dump_after_s: float = 2.0, timeout: float = 300,
                   env: dict[str, str] | None = None, live: bool = True) -> StallDemoResult:
    """Launch ``scripts/07_stall_demo.py`` under torchrun and ``py-spy dump`` every rank during the stall."""
    root = repo_root()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(root / "scripts" / "07_stall_demo.py"), *map(str, args)]
    t0 = time.perf_counter()
    pids: dict[int, int] = {}
    stacks: dict[int, str] = {}
    t_stall: float | None = None

    def watch(line: str) -> None:
        nonlocal t_stall
        pids.update(pids_in_line(line))
        if t_stall is None and _STALL_LINE.search(line):
            t_stall = time.perf_counter()
            threading.Thread(target=_dump_all, args=(pids, stacks, dump_after_s, nproc), daemon=True).start()

    proc = stream_command(cmd, cwd=root, env=child_env(env), timeout=timeout, live=live, on_line=watch)
    t_end = time.perf_counter()
    out = proc.stdout
    expl = next((ln.split("error: ", 1)[1].strip() for ln in out.splitlines()
                 if "error: " in ln and "timed out after" in ln), None)
    return StallDemoResult(proc.returncode, out, (t_end - t_stall) if t_stall else None, t_end - t0, stacks, expl)


def _dump_all(pids: dict[int, int], stacks: dict[int, str], delay: float, nproc: int) -> None:
    """``py-spy dump`` every rank; a rank whose pid line was not seen gets a line saying so, not silence."""
    time.sleep(delay)
    for rank in range(nproc):
        stacks[rank] = _py_spy_dump(pids[rank]) if rank in pids else \
            f"no '[rank {rank}] pid ...' line in the job's output before the stall: its pid is unknown"


def _collective_test(env: DistEnv) -> dict[str, Any]:
    if not env.distributed:
        return {"ok": True, "skipped": True, "note": "one process: nothing to communicate with"}
    t0 = time.perf_counter()
    check = check_all_reduce(env.rank, env.world_size, env.device)
    ok = all_ranks_passed(check.passed, env.device)
    hosts = gather_objects(socket.gethostname(), env)
    tb = time.perf_counter()
    dist.barrier()
    return {"ok": ok, "skipped": False, "cases": check.cases, "hosts": hosts,
            "barrier_ms": round((time.perf_counter() - tb) * 1e3, 3), "seconds": round(time.perf_counter() - t0, 3)}


def checkpoint_sanity_check(env: DistEnv, directory: str | os.PathLike) -> dict[str, Any]:
    """Save a small DDP model + AdamW with DCP, load it into a fresh copy, compare bit for bit.

    Also proves every rank sees the directory, so a node-local disk fails here, not mid-run.
    """
    root = Path(directory)
    group = dist.new_group(backend="gloo") if env.distributed else None
    if env.is_main:
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
    if env.distributed:
        dist.barrier(group=group)

    def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.nn.Module]:
        torch.manual_seed(seed)
        raw = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(env.device)
        wrapped = DDP(raw, device_ids=[env.device.index] if env.device.type == "cuda" else None) \
            if env.distributed else raw
        return raw, torch.optim.AdamW(wrapped.parameters(), lr=1e-2), wrapped

    raw, opt, wrapped = build(0)
    wrapped(torch.randn(4, 32, device=env.device)).square().mean().backward()
    opt.step()
    t0 = time.perf_counter()
    writer = CheckpointWriter(root, keep_last=1, group=group, rank=env.rank)
    writer.save(1, model_optimizer_state(raw, opt), {TRAINER_STATE: {"step": 1}} if env.is_main else {})
    save_s = time.perf_counter() - t0
    if env.distributed:
        dist.barrier(group=group)
    path = latest_checkpoint(root)
    visible = all(gather_objects(path is not None, env))  # every rank must see rank 0's commit
    identical = False
    load_s = None
    if visible:
        raw2, opt2, _ = build(1)
        t1 = time.perf_counter()
        state = model_optimizer_state(raw2, opt2)
        load_dcp(path, state, group)
        apply_model_optimizer_state(raw2, opt2, state)
        load_s = time.perf_counter() - t1
        same_params = all(torch.equal(a, b) for a, b in zip(raw.parameters(), raw2.parameters()))
        same_optim = all(torch.equal(opt.state[a]["exp_avg_sq"], opt2.state[b]["exp_avg_sq"])
                         for a, b in zip(raw.parameters(), raw2.parameters()))
        identical = same_params and same_optim
    size = sum(f.stat().st_size for f in path.iterdir()) if path is not None else 0
    free = shutil.disk_usage(root).free
    if env.distributed:
        dist.barrier(group=group)
        dist.destroy_process_group(group)
    if env.is_main:
        remove_stale_temp_dirs(root)
    return {"ok": bool(visible and identical), "shared_dir_visible_to_all": visible, "identical_after_load": identical,
            "save_s": round(save_s, 4), "load_s": round(load_s, 4) if load_s else None, "bytes": size,
            "disk_free_bytes": free, "dir": str(root.resolve())}


def diagnose(env: DistEnv, workdir: str | os.PathLike, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Environment lint, collective test, checkpoint round trip: the first thing to run on a new cluster."""
    say = echo if env.is_main else (lambda _s: None)
    lint = lint_per_host(env)
    lint_errors = sum(1 for fs in lint.values() for f in fs if f["severity"] == "error")
    for host, findings in lint.items():
        say(f"[{host}] " + format_findings([Finding(**f) for f in findings]))
    coll = _collective_test(env)
    say(f"collective test: {'SKIPPED' if coll.get('skipped') else ('PASS' if coll['ok'] else 'FAIL')} "
        + ("" if coll.get("skipped") else f"({', '.join(k for k in coll['cases'])}; barrier {coll['barrier_ms']} ms)"))
    ck = checkpoint_sanity_check(env, Path(workdir) / "checkpoint_check")
    say(f"checkpoint check: {'PASS' if ck['ok'] else 'FAIL'} (saved in {ck['save_s']} s, loaded in {ck['load_s']} s, "
        f"{ck['bytes']:,} bytes, identical={ck['identical_after_load']}, "
        f"visible to all ranks={ck['shared_dir_visible_to_all']}, {ck['disk_free_bytes'] / 2**30:.1f} GiB free)")
    ok = coll["ok"] and ck["ok"] and lint_errors == 0
    say(f"diagnose: {'OK' if ok else 'PROBLEMS FOUND'}")
    return {"ok": ok, "world_size": env.world_size, "backend": env.backend, "lint": lint, "lint_errors": lint_errors,
            "collectives": coll, "checkpoint": ck}


def losses_by_step(rows: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Training loss per step from ``metrics.jsonl`` rows; a step logged twice (redone after a resume): the last."""
    return {r["step"]: r["loss"] for r in rows if r.get("type") == "train"}


@dataclass
class ResumeComparison:
    """A run that was killed and resumed, step by step against the same run left alone."""

    resumed_from_step: int | None
    restore_s: float | None
    steps_logged: list[int]             # in log order: a redone step appears twice
    missing_steps: list[int]            # steps of the reference the resumed run never logged
    max_loss_diff: float                # over the steps both logged (the resumed run's last value)
    reference_final_loss: float
    resumed_final_loss: float
    reference_checksums: list[str]
    resumed_checksums: list[str]
    loss_pairs: list[tuple[float, float]] = field(default_factory=list)  # (reference, resumed) per common step

    @property
    def same_parameters(self) -> bool:
        """Both runs end with the same parameters (every replica's checksum; world sizes may differ)."""
        return bool(self.reference_checksums) and set(self.reference_checksums) == set(self.resumed_checksums)

    def losses_match(self, rel: float = 1e-6, abs_tol: float = 1e-7) -> bool:
        """Every step of the reference was logged with the same loss: no sample skipped or seen twice."""
        return not self.missing_steps and all(abs(got - want) <= max(rel * abs(want), abs_tol)
                                              for want, got in self.loss_pairs)

    def identical(self, rel: float = 1e-6, abs_tol: float = 1e-7) -> bool:
        """The verdict of chapter 07: same loss at every step and the same final parameters."""
        return self.losses_match(rel, abs_tol) and self.same_parameters


def compare_resumed_run(reference_rows: Sequence[dict[str, Any]], resumed_rows: Sequence[dict[str, Any]],
                        reference_summary: dict[str, Any], resumed_summary: dict[str, Any]) -> ResumeComparison:
    """Compare the metrics and summaries of an uninterrupted run and of a killed-then-resumed one."""
    want, got = losses_by_step(reference_rows), losses_by_step(resumed_rows)
    common = [step for step in want if step in got]
    ckpt = resumed_summary.get("checkpoint") or {}
    return ResumeComparison(
        resumed_from_step=ckpt.get("resumed_from_step"), restore_s=ckpt.get("restore_s"),
        steps_logged=[r["step"] for r in resumed_rows if r.get("type") == "train"],
        missing_steps=[step for step in want if step not in got],
        max_loss_diff=max((abs(got[s] - want[s]) for s in common), default=0.0),
        reference_final_loss=reference_summary["final_loss"], resumed_final_loss=resumed_summary["final_loss"],
        reference_checksums=list(reference_summary.get("replica_checksums", [])),
        resumed_checksums=list(resumed_summary.get("replica_checksums", [])),
        loss_pairs=[(want[s], got[s]) for s in common],
    )


__all__ = [
    "ResumeComparison", "SlowRank", "StallDemoResult", "StallInjector", "checkpoint_sanity_check",
    "compare_resumed_run", "diagnose", "hang_watchdog_reports", "losses_by_step", "main_thread_stack",
    "run_stall_demo",
]
