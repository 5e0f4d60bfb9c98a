"""Run chosen code cells of a chapter notebook as one script in a fresh process, and read back which asserts held.

Why: a lesson's by-hand cells carry its checks (the same weights as one process, the bytes counted as they are
sent). A test runs those cells as committed, and a mutated copy (a division removed, a slice forgotten), and
reads which of the cells' own top-level asserts held: the checks must hold on the first and fail on the second.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import fastlaunch

REPO = Path(__file__).resolve().parents[1]


@dataclass
class CellRun:
    """Each top-level assert of the cells (its source) and whether it held; the top-level values asked for."""

    checks: list[tuple[str, bool]]
    values: dict = field(default_factory=dict)
    stdout: str = ""

    def failed(self) -> list[str]:
        return [text for text, ok in self.checks if not ok]

    def held(self, fragment: str) -> bool:
        """Whether the one check whose source contains ``fragment`` held."""
        found = [ok for text, ok in self.checks if fragment in text]
        assert len(found) == 1, f"{len(found)} checks contain {fragment!r}: {[t for t, _ in self.checks]}"
        return found[0]


def mutated(source: str, replacements: dict[str, str]) -> str:
    """``source`` with each ``old`` replaced by ``new``; each ``old`` must occur exactly once."""
    for old, new in replacements.items():
        assert source.count(old) == 1, f"{old!r} occurs {source.count(old)} times in the cells"
        source = source.replace(old, new)
    return source


def checks_as_calls(source: str) -> tuple[str, list[str]]:
    """Turn every top-level ``assert test, msg`` into ``__check__(i, test)``, so that the cells run to the end."""
    tree = ast.parse(source)
    asserts = [node for node in tree.body if isinstance(node, ast.Assert)]
    lines = source.splitlines(keepends=True)
    for i, node in reversed(list(enumerate(asserts))):   # from the end: earlier line numbers stay valid
        lines[node.lineno - 1:node.end_lineno] = [f"__check__({i}, ({ast.get_source_segment(source, node.test)}))\n"]
    return "".join(lines), [ast.get_source_segment(source, node) for node in asserts]


_PRELUDE = """import json as __json
__checks__ = []
def __check__(i, ok):
    __checks__.append([i, bool(ok)])
"""

_EPILOGUE = """
with open({out!r}, "w") as __f:
    __json.dump({{"checks": __checks__, "values": {{k: globals().get(k) for k in {keep!r}}}}}, __f, default=str)
"""


def run_cells(source: str, tmp_path: Path, keep: tuple[str, ...] = (), timeout: int = 300) -> CellRun:
    """Run ``source`` (the cells joined) as ``python`` would; which asserts held, and the names in ``keep``."""
    body, texts = checks_as_calls(source)
    out = tmp_path / "cell_run.json"
    script = tmp_path / "cells.py"
    script.write_text(_PRELUDE + body + _EPILOGUE.format(out=str(out), keep=tuple(keep)))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    cwd = REPO / "notebooks"   # the notebooks' folder: where nbmake runs them
    if fastlaunch.import_time_vars(env):
        proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    else:   # python itself, forked with torch imported (tests/fastlaunch.py)
        proc = fastlaunch.plain(script, env=env, cwd=cwd, timeout=timeout)
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(f"the cells exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
                             f"--- stderr\n{proc.stderr[-5000:]}")
    result = json.loads(out.read_text())
    held = dict(result["checks"])
    checks = [(text, held[i]) for i, text in enumerate(texts)]
    return CellRun(checks=checks, values=result["values"], stdout=proc.stdout)
