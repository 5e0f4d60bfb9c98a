"""Chapters 03 (ZeRO) and 04 (mixed parallelism) teach the mechanism first, show their diagrams, keep the claims aside.

Read from the committed notebook JSON (``tests/lessons.py``), without running anything: the notebooks
themselves run under ``pytest --nbmake``. The diagrams are redrawn and compared with the committed PNGs.
"""

from __future__ import annotations

import re

import pytest

from ecomlab.plots import diagrams_mixed, diagrams_zero
from tests.lessons import (APPENDIX_HEADING, NOTEBOOKS, code_cells, first_index, load, markdown_text, shown_images,
                           tagged)

CH03, CH04 = "03_zero3.ipynb", "04_mixed_parallel.ipynb"
SOLUTION = "<details><summary>Solution</summary>"


def _mechanism(cells: list[dict]) -> tuple[int, str]:
    idx = tagged(cells, "mechanism")
    assert len(idx) == 1, f"one code cell tagged 'mechanism', found {idx}"
    assert cells[idx[0]]["cell_type"] == "code"
    return idx[0], cells[idx[0]]["source"]


def _first_ecomkit_code(cells: list[dict]) -> int:
    return next(i for i, src in code_cells(cells) if re.search(r"\becomkit\b|run_torchrun\(|run_python\(", src))


def _headings(cells: list[dict]) -> list[tuple[int, str]]:
    return [(i, line) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
            for line in c["source"].splitlines() if line.startswith("## ")]


# ---------------------------------------------------------------------- mechanism before wrapper
@pytest.mark.parametrize("name, collectives", [
    (CH03, ("dist.all_gather(", "dist.reduce_scatter(")),   # ZeRO: parameters gathered, gradients reduce-scattered
    (CH04, ("dist.all_reduce(",)),                          # TP: the row-parallel layer's partial sums
])
def test_mechanism_cell_runs_the_technique_itself_before_any_ecomkit_code(name, collectives):
    cells = load(name)
    idx, src = _mechanism(cells)
    assert "ecomkit" not in src, "the mechanism cell runs torch / torch.distributed itself, not a helper"
    assert idx < _first_ecomkit_code(cells), "the mechanism comes before the first ecomkit import, call or launch"
    for call in collectives:
        assert call in src, call
    assert '"gloo"' in src and "start_processes" in src, "it really runs on several processes over gloo"
    assert re.search(r"^assert .*1e-6", src, re.M), "it is checked against the unsplit / unsharded computation"


@pytest.mark.parametrize("name, where", [
    (CH03, "ecomkit/parallel/zero/strategy.py"),
    (CH04, "ecomkit/parallel/tensor.py"),
])
def test_markdown_after_the_mechanism_names_the_library_file_that_does_it_for_real(name, where):
    cells = load(name)
    idx, _ = _mechanism(cells)
    after = cells[idx + 1]
    assert after["cell_type"] == "markdown" and where in after["source"]


# ---------------------------------------------------------------------- diagrams
DIAGRAMS = {CH03: [diagrams_zero.ZERO_FIGURE], CH04: [diagrams_mixed.TP_FIGURE, diagrams_mixed.PIPELINE_FIGURE]}


@pytest.mark.parametrize("name", [CH03, CH04])
def test_diagrams_are_committed_and_shown_from_markdown(name):
    shown = shown_images(load(name))
    for figure in DIAGRAMS[name]:
        assert f"figures/{figure}" in shown, (figure, shown)
        assert (NOTEBOOKS / "figures" / figure).stat().st_size > 10_000


def test_diagrams_redraw_to_the_committed_images(tmp_path):
    from matplotlib.image import imread

    for path in diagrams_zero.draw_all(tmp_path) + diagrams_mixed.draw_all(tmp_path):
        committed = NOTEBOOKS / "figures" / path.name
        assert imread(path).shape == imread(committed).shape, path.name
        assert abs(path.stat().st_size - committed.stat().st_size) <= 0.1 * committed.stat().st_size, path.name


