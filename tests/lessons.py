"""Reading a chapter notebook's committed JSON as a learner would: its markdown, its code cells, in order.

Why a module of its own: the lesson tests (tests/test_lessons_*.py) check what a notebook *teaches* without
running it (which code comes first, which terms are defined before use, which images are shown from markdown),
and each chapter's checks read the notebook the same way.

Conventions the lesson tests hold every chapter to:
- the first code cell that shows a chapter's technique carries the cell tag ``mechanism`` and runs the
  technique's own code (torch / torch.distributed calls), not an ``ecomkit`` helper or a script launch;
- diagrams are PNG files drawn by code (``ecomlab/plots/diagrams*.py``) into ``notebooks/figures/`` and shown
  from a markdown cell (``![…](figures/NAME.png)``), so they are read without running anything;
- the guides' claims sit in one closing section whose heading starts with ``## Appendix: the guides' claims``.
"""

from __future__ import annotations

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
