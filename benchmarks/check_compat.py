#!/usr/bin/env python
"""Which torch and transformers ecomkit runs on: one smoke set per installed pair, recorded as an artifact.

Why: ``pyproject.toml`` gives floors (``torch>=…``, ``transformers>=…,<6``), not a pin, so that installing
ecomkit on a GPU machine keeps the CUDA torch already there. A floor is only worth what was run on it: this
script runs the same smoke set in scratch virtual environments (outside the repository), one candidate pair
of versions each, and writes what ran and what passed to ``benchmarks/results/compat-<date>-<machine>.json``.

    # a scratch environment per candidate: torch and transformers as given, the other dependencies as
    # pyproject.toml says (ecomkit itself is not installed into it: the checks run the working tree)
    python benchmarks/check_compat.py --make-venv /tmp/compat/t2.11-tf5.17 --torch 2.11.0 --transformers 5.17.0
    # the smoke set in each environment, every row into one artifact
    python benchmarks/check_compat.py --python /tmp/compat/t2.11-tf5.17/bin/python --python ...
    # or side by side: each run writes its rows, one more run joins them (and any --python) into the artifact
    python benchmarks/check_compat.py --python A/bin/python --rows-out /tmp/compat/rows-a.json &
    python benchmarks/check_compat.py --python B/bin/python --rows-out /tmp/compat/rows-b.json; wait
    python benchmarks/check_compat.py --rows-in /tmp/compat/rows-a.json --rows-in /tmp/compat/rows-b.json

The smoke set (:data:`CHECKS`): import ecomkit's training stack; a 2-process DDP run of 3 steps through
``scripts/02_data_parallel.py`` with packing on and off; a LoRA run (bf16: the frozen base loads in bf16);
the attention and packing unit tests. Each environment also answers, by ``pip install --dry-run`` (nothing
is installed), whether ``pip install -e .`` would keep its torch: the point of floors over a pin.

Speed notes (:data:`NOTES`) are measured in each environment too, and recorded, but never fail it: a
version that runs a path slower still trains correctly, so it is no reason to raise a floor (and replace a
user's torch). Today: how many graphs ``--compile`` makes of a packed step, per step (blocks, head + loss);
``ecomkit/fast/compile.py`` warns at run time where the head + loss is two graphs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAIL = 1500          # characters of a failing check's output kept in the artifact

# (name, command after the interpreter); {out} is a fresh output folder per check
_RUN = ["scripts/02_data_parallel.py", "--model", "tiny", "--n-rows", "200", "--eval-interval", "0",
        "--eval-batches", "1", "--no-progress", "--output-dir", "{out}"]
_DDP = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *_RUN, "--max-steps", "3"]
CHECKS: list[tuple[str, list[str]]] = [
    ("import", ["-c", "import ecomkit.train.loop, ecomkit.parallel, ecomkit.planner.cli, ecomkit.models.lora, "
                      "ecomkit.parallel.fsdp, ecomkit.parallel.mixed"]),
    ("ddp_2proc_packing_on", [*_DDP, "--packing", "on"]),
    ("ddp_2proc_packing_off", [*_DDP, "--packing", "off"]),
    ("lora_bf16_step", [*_RUN, "--max-steps", "2", "--peft", "lora", "--precision", "bf16", "--packing", "off"]),
    ("attention_packing_unit_tests", ["-m", "pytest", "tests/test_attention.py", "tests/test_packing.py", "-q",
                                      "-p", "no:cacheprovider"]),
]

# Speed notes: (name, command printing one JSON value as its last line), recorded per environment, never failed
NOTES: list[tuple[str, list[str]]] = [
    ("packed_step_graphs", ["-c", "import json; from ecomlab.measure.compile_graphs import packed_step_graphs; "
                                  "print(json.dumps(packed_step_graphs(3)))"]),
]


def project_dependencies() -> list[str]:
    """pyproject.toml's dependencies, as written."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def make_venv(path: Path, torch_version: str, transformers_version: str, find_links: str | None) -> Path:
    """A virtual environment with this torch and transformers and pyproject's other dependencies (plus pytest)."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    others = [d for d in project_dependencies() if not re.match(r"(torch|transformers)\b", d)]
    pip = [str(python), "-m", "pip", "install", "-q"] + (["--find-links", find_links] if find_links else [])
    subprocess.run([*pip, f"torch=={torch_version}", f"transformers=={transformers_version}", *others,
                    "pytest>=8.0"], check=True)
    return python


def versions(python: str) -> dict[str, str]:
    code = ("import json, importlib.metadata as m; print(json.dumps({p: m.version(p) for p in "
            "('torch', 'transformers', 'peft', 'accelerate', 'deepspeed', 'datasets', 'tokenizers')}))")
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def _run(python: str, name: str, argv: list[str], scratch: Path, timeout: int) -> tuple[dict, str]:
    """Run one command in the working tree with ``python``; its own HOME and cache, so no JIT build is shared."""
    out = scratch / name
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HOME": str(scratch / "home"),
           "ECOMKIT_CACHE": str(scratch / "cache"), "TMPDIR": str(scratch)}
    cmd = [python, *[a.format(out=out) for a in argv]]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        rc, stdout, text = proc.returncode, proc.stdout, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, text = "timeout", "", f"{exc.stdout or ''}{exc.stderr or ''}"
    row = {"passed": rc == 0, "returncode": rc, "seconds": round(time.perf_counter() - t0, 1),
           "command": " ".join(["python", *cmd[1:]]).replace(str(scratch), "<scratch>")}
    if rc != 0:
        row["output_tail"] = text[-TAIL:] if isinstance(text, str) else str(text)[-TAIL:]
    return row, stdout if isinstance(stdout, str) else ""


def run_check(python: str, name: str, argv: list[str], scratch: Path, timeout: int) -> dict:
    """One check of the smoke set: passed when its command exits 0."""
    return {"check": name, **_run(python, name, argv, scratch, timeout)[0]}


def run_note(python: str, name: str, argv: list[str], scratch: Path, timeout: int) -> dict:
    """One speed note: the JSON value its command printed last (None, with the output's end, if it failed)."""
    row, stdout = _run(python, name, argv, scratch, timeout)
    lines = stdout.strip().splitlines()
    return {"note": name, "value": json.loads(lines[-1]) if row["passed"] and lines else None, **row}


def install_keeps_torch(python: str) -> dict:
    """Would ``pip install -e .`` replace this environment's torch? A dry run with a JSON report: nothing changes."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        proc = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                               "-e", str(REPO)], capture_output=True, text=True)
        if proc.returncode != 0:
            return {"resolved": False, "output_tail": (proc.stdout + proc.stderr)[-TAIL:]}
        installs = json.loads(report.read_text())["install"]
    changed = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
    return {"resolved": True, "keeps_torch": "torch" not in changed, "would_install_torch": changed.get("torch"),
            "would_install_transformers": changed.get("transformers")}


def check_environment(python: str, timeout: int) -> dict:
    row = {"python": python, "versions": versions(python), "checks": []}
    print(f"== {python}: torch {row['versions']['torch']}, transformers {row['versions']['transformers']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ecomkit-compat-") as scratch:
        for name, argv in CHECKS:
            result = run_check(python, name, argv, Path(scratch), timeout)
            row["checks"].append(result)
            print(f"   {'ok  ' if result['passed'] else 'FAIL'} {name} ({result['seconds']} s)", flush=True)
        row["speed_notes"] = [run_note(python, name, argv, Path(scratch), timeout) for name, argv in NOTES]
        for note in row["speed_notes"]:
            print(f"   note {note['note']}: {note['value']} ({note['seconds']} s)", flush=True)
    row["all_passed"] = all(c["passed"] for c in row["checks"])
    row["pip_install_e"] = install_keeps_torch(python)
    print(f"   pip install -e . keeps torch: {row['pip_install_e'].get('keeps_torch')}", flush=True)
    return row


def same_checked_code(commit: str) -> bool:
    """Whether the code the checks run (ecomkit, the scripts, the unit tests they run) is as it was at ``commit``."""
    paths = ["ecomkit", "scripts", "tests/conftest.py", "tests/test_attention.py", "tests/test_packing.py"]
    return subprocess.run(["git", "diff", "--quiet", commit, "HEAD", "--", *paths], cwd=REPO).returncode == 0


def release(version: str) -> tuple[int, ...]:
    """``2.13.0+cpu`` → (2, 13, 0)."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def floors(rows: list[dict]) -> dict[str, str | None]:
    """The lowest version of each package that passed, with no failure at or above it.

    A failing pair does not say which package failed, so each is judged with the other held where it is known
    to work: transformers on the newest torch checked, torch on transformers at or above that floor.
    """
    newest_torch = max((release(r["versions"]["torch"]) for r in rows), default=())
    same_torch = [r for r in rows if release(r["versions"]["torch"]) == newest_torch]
    out = {"transformers": _lowest_passing(same_torch, "transformers")}
    tf_floor = release(out["transformers"]) if out["transformers"] else (99,)
    out["torch"] = _lowest_passing([r for r in rows if release(r["versions"]["transformers"]) >= tf_floor], "torch")
    return out


def _lowest_passing(rows: list[dict], pkg: str) -> str | None:
    failed = [release(r["versions"][pkg]) for r in rows if not r["all_passed"]]
    passed = sorted({r["versions"][pkg] for r in rows if r["all_passed"]}, key=release)
    ok = [v for v in passed if not any(f >= release(v) for f in failed)]
    return ok[0].split("+")[0] if ok else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make-venv", type=Path, help="create this scratch environment (outside the repository)")
    parser.add_argument("--torch", help="with --make-venv: the torch version to install")
    parser.add_argument("--transformers", help="with --make-venv: the transformers version to install")
    parser.add_argument("--find-links", help="with --make-venv: a folder of wheels pip may use (e.g. torch)")
    parser.add_argument("--python", action="append", default=[], help="an environment's interpreter to check")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per check")
    parser.add_argument("--results-dir", help="where the artifact goes (default benchmarks/results)")
    parser.add_argument("--rows-out", type=Path, help="write this run's rows to this file instead of an artifact "
                        "(environments checked by runs side by side; join them with --rows-in)")
    parser.add_argument("--rows-in", type=Path, action="append", default=[],
                        help="rows a --rows-out run wrote (its checked code as at this commit), joined first into "
                        "this run's artifact; pip's answer is asked again here")
    args = parser.parse_args()
    if args.make_venv:
        if not (args.torch and args.transformers):
            parser.error("--make-venv needs --torch and --transformers")
        if args.make_venv.resolve().is_relative_to(REPO):
            parser.error("--make-venv: put scratch environments outside the repository (e.g. under /tmp)")
        print(make_venv(args.make_venv, args.torch, args.transformers, args.find_links))
    if not (args.python or args.rows_in):
        return
    rows = [check_environment(p, args.timeout) for p in args.python]
    sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]   # this working tree's ecomkit, not an installed one
    from common import machine_facts, write_artifact

    facts = machine_facts()
    if args.rows_out:
        args.rows_out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "commit": facts["commit"],
                                             "dirty": facts["dirty"], "rows": rows}, indent=1))
        return
    parts = [json.loads(path.read_text()) for path in args.rows_in]
    for path, part in zip(args.rows_in, parts):
        if part["dirty"] or facts["dirty"] or not same_checked_code(part["commit"]):
            parser.error(f"--rows-in {path}: its rows ran at commit {part['commit']} (dirty: {part['dirty']}); "
                         "the code the checks run must be as at this commit and both trees clean: check them again")
    rows = [r for part in parts for r in part["rows"]] + rows
    with ThreadPoolExecutor(4) as pool:        # pip's answer depends on this commit's pyproject.toml: ask it again
        for row, answer in zip(rows, pool.map(install_keeps_torch, [r["python"] for r in rows])):
            row["pip_install_e"] = answer
    write_artifact("compat", rows, extra={
        "partial_runs": [{"command": part["command"], "commit": part["commit"]} for part in parts],
        "checks": [name for name, _ in CHECKS], "speed_notes": [name for name, _ in NOTES], "floors": floors(rows),
        "notes": ["one row per environment: its torch and transformers (and peft, accelerate, deepspeed, datasets, "
                  "tokenizers) as installed, each check's return code and time; the checks run this commit's "
                  "working tree with that environment's interpreter",
                  "the top-level 'versions' are the interpreter that ran this script, not the environments checked",
                  "pip_install_e: `pip install --dry-run -e .` in that environment; keeps_torch = torch is not in "
                  "what pip would install",
                  "floors: per package, the lowest version that passed with no failure at or above it (transformers on "
                  "the newest torch checked, torch with transformers at or above that floor)",
                  "partial_runs: the --rows-out runs (side by side) whose rows come first, each at a commit whose "
                  "checked code (ecomkit, scripts, the unit tests the checks run) is this commit's; pip_install_e is "
                  "asked again here for every row, since it depends on this commit's pyproject.toml",
                  "speed_notes: measured per environment, never part of all_passed (a slower path is not a failure); "
                  "packed_step_graphs = [block graphs, head + loss graphs] compiled so far after each of 3 packed "
                  "training steps (ecomlab/measure/compile_graphs.py); null where the command failed"],
    }, results_dir=args.results_dir)


if __name__ == "__main__":
    main()