def test_pipeline_diagram_is_the_chapters_own_run_and_comes_before_it():
    cells = load(CH04)
    launch = first_index(cells, r'"--pp"')
    assert f'"--pp", "{diagrams_mixed.PIPELINE["stages"]}"' in cells[launch]["source"]
    assert f'"--parallel-pp-microbatches", "{diagrams_mixed.PIPELINE["microbatches"]}"' in cells[launch]["source"]
    assert first_index(cells, re.escape(f"figures/{diagrams_mixed.PIPELINE_FIGURE}")) < launch


@pytest.mark.parametrize("stages, microbatches", [(2, 4), (4, 8), (3, 5), (4, 2)])
def test_simulated_schedules_have_the_bubble_formula_and_1f1b_holds_fewer_activations(stages, microbatches):
    gpipe = diagrams_mixed.simulate("gpipe", stages, microbatches)
    one_f_one_b = diagrams_mixed.simulate("1f1b", stages, microbatches)
    bubble = (stages - 1) / (microbatches + stages - 1)
    assert gpipe["bubble"] == pytest.approx(bubble) and one_f_one_b["bubble"] == pytest.approx(bubble)
    assert gpipe["peak_in_flight"] == [microbatches] * stages
    assert one_f_one_b["peak_in_flight"] == [min(stages - s, microbatches) for s in range(stages)]


# ---------------------------------------------------------------------- the guides' claims in one appendix
@pytest.mark.parametrize("name, ledger_chapter", [(CH03, 3), (CH04, 4)])
def test_guides_claims_sit_in_one_closing_appendix(name, ledger_chapter):
    cells = load(name)
    headings = _headings(cells)
    appendix = [i for i, h in headings if h.startswith(APPENDIX_HEADING)]
    assert len(appendix) == 1 and headings[-1][0] == appendix[0], headings
    start = appendix[0]
    assert "../docs/claims.md" in cells[start]["source"]
    assert first_index(cells, rf"chapter_rows\({ledger_chapter}\)") > start      # the ledger cell is in it
    text = markdown_text(cells) + "".join(src for _, src in code_cells(cells))
    assert "Every checkable claim of the two guides" not in text
    assert not re.search(r"\.\./shared|CPU notes|trap \d", text)
    # the guides' tables and quotes are not part of the lesson
    before = "\n".join(c["source"] for c in cells[:start])
    for quote in ("38.2 GB", "16.8 GB", "302 GB", "device_map", "GaudiTrainer", "S1-09"):
        assert quote not in before, quote


@pytest.mark.parametrize("name", [CH03, CH04])
def test_exercises_have_folded_solutions(name):
    cells = load(name)
    ex = first_index(cells, r"^## Exercises")
    assert ex is not None and SOLUTION in cells[ex]["source"] and "</details>" in cells[ex]["source"]


# ---------------------------------------------------------------------- accuracy and order
def _squashed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_chapter03_has_one_bytes_per_parameter_table_reconciling_the_three_splits():
    cells = load(CH03)
    rows = ("|2|2|4+4+4=12|**16**|", "|4|4|4+4+4=12|**20**|", "|4|4|0+4+4=8|**16**|")   # 2+2+12, 4+4+12, 4+4+8
    tables = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and all(r in _squashed(c["source"])
                                                                                      for r in rows)]
    assert len(tables) == 1, tables
    assert tables[0] < _mechanism(cells)[0], "the table comes before the first use of bytes per parameter"


def test_chapter04_refers_to_chapter03s_table_wherever_it_counts_bytes_per_parameter():
    for i, c in enumerate(load(CH04)):
        if c["cell_type"] == "markdown" and re.search(r"bytes\s+per\s+parameter", c["source"]):
            assert "03_zero3.ipynb" in c["source"], (i, c["source"][:200])


def test_chapter03_intro_lists_lora():
    intro = load(CH03)[0]["source"]
    listed = intro[intro.index("What you will see"):]
    assert "LoRA" in listed


def test_chapter04_defines_1f1b_before_its_first_use():
    cells = load(CH04)
    first = first_index(cells, r"1F1B|1f1b")
    assert cells[first]["cell_type"] == "markdown" and "one forward, one backward" in cells[first]["source"]
    assert first_index(cells, r"1F1B|1f1b") < first_index(cells, r'"1f1b"')
