"""Reading a chapter notebook's committed JSON as a learner would: its markdown, its code cells, in order.

Why a module of its own: the lesson tests (tests/test_lessons_*.py) check what a notebook *teaches* without
running it (which code comes first, which terms are defined before use, which images are shown from markdown),
and each chapter's checks read the notebook the same way.

Conventions the lesson tests hold every chapter to:
- the first code cell that shows a chapter's technique carries the cell tag ``mechanism`` and runs the
  technique's own code (torch / torch.distributed calls), not an ``ecomkit`` helper or a script launch;
- diagrams are PNG files drawn by code (``ecomlab/plots/diagrams*.py``) into ``notebooks/figures/`` and shown
  from a markdown cell (``![…](figures/NAME.png)``), so they are read without running anything;
- a hand-written cell beyond the mechanism (an overlap, a mixed-precision or a checkpointing cell) carries a tag of
  its own, so a test can run that cell's code (:func:`tagged_source`, :func:`run_source`) and assert its values;
- a chapter closes with ``## Exercises``, then ``## Checks`` (the proof behind the lesson) where it has any, then
  the guides' claims in one section whose heading starts with ``## Appendix: the guides' claims``.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
APPENDIX_HEADING = "## Appendix: the guides' claims"


def load(name: str) -> list[dict]:
    """The notebook's cells, each with ``source`` joined into one string."""
    nb = json.loads((NOTEBOOKS / name).read_text())
    return [{**cell, "source": "".join(cell["source"])} for cell in nb["cells"]]


def code_cells(cells: list[dict]) -> list[tuple[int, str]]:
    return [(i, c["source"]) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def markdown_text(cells: list[dict]) -> str:
    return "\n\n".join(c["source"] for c in cells if c["cell_type"] == "markdown")


def tagged(cells: list[dict], tag: str) -> list[int]:
    """Indices of the cells that carry ``tag`` in their metadata."""
    return [i for i, c in enumerate(cells) if tag in c.get("metadata", {}).get("tags", [])]


def shown_images(cells: list[dict]) -> list[str]:
    """Image paths that markdown cells show (``![alt](path)`` or ``<img src="path">``)."""
    text = markdown_text(cells)
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text) + re.findall(r"<img[^>]*src=\"([^\"]+)\"", text)


def first_index(cells: list[dict], pattern: str) -> int | None:
    """The first cell (any type) whose text matches ``pattern`` (a regex), or None."""
    rx = re.compile(pattern)
    return next((i for i, c in enumerate(cells) if rx.search(c["source"])), None)


def tagged_source(cells: list[dict], tag: str) -> str:
    """The code of every cell tagged ``tag``, in notebook order: what a test runs to check a hand-written cell."""
    return "\n\n".join(cells[i]["source"] for i in tagged(cells, tag) if cells[i]["cell_type"] == "code")


def definitions(source: str, names: set[str]) -> str:
    """The imports and the named top-level functions and classes of ``source``, without the code that runs them."""
    tree = ast.parse(source)
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
            or (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names)]
    assert {n.name for n in keep if hasattr(n, "name")} == names, names
    return "\n\n".join(ast.get_source_segment(source, n) for n in keep)


def run_source(source: str) -> dict:
    """Execute a notebook's cells as one script (as ``__main__``, so forked workers run) and return its names."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, "<notebook cells>", "exec"), namespace)
    return namespace


def headings(cells: list[dict], level: str = "## ") -> list[tuple[int, str]]:
    """(cell index, heading) of every markdown line that opens a section of ``level``, in order."""
    return [(i, line.strip()) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
            for line in c["source"].splitlines() if line.startswith(level)]
