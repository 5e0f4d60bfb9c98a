"""The chapters are committed executed: every output came from the cell's current code, ran top to bottom, shows
no machine path, and the file stays readable on a repository page (``make notebooks`` regenerates them)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import load_module

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
execute = load_module(Path(__file__).resolve().parents[1] / "notebooks" / "execute.py", "notebook_execute")

# what a machine leaves in outputs: absolute home, temp and work folders, user@host prompts
MACHINE = re.compile(r"(/home/|/root\b|/Users/|/tmp/|/var/folders/|/work/|C:\\\\Users|\b\w+@[\w.-]+:)")


def _code(path: Path) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def stale_cells(path: Path) -> list[int]:
    """Code cells whose outputs were not produced by their current source (or that never ran)."""
    return [i for i, c in enumerate(_code(path))
            if c.metadata.get(execute.HASH_KEY, {}).get("source_sha256") != execute.source_hash(c.source)]


def output_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts += [v for k, v in out.get("data", {}).items() if k.startswith("text/") and isinstance(v, str)]
        parts += out.get("traceback", [])
    return "\n".join(parts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_output_came_from_the_cells_current_code(path):
    stale = stale_cells(path)
    assert not stale, f"{path.name}: code cells {stale} changed since the notebook ran: run `make notebooks NB={path.name[:2]}`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_notebook_ran_top_to_bottom_without_errors(path):
    counts = [c.execution_count for c in _code(path)]
    assert all(n is not None for n in counts), f"{path.name}: cells that never ran"
    assert counts == sorted(counts) and len(set(counts)) == len(counts), f"{path.name}: out of order {counts}"
    errors = [i for i, c in enumerate(_code(path)) if any(o.output_type == "error" for o in c.outputs)]
    assert not errors, f"{path.name}: cells {errors} end in an error"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_carry_no_machine_paths_and_stay_small(path):
    leaks = [(i, m.group(0)) for i, c in enumerate(_code(path)) for m in [MACHINE.search(output_text(c))] if m]
    assert not leaks, f"{path.name}: machine paths or user names in outputs: {leaks[:5]}"
    assert path.stat().st_size <= execute.MAX_BYTES, f"{path.name}: {path.stat().st_size:,} bytes"


def test_a_changed_cell_is_found_stale(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("y = 2")])
    execute.stamp(nb)
    nb.cells[1].source = "y = 3"
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    assert stale_cells(path) == [1]


def test_scrub_replaces_the_repository_temp_home_and_environment_folders(tmp_path):
    repo, home = str(execute.REPO), str(Path.home())
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                  text=f"{repo}/runs/a {tmp_path}/x {home}/.cache {sys.prefix}/bin/python\n")]
    execute.scrub(nb, execute.scrubbers(tmp_path))
    assert nb.cells[0].outputs[0].text == "runs/a <tmp>/x ~/.cache .venv/bin/python\n"
