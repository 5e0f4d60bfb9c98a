"""What chapters 05 (gradient compression), 06 (memory tuning) and 07 (troubleshooting) teach, read from their JSON.

Why: each chapter must show its technique's own code before the library's (a hand-written comm hook, memory
counted by hand, a checkpoint/restart by hand), keep the guides' claims in one closing appendix, define its terms
before using them, keep its interpretation in markdown, and give its exercises solutions. These checks read the
committed notebooks without running them (tests/lessons.py); the notebooks' own asserts check the runs.
"""

from __future__ import annotations

import re

import pytest

from tests import lessons

CH05, CH06, CH07 = "05_gradient_compression.ipynb", "06_memory_tuning.ipynb", "07_troubleshooting.ipynb"
LIBRARY_USE = r"\becomkit\b|run_torchrun|torch\.distributed\.run"

# chapter: (calls the mechanism cell must make, what the next markdown must name: file and function)
MECHANISMS = {
    CH05: (("register_comm_hook", "dist.all_gather", "dist.all_reduce", "topk("),
           ("ecomkit/parallel/compression/topk.py", "topk_hook", "ecomkit/parallel/compression/hooks.py",
            "register_compression")),
    CH06: (("torch.autograd.graph.saved_tensors_hooks", "torch.optim.AdamW", "element_size()"),
           ("ecomlab/measure/activations.py", "SavedTensorCounter", "ecomkit/planner/memory.py", "plan_memory")),
    CH07: (("torch.save(", "os.replace(", "torch.load(", "torch.set_rng_state("),
           ("ecomkit/faults/checkpoint.py", "CheckpointWriter", "load_dcp", "CheckpointCallback")),
}


def _section(text: str, heading: str) -> str:
    """The markdown from ``heading`` up to the next ``## `` heading."""
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_the_mechanism_comes_first_in_its_own_code(name: str) -> None:
    cells = lessons.load(name)
    tagged = lessons.tagged(cells, "mechanism")
    assert len(tagged) == 1, f"{name}: one code cell tagged 'mechanism', found {tagged}"
    i = tagged[0]
    cell = cells[i]
    assert cell["cell_type"] == "code"
    assert not re.search(LIBRARY_USE, cell["source"]), f"{name}: the mechanism cell calls ecomkit or a script"
    first_library = next(j for j, c in lessons.code_cells(cells) if re.search(LIBRARY_USE, c))
    assert i < first_library, f"{name}: cell {first_library} uses the library before the mechanism (cell {i})"
    calls, names = MECHANISMS[name]
    assert all(call in cell["source"] for call in calls), [c for c in calls if c not in cell["source"]]
    assert "assert " in cell["source"], f"{name}: the mechanism checks itself in the run"
    # the markdown right after it says which ecomkit function does it for real, and where it lives
    following = next(c["source"] for c in cells[i + 1:] if c["cell_type"] == "markdown")
    assert all(n in following for n in names), [n for n in names if n not in following]


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_the_library_is_checked_against_the_mechanism(name: str) -> None:
    """The first code cell after the mechanism runs the library's path and asserts it equals the hand-written one."""
    cells = lessons.load(name)
    i = lessons.tagged(cells, "mechanism")[0]
    check = next(c["source"] for c in cells[i + 1:] if c["cell_type"] == "code")
    assert re.search(r"from ecomkit\.", check) and "assert " in check


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_the_guides_claims_sit_in_one_closing_appendix(name: str) -> None:
    cells = lessons.load(name)
    headings = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                and c["source"].lstrip().startswith(lessons.APPENDIX_HEADING)]
    assert len(headings) == 1, f"{name}: one appendix, found {headings}"
    start = headings[0]
    later_sections = [c["source"] for c in cells[start + 1:] if c["cell_type"] == "markdown"
                      and re.match(r"\s*## ", c["source"])]
    assert not later_sections, f"{name}: the appendix is the closing section, but {later_sections[0][:60]!r} follows"
    appendix = "\n".join(c["source"] for c in cells[start:])
    assert "(../docs/claims.md)" in appendix
    ledger = lessons.first_index(cells, r"chapter_rows\(")
    assert ledger is not None and ledger > start, f"{name}: the ledger's rows belong in the appendix"
    text = lessons.markdown_text(cells)
    assert "Every checkable claim of the two guides" not in text      # the repeated paragraph is gone


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_no_references_to_documents_outside_the_repository(name: str) -> None:
    text = "\n".join(c["source"] for c in lessons.load(name))
    for pattern in (r"CPU notes", r"\btrap \d+", r"\.\./shared/", r"shared/guides"):
        assert not re.search(pattern, text), f"{name}: {pattern!r}"


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_every_exercise_has_a_folded_solution(name: str) -> None:
    exercises = _section(lessons.markdown_text(lessons.load(name)), "## Exercises")
    items = re.findall(r"^\d+\. ", exercises, flags=re.M)
    solutions = exercises.count("<details><summary>Solution</summary>")
    assert items and solutions == len(items), f"{name}: {len(items)} exercises, {solutions} solutions"
    assert exercises.count("</details>") == solutions


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_interpretation_is_markdown_not_generated_prose(name: str) -> None:
    """A reader who does not run the notebook still reads every explanation: no ``display(Markdown(f"…"))``."""
    for i, code in lessons.code_cells(lessons.load(name)):
        assert not re.search(r"Markdown\(\s*f?[\"']", code), f"{name} cell {i} builds prose in code"


