"""benchmarks/report.py: docs tables rendered from artifacts, and ``--check`` catching a page that drifted."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


report = _load("report")

README = """# Project

## Measured results

### Tokenization

<!-- report:bench_tok -->
whatever was here before
<!-- /report -->

### Never run

<!-- report:bench_never -->
<!-- /report -->

## Tests
"""


def _artifact(results: Path, date: str, rows: list[dict], notes=(), mtime: float | None = None,
              time_utc: str = "", suffix: str = "") -> Path:
    doc = {"bench": "bench_tok", "date": date, "time_utc": time_utc, "command": "python benchmarks/bench_tok.py --rows 10",
           "machine": "cpu2", "cpu_model": "Test CPU", "cores": 2, "gpu": None, "commit": "0123456789abcdef",
           "dirty": False, "versions": {"torch": "2.13.0+cpu"}, "load_before": [0.5, 0.4, 0.3],
           "load_after": [1.25, 0.5, 0.3], "rows": rows,
           "extra": {"columns": ["num_proc", "rows_per_s"], "headers": ["processes", "rows/s"], "notes": list(notes)}}
    path = results / f"bench_tok-{date}-cpu2{suffix}.json"
    path.write_text(json.dumps(doc))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_renders_the_newest_artifact_between_the_markers(tmp_path):
    _artifact(tmp_path, "2026-01-01", [{"num_proc": 1, "rows_per_s": 1.0}])
    _artifact(tmp_path, "2026-02-01", [{"num_proc": 1, "rows_per_s": 1234.5}, {"num_proc": 2, "rows_per_s": 2469.0}],
              notes=["speed-up 2 vs 1: 2.00x"])
    out = report.render_blocks(README, tmp_path)
    block = out.split("<!-- report:bench_tok -->\n")[1].split("<!-- /report -->")[0]
    assert "whatever was here before" not in out
    assert "| processes | rows/s |" in block
    assert "| 1 | 1,234 |" in block or "| 1 | 1,235 |" in block   # the 2026-02-01 value (rounding to an integer)
    assert "| 2 | 2,469 |" in block
    assert "2026-02-01" in block and "2026-01-01" not in block
    assert "load average 0.50 before → 1.25 after" in block and "commit 0123456789" in block
    assert "    python benchmarks/bench_tok.py --rows 10" in block
    assert "- speed-up 2 vs 1: 2.00x" in block
    # a benchmark without an artifact says so and shows no numbers
    never = out.split("<!-- report:bench_never -->\n")[1].split("<!-- /report -->")[0]
    assert "No artifact of `bench_never`" in never and not any(ch.isdigit() for ch in never)
    # text outside the markers is untouched
    assert out.startswith("# Project\n\n## Measured results\n\n### Tokenization\n") and out.endswith("## Tests\n")
    assert report.render_blocks(out, tmp_path) == out  # rendering is idempotent


def test_same_date_the_file_written_last_wins(tmp_path):
    old = _artifact(tmp_path, "2026-02-01", [{"num_proc": 1, "rows_per_s": 5.0}], mtime=1_000)
    assert report.newest_artifacts(tmp_path) == {"bench_tok": old}
    # a second run that day (write_artifact adds "-2"): the time written inside decides, not the file's mtime,
    # which a fresh clone sets to the checkout
    later = _artifact(tmp_path, "2026-02-01", [{"num_proc": 1, "rows_per_s": 6.0}], mtime=500,
                      time_utc="2026-02-01T10:00:00+00:00", suffix="-2")
    assert report.newest_artifacts(tmp_path) == {"bench_tok": later}
    old = later
    (tmp_path / "notes.txt").write_text("not an artifact")
    (tmp_path / "bench_compression_2026-11-29_cpu.txt").write_text("old text report")
    assert report.newest_artifacts(tmp_path) == {"bench_tok": old}


def test_check_fails_on_a_modified_readme_and_passes_on_a_rendered_one(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    _artifact(results, "2026-02-01", [{"num_proc": 1, "rows_per_s": 100.0}, {"num_proc": 2, "rows_per_s": 190.0}])
    readme = tmp_path / "README.md"
    readme.write_text(README)
    args = ["--readme", str(readme), "--results", str(results)]
    assert report.main(args + ["--check"]) == 1          # still the hand-written block
    assert report.main(args) == 0                        # render
    assert report.main(args + ["--check"]) == 0          # now it matches
    readme.write_text(readme.read_text().replace("| 2 | 190 |", "| 2 | 250 |"))   # a typed-in "improvement"
    capsys.readouterr()
    assert report.main(args + ["--check"]) == 1
    diff = capsys.readouterr().out
    assert "-| 2 | 250 |" in diff and "+| 2 | 190 |" in diff
    assert report.main(args) == 0 and report.main(args + ["--check"]) == 0
    _artifact(results, "2026-04-01", [{"num_proc": 1, "rows_per_s": 2.0}])   # a newer run, the page not re-rendered
    assert report.main(args + ["--check"]) == 1


def test_fmt_cells():
    assert [report.fmt(v) for v in (None, True, 3, 12345, 0.123456, 1.5, 12345.6, float("nan"), "a|b")] == [
        "-", "yes", "3", "12,345", "0.123", "1.5", "12,346", "-", "a\\|b"]


@pytest.mark.parametrize("name", ["bench_x-2026-01-01-CPU 2.json", "bench_x-2026-1-1-cpu2.json", "bench_x.json"])
def test_names_that_are_not_artifacts_are_ignored(tmp_path, name):
    (tmp_path / name).write_text("{}")
    assert report.newest_artifacts(tmp_path) == {}


@pytest.mark.parametrize("page", report.DOCS, ids=lambda p: p.name)
def test_the_repository_pages_match_their_artifacts(page):
    """The check ``make test`` runs: the report blocks of every page in ``report.DOCS`` equal their artifacts."""
    text = page.read_text()
    assert report.BLOCK.search(text), f"{page} has no report block"
    assert report.render_blocks(text) == text, "run: python benchmarks/report.py"


def test_a_second_run_on_the_same_day_keeps_the_first_artifact(tmp_path):
    common = _load("common")
    first = common.write_artifact("bench_tok", [{"rows_per_s": 1.0}], results_dir=tmp_path)
    second = common.write_artifact("bench_tok", [{"rows_per_s": 2.0}], results_dir=tmp_path)
    assert first != second and first.exists() and second.name.endswith("-2.json")
    assert json.loads(first.read_text())["rows"] == [{"rows_per_s": 1.0}]
    assert report.newest_artifacts(tmp_path) == {"bench_tok": second}
