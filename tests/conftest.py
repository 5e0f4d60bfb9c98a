"""Shared fixtures: every test runs with one thread and writes only under tmp_path."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import fastlaunch
import notebook_launch
import pytest
import torch.distributed as dist

from ecomkit.train.preempt import PREEMPTED_EXIT_CODE, read_record
from ecomkit.faults.preempt_demo import run_preempted

REPO = Path(__file__).resolve().parents[1]

# Session-wide, so module-scoped fixtures see them too. The tokenizer cache is
# shared by all tests (training one takes a few seconds) and the DeepSpeed
# CPU-Adam build is cached across runs.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
# One inductor compile process per rank: its default pool of compile workers (each importing torch) costs
# more CPU than it saves when two ranks share two cores (measured: 168 vs 135 CPU-s for the compile test's
# launch). Set here, before the forkserver (fastlaunch) imports torch, which reads it at import.
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
os.environ.setdefault("ECOMKIT_CACHE", str(REPO / ".cache" / "ecomkit"))
# Notebook kernels launch the chapters' scripts from this process's preloaded forkserver, as the scripts' tests do.
os.environ["IPYTHONDIR"] = str(notebook_launch.kernel_profile(REPO / "tests"))
os.environ[notebook_launch.SERVICE_ENV] = notebook_launch.serve()


# Notebooks whose assertions are timings: `make test` runs them in its serial phase, with the
# tests marked `serial`, after the two-worker phase (pytest -n 2) has finished.
SERIAL_NOTEBOOKS = {"06_memory_tuning.ipynb": "asserts the time model against measured step times"}


def pytest_collection_modifyitems(config, items):
    """Mark the serial notebooks (a notebook cannot carry a marker itself), then put the longest files first.

    Why the order: ``make test`` hands whole files to two workers (``--dist loadfile``) in collection order
    (``--no-loadscope-reorder``; xdist's default sorts files by their number of tests, which sends the
    one-item notebooks and the few-test training files last, so one worker ran a long notebook alone while
    the other had finished). Longest first fills the end of the run with short unit-test files.
    """
    for item in items:
        if item.path.name in SERIAL_NOTEBOOKS:
            item.add_marker(pytest.mark.serial)
    weight: dict[Path, int] = {}
    for item in items:
        weight[item.path] = max(weight.get(item.path, 0), file_weight(item))
    items.sort(key=lambda item: -weight[item.path])   # stable: a file's items keep their order, and stay together


def file_weight(item) -> int:
    """2: a notebook or a test marked ``slow``; 1: a multi-process (``dist``) test; 0: the rest."""
    if item.path.suffix == ".ipynb" or item.get_closest_marker("slow"):
        return 2
    return 1 if item.get_closest_marker("dist") else 0


@pytest.fixture(autouse=True)
def _hermetic_tmp(tmp_path, monkeypatch):
    """torchrun writes torchelastic_* folders under TMPDIR."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def load_module(path: Path, name: str | None = None):
    """Import a script or benchmark file as a module (they are not a package), with its folder importable."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name or path.stem.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main_in_process(script: str, args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """Call ``scripts/<script>``'s ``main(args)`` here; returns (exit code, stderr).

    For input a script must refuse before any process group exists: creating
    one fails the call, so "refused early" is checked, not assumed. It saves
    the seconds of imports a fresh process pays (one subprocess test per
    script keeps the command-line path covered).
    """
    def no_group(*a, **k):
        raise AssertionError("a process group was created before the input was refused")

    monkeypatch.setattr(dist, "init_process_group", no_group)
    module = load_module(REPO / "scripts" / script, f"main_{Path(script).stem}")
    with pytest.raises(SystemExit) as exit_info:
        module.main(args)
    return exit_info.value.code, capsys.readouterr().err


def run_script(script: str, args: list[str], nproc: int = 0, timeout: int = 300,
               extra_env: dict[str, str] | None = None, torchrun_args: list[str] | None = None,
               check: bool = True, torchrun: bool = False, max_restarts: int = 0) -> subprocess.CompletedProcess:
    """Run ``scripts/<script>`` as one plain process (nproc=0: ``python script``) or N ranks.

    Both start from the preloaded forkserver (:mod:`fastlaunch`: ``python``'s process, or torchrun's worker
    environment without its agent, with the imports done; ``max_restarts`` as torchrun's) unless the launch
    needs the real launcher: ``torchrun=True`` (the test is about the torchrun path), ``torchrun_args``
    (rendezvous, or any other flag of the agent's), or ``extra_env`` that a preloaded module reads at import.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    path = str(REPO / "scripts" / script)
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    if not nproc and (torchrun or fastlaunch.import_time_vars(env)):
        proc = subprocess.run([sys.executable, path, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    elif not nproc:
        proc = fastlaunch.plain(path, args, env=env, cwd=REPO, timeout=timeout)
    elif torchrun or torchrun_args or fastlaunch.import_time_vars(env):
        proc = fastlaunch.torchrun(path, args, nproc, env=env, cwd=REPO, timeout=timeout,
                                   torchrun_args=[*(torchrun_args or ()), *restarts])
    else:
        proc = fastlaunch.run(path, args, nproc, env=env, cwd=REPO, timeout=timeout, max_restarts=max_restarts)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(proc.args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
                             f"--- stderr\n{proc.stderr[-6000:]}")
    return proc


def preempt_then_finish(script: str, args: list[str], out: Path, plan: list, root: Path | None = None,
                        steps: int = 8) -> list[dict]:
    """One launch per ``(signal, rank)`` of ``plan`` (rank None: the torchrun agent), each preempted one step
    after the previous stop (the first after step 2); then the same command once more, to the end."""
    root = root or out / "checkpoints"
    records: list[dict] = []
    for sig, rank in plan:
        at = records[-1]["step"] + 1 if records else 2
        run = run_preempted(f"scripts/{script}", args, out, at, sig, rank=rank, timeout=300)
        text = run.stdout
        assert run.returncode != 0, text[-3000:]  # torchrun exits 1: its workers' 75, or its own signal
        assert f"exitcode  : {PREEMPTED_EXIT_CODE}" in text or "got signal: 15" in text, text[-3000:]
        record = read_record(root)
        assert record and record["step"] >= at, text[-4000:]
        assert f"preempted ({sig.name}): checkpoint of step {record['step']} written to" in text, text[-4000:]
        assert record["step"] < steps and record["save_s"] > 0
        if rank is not None:
            assert record["signals"][rank] == sig.name and record["signals"].count(None) == 1  # only that rank
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "preempted" and summary["preemption"]["save_s"] == record["save_s"]
        records.append(record)
    run_script(script, args, nproc=2, timeout=300)
    return records
