#!/usr/bin/env python
"""Render the measured-results tables of the docs (:data:`DOCS`) from the newest artifact of each benchmark.

Every benchmark ends with ``common.write_artifact``, which writes
``benchmarks/results/<bench>-<yyyy-mm-dd>-<machine>.json`` (command, commit,
machine facts, load average before and after, raw rows). On each page of
:data:`DOCS` a benchmark's table sits between two marker comments::

    <!-- report:bench_tokenize -->
    ... generated, do not edit ...
    <!-- /report -->

This script replaces what lies between the markers with a table rendered from
the newest artifact of that benchmark (newest date; for one date, the file
written last). A benchmark without an artifact renders a line saying so, never
old numbers.

    python benchmarks/report.py            # rewrite every page of DOCS in place
    python benchmarks/report.py --check    # exit 1 (and print a diff) if a page is not what it would render

A page is any Markdown file with such blocks, and a block names any benchmark: adding a page means adding it
to :data:`DOCS`, adding a table means adding its markers (the artifact's newest file fills them).

What a table shows comes from the artifact: ``extra["columns"]`` (row keys, in
order; default: the keys of the first row), ``extra["headers"]`` (optional,
one per column) and ``extra["notes"]`` (lines printed under the table, such as
the ratios and verdicts the benchmark computed).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

from ecomlab.artifacts import newest_artifacts  # the same artifact choice as the claims ledger

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = (REPO / "docs" / "benchmarks.md", REPO / "docs" / "perf.md", REPO / "docs" / "testing.md",
        REPO / "docs" / "guide.md")   # every page with report blocks
BLOCK = re.compile(r"(<!-- report:(?P<bench>[a-z0-9_]+) -->\n)(?P<body>.*?)(<!-- /report -->)", re.S)


def fmt(value: Any) -> str:
    """A cell: floats to 3 significant digits (thousands separated above 1,000), None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def _load(load: Any) -> str:
    return f"{load[0]:.2f}" if load else "?"


def render(doc: dict[str, Any], path: Path) -> str:
    """The Markdown for one artifact: where and how it was measured, the table, the benchmark's notes."""
    extra = doc.get("extra") or {}
    rows = doc.get("rows") or []
    columns = extra.get("columns") or (list(rows[0]) if rows else [])
    headers = extra.get("headers") or columns
    commit = (doc.get("commit") or "unknown")[:10] + (" + local changes" if doc.get("dirty") else "")
    lines = [
        f"Measured {doc['date']} on `{doc['machine']}` ({doc.get('cpu_model')}, {doc.get('cores')} cores"
        + (f", {doc['gpu']}" if doc.get("gpu") else "") + f"), torch {doc.get('versions', {}).get('torch')}, "
        f"commit {commit}, load average {_load(doc.get('load_before'))} before → {_load(doc.get('load_after'))} "
        f"after. Artifact: `{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}`.",
        "",
        f"    {doc['command']}",
        "",
    ]
    if rows and columns:
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|")
        for row in rows:
            lines.append("| " + " | ".join(fmt(row.get(c)) for c in columns) + " |")
        lines.append("")
    for note in extra.get("notes") or []:
        lines.append(f"- {note}")
    if extra.get("notes"):
        lines.append("")
    return "\n".join(lines)


def missing(bench: str) -> str:
    return (f"_No artifact of `{bench}` is committed yet: run `python benchmarks/{bench}.py` to write one to "
            "`benchmarks/results/`, then `python benchmarks/report.py`._\n")


def render_blocks(text: str, results_dir: Path = RESULTS) -> str:
    """``text`` with every marked block replaced by its benchmark's newest artifact (or the missing line)."""
    artifacts = newest_artifacts(results_dir)

    def block(m: re.Match) -> str:
        path = artifacts.get(m["bench"])
        body = render(json.loads(path.read_text()), path) if path else missing(m["bench"])
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a page differs from what would be rendered")
    p.add_argument("--readme", "--doc", dest="docs", type=Path, action="append",
                   help="a page with report blocks (repeatable; default: " + " and ".join(
                       str(d.relative_to(REPO)) for d in DOCS) + ")")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    return max(_render_page(page, args.results, args.check) for page in (args.docs or DOCS))


def _render_page(page: Path, results: Path, check: bool) -> int:
    """Rewrite ``page`` (or with ``check``, compare it); 1 when ``check`` finds it stale."""
    text = page.read_text()
    rendered = render_blocks(text, results)
    if check:
        if rendered != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), rendered.splitlines(True),
                                                       str(page), "rendered from artifacts"))
            print(f"\n{page} is out of date: run python benchmarks/report.py", file=sys.stderr)
            return 1
        print(f"{page}: every report block matches its newest artifact ({len(BLOCK.findall(text))} blocks)")
        return 0
    if rendered != text:
        page.write_text(rendered)
        print(f"rewrote {page}")
    else:
        print(f"{page} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
