"""Each chapter is a lesson first and its proof after (issue 54 item 6), read from the committed notebooks.

What is held, for chapters 01, 02, 05, 06, 07 and 08: the introduction lists the chapter's numbered sections, as
many as there are, and states how long the chapter takes to run, the figure of the newest
``benchmarks/results/bench_notebooks-*.json`` in which it passed (``pytest --nbmake``, in whole minutes); after the numbered lesson
sections come only the closing ones, in this order: ``## Exercises``, ``## Checks`` (the proof) where the chapter
has any, ``## Appendix: the guides' claims`` where it has one; and the proof itself (planner twins, estimator
comparisons, claims tables, recomputations) sits after the first closing heading, never in the lesson.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests import lessons

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_notebooks import CHAPTERS, stated_minutes  # noqa: E402  (a benchmark script, not a package)

CLOSING = ("## Exercises", "## Checks", "## Appendix: the guides' claims")
# code that proves rather than teaches: it belongs after the lesson (Checks, or the appendix's ledger)
PROOF = {
    "01_environment": (r"chapter_rows\(",),
    "02_data_parallel": (r"chapter_rows\(", r"02_hf_trainer\.py", r"packing_agreement\(", r"row_isolation\("),
    "05_gradient_compression": (r"chapter_rows\(", r"compare_with_guide\("),
    "06_memory_tuning": (r"chapter_rows\(", r"estimator_comparison\(", r"verify_report\(", r"calibrate_with_one_rerun\(",
                         r"plot_state_comparison\("),
    "07_troubleshooting": (r"chapter_rows\(", r"read_tensorboard_scalars\("),
    "08_tasks": (r"scores_from_rows\(",),
}
HAS_CHECKS = {"02_data_parallel", "06_memory_tuning", "07_troubleshooting", "08_tasks"}


def _closing_start(cells: list[dict]) -> int:
    return next(i for i, h in lessons.headings(cells) if h.startswith(CLOSING[0]))


@pytest.mark.parametrize("name", CHAPTERS)
def test_the_introduction_lists_every_lesson_section(name: str) -> None:
    cells = lessons.load(f"{name}.ipynb")
    numbered = [int(m.group(1)) for _, h in lessons.headings(cells) if (m := re.match(r"## (\d+)\. ", h))]
    assert numbered == list(range(numbered[0], numbered[0] + len(numbered))) and numbered[0] in (0, 1), numbered
    listed = re.findall(r"^(\d+)\. ", cells[0]["source"], flags=re.M)
    assert [int(n) for n in listed] == numbered, (listed, numbered)


@pytest.mark.parametrize("name", CHAPTERS)
def test_closing_sections_follow_the_lesson_in_order(name: str) -> None:
    cells = lessons.load(f"{name}.ipynb")
    heads = lessons.headings(cells)
    first = next(k for k, (_, h) in enumerate(heads) if h.startswith(CLOSING[0]))
    assert all(re.match(r"## \d+\. ", h) or h.startswith("## Takeaways") for _, h in heads[:first]), heads[:first]
    closing = [next(c for c in CLOSING if h.startswith(c)) for _, h in heads[first:]]
    assert closing == sorted(set(closing), key=CLOSING.index), closing            # each once, in this order
    assert ("## Checks" in closing) == (name in HAS_CHECKS), closing


@pytest.mark.parametrize("name", CHAPTERS)
def test_proof_comes_after_the_lesson(name: str) -> None:
    cells = lessons.load(f"{name}.ipynb")
    start = _closing_start(cells)
    for pattern in PROOF[name]:
        at = [i for i, src in lessons.code_cells(cells) if re.search(pattern, src)]
        assert at and min(at) > start, (pattern, at, start)


def _newest_times() -> dict[str, float]:
    """Each chapter's median seconds from the newest artifact in which it passed (a run may time a few chapters)."""
    docs = sorted((json.loads(p.read_text()) for p in (REPO / "benchmarks" / "results").glob("bench_notebooks-*.json")),
                  key=lambda doc: doc["time_utc"])
    assert docs, "no bench_notebooks artifact: run python benchmarks/bench_notebooks.py"
    return {r["notebook"]: r["current_s"] for doc in docs for r in doc["extra"]["summary"] if r["passed"]}


@pytest.mark.parametrize("name", CHAPTERS)
def test_the_introduction_states_the_measured_running_time(name: str) -> None:
    intro = lessons.load(f"{name}.ipynb")[0]["source"]
    m = re.search(r"\*\*Running time:\*\* about (\d+) minutes? on a 2-core CPU \(`pytest --nbmake`, measured by "
                  r"`benchmarks/bench_notebooks\.py`\)", intro)
    assert m, intro[-400:]
    assert int(m.group(1)) == stated_minutes(_newest_times()[name])
