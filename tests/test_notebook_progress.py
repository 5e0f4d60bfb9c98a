"""A notebook that launches training shows its progress: the scripts print their progress lines, and a cell
that does not stream (``live=False``) shows the newest of them in one line that updates in place."""

from __future__ import annotations

import json
import re
from pathlib import Path

import IPython.display

from ecomkit.launch import PROGRESS_LINE, ProgressLine

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
LAUNCH = re.compile(r"run_(torchrun|python)\(")


def test_no_notebook_launch_turns_the_progress_lines_off():
    found = []
    for path in NOTEBOOKS:
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            src = "".join(cell["source"])
            if LAUNCH.search(src) and "--no-progress" in src:
                found.append(f"{path.name} cell {i}")
    assert not found, f"these launches hide the run's progress: {found}"


def test_a_quiet_launch_shows_its_progress_lines_in_one_updating_line(monkeypatch):
    shown: list[tuple[str, str]] = []

    class Handle:
        def update(self, bundle, raw):
            shown.append(("update", bundle["text/plain"]))

    def display(bundle, raw, display_id):
        shown.append(("display", bundle["text/plain"]))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    progress = ProgressLine("02_data_parallel.py", show=True)
    for line in ["[12:00:01 ecomkit r0] strategy=ddp model=tiny", "train 6/60 loss=8.1259 lr=2.10e-03",
                 "W1204 torch warning", "train 12/60 loss=7.1843 lr=2.99e-03", "decode 1/2 "]:
        progress(line)
    assert [kind for kind, _ in shown] == ["display", "update", "update"]     # one line, replaced in place
    assert shown[1][1].startswith("02_data_parallel.py: train 12/60 loss=7.1843") and shown[1][1].endswith(" s)")
    quiet = ProgressLine("x", show=False)                 # outside a notebook: kept, not shown
    quiet("train 1/2 loss=1")
    assert quiet.seen and len(shown) == 3
    assert PROGRESS_LINE.match("train 300/300 loss=0.1") and not PROGRESS_LINE.match("training 3/4")