def test_ch05_states_the_ring_all_reduce_instead_of_all_to_all() -> None:
    cells = lessons.load(CH05)
    text = lessons.markdown_text(cells)
    assert "every rank sends its whole gradient to every other rank" not in text
    intro = cells[0]["source"]
    assert "ring all-reduce" in intro and "2(n−1)/n" in intro and "Chapter 01" in intro


def test_ch05_intro_lists_the_sections_in_order() -> None:
    cells = lessons.load(CH05)
    headings = [re.match(r"\s*## (\d+)\.", c["source"]) for c in cells if c["cell_type"] == "markdown"]
    numbers = [int(m.group(1)) for m in headings if m]
    listed = re.findall(r"^(\d+)\. ", cells[0]["source"], flags=re.M)
    assert numbers == list(range(1, len(numbers) + 1)) and len(listed) == len(numbers)


def _first_cell(cells: list[dict], pattern: str) -> dict:
    i = lessons.first_index(cells, pattern)
    assert i is not None, pattern
    return cells[i]


def test_ch06_defines_sdpa_and_alpha_beta_where_they_first_appear() -> None:
    cells = lessons.load(CH06)
    sdpa = _first_cell(cells, r"(?i)\bsdpa\b")
    assert sdpa["cell_type"] == "markdown" and "scaled dot-product attention" in sdpa["source"]
    alpha_beta = _first_cell(cells, r"α-β")
    assert alpha_beta["cell_type"] == "markdown" and "α + b/β" in alpha_beta["source"]
    assert "latency" in alpha_beta["source"] and "bandwidth" in alpha_beta["source"]


def test_ch06_says_why_save_on_cpu_does_nothing_on_a_cpu() -> None:
    cells = lessons.load(CH06)
    cell = _first_cell(cells, r"## \d+\. `save_on_cpu`")
    assert "On a CPU it does nothing" in cell["source"] and "already live in" in cell["source"]


def test_ch06_refers_to_chapter_03s_bytes_per_parameter_table() -> None:
    text = lessons.markdown_text(lessons.load(CH06))
    assert "chapter 03's bytes-per-parameter table" in text


def test_ch07_keeps_the_live_rank_kill() -> None:
    code = "\n".join(c for _, c in lessons.code_cells(lessons.load(CH07)))
    assert "--fail-at-step" in code and "max_restarts=1" in code and "resume.identical()" in code


def test_ch05_diagram_is_redrawn_by_code_and_shown_from_markdown(tmp_path) -> None:
    """The committed PNG is what ``python -m ecomlab.plots.diagrams_compression`` draws, and chapter 05 shows it."""
    from matplotlib.image import imread

    from ecomlab.plots import diagrams_compression as dc

    committed = lessons.NOTEBOOKS / "figures" / dc.TOPK_FIGURE
    assert f"figures/{dc.TOPK_FIGURE}" in lessons.shown_images(lessons.load(CH05))
    (fresh,) = dc.redraw(tmp_path)
    assert imread(fresh).shape == imread(committed).shape
    assert abs(fresh.stat().st_size / committed.stat().st_size - 1) < 0.1      # same picture, not another one


def test_ch05_diagram_numbers_come_from_the_librarys_selection() -> None:
    """Every step sends k = ceil(25 % of 12) entries, the largest of gradient + residual, and keeps the rest."""
    from ecomlab.plots.diagrams_compression import topk_steps

    for row in topk_steps():
        acc, sent = row["accumulated"], set(row["sent"])
        assert len(sent) == 3 and row["sent_bytes"] == 24 and row["dense_bytes"] == 48
        assert min(abs(acc[i]) for i in sent) >= max(abs(acc[i]) for i in range(len(acc)) if i not in sent)
        assert all(row["residual"][i] == (0.0 if i in sent else acc[i]) for i in range(len(acc)))
