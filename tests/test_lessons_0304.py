"""Chapters 03 (ZeRO) and 04 (mixed parallelism) teach the mechanism first, show their diagrams, keep the proof aside.

Most tests read the committed notebook JSON (``tests/lessons.py``) without running anything: the notebooks
themselves run under ``pytest --nbmake``. The by-hand cells are also run here on their own
(``tests/notebook_cells.py``), as committed and mutated, to show that their checks hold and can fail.
The diagrams are redrawn and compared with the committed PNGs.

Conventions of these two chapters: the cells tagged ``mechanism`` come before any ecomkit code and hold the
chapter's first technique (torch / torch.distributed only); later techniques written by hand are cells tagged
``by-hand`` (torch and transformers only), each followed by the library's version of it; the proof sits in a
closing ``## Checks`` section, before the guides' appendix.
"""

from __future__ import annotations

import re

import pytest

from ecomkit.parallel import tensor
from ecomlab.plots import diagrams_mixed, diagrams_zero
from tests.lessons import (APPENDIX_HEADING, NOTEBOOKS, code_cells, first_index, load, markdown_text, shown_images,
                           tagged)
from tests.notebook_cells import mutated, run_cells

CH03, CH04 = "03_zero3.ipynb", "04_mixed_parallel.ipynb"
SOLUTION = "<details><summary>Solution</summary>"


def _mechanism(cells: list[dict]) -> tuple[int, str]:
    """The last cell tagged ``mechanism`` and the source of all of them (the chapter's first technique)."""
    idx = tagged(cells, "mechanism")
    assert idx and all(cells[i]["cell_type"] == "code" for i in idx), f"code cells tagged 'mechanism': {idx}"
    return idx[-1], "\n\n".join(cells[i]["source"] for i in idx)


def _first_ecomkit_code(cells: list[dict]) -> int:
    return next(i for i, src in code_cells(cells) if re.search(r"\becomkit\b|run_torchrun\(|run_python\(", src))


def _headings(cells: list[dict]) -> list[tuple[int, str]]:
    return [(i, line) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
            for line in c["source"].splitlines() if line.startswith("## ")]


# ---------------------------------------------------------------------- mechanism before wrapper
@pytest.mark.parametrize("name, collectives, checked", [
    # ZeRO: parameters gathered, gradients reduce-scattered; checked against one process to float64 rounding
    (CH03, ("dist.all_gather_single(", "dist.reduce_scatter_single("), r"^assert .*< TOL"),
    (CH04, ("dist.all_reduce(",), r"^assert .*1e-6"),       # TP: the row-parallel layer's partial sums
])
def test_mechanism_cell_runs_the_technique_itself_before_any_ecomkit_code(name, collectives, checked):
    cells = load(name)
    idx, src = _mechanism(cells)
    assert "ecomkit" not in src, "the mechanism cell runs torch / torch.distributed itself, not a helper"
    assert idx < _first_ecomkit_code(cells), "the mechanism comes before the first ecomkit import, call or launch"
    for call in collectives:
        assert call in src, call
    assert '"gloo"' in src and "start_processes" in src, "it really runs on several processes over gloo"
    assert re.search(checked, src, re.M), "it is checked against the unsplit / unsharded computation"


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


# ---------------------------------------------------------------------- a lesson first, its proof after (issue 54)
@pytest.mark.parametrize("name", [CH03, CH04])
def test_intro_lists_every_section_by_its_title_and_the_run_time(name):
    cells = load(name)
    intro = cells[0]["source"]
    numbered = [re.match(r"## (\d+)\. (.+)", h).groups() for _, h in _headings(cells) if re.match(r"## \d+\. ", h)]
    assert [int(n) for n, _ in numbered] == list(range(1, len(numbered) + 1)), numbered
    for n, title in numbered:
        assert f"{n}. **{title}**" in intro, f"the intro lists section {n} as '{n}. **{title}**'"
    assert re.search(r"about\s+\d+\s+minutes\s+on\s+2\s+CPU\s+cores", intro), "the run time, measured"
    assert "**Checks**" in intro and "appendix" in intro


PROOF = {   # the cells that set a measurement beside a formula, an estimator or the planner
    CH03: ("zf.formula_bytes(3, psi", "zm.loss_agreement(", "zm.formula_check(", "zf.deepspeed_estimates(",
           "gradient_bytes_per_step(PLAN_INPUT"),
    CH04: ("memory_vs_formula(",),
}


@pytest.mark.parametrize("name", [CH03, CH04])
def test_proof_sits_in_a_closing_checks_section_after_the_lesson_and_its_exercises(name):
    cells = load(name)
    heads = _headings(cells)
    at = {h: i for i, h in heads}
    appendix = next(i for i, h in heads if h.startswith(APPENDIX_HEADING))
    assert at["## Exercises"] < at["## Checks"] < appendix, heads
    for pattern in PROOF[name]:
        where = [i for i, src in code_cells(cells) if pattern in src]
        assert where and all(at["## Checks"] < i < appendix for i in where), (pattern, where, at["## Checks"])


# ---------------------------------------------------------------------- the by-hand cells, run here
def _code_before(cells: list[dict], heading: str) -> str:
    """The chapter's code cells before its first markdown line starting with ``heading`` (the lesson's start)."""
    stop = first_index(cells, rf"(?m)^{re.escape(heading)}")
    return "\n\n".join(c["source"] for c in cells[:stop] if c["cell_type"] == "code")


def _tagged_source(name: str, *tags: str) -> str:
    cells = load(name)
    return "\n\n".join(cells[i]["source"] for i in sorted(i for tag in tags for i in tagged(cells, tag)))


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory):
    """Chapter 03's section 1 as committed: ZeRO-3 by hand (SGD, AdamW), then FSDP2 on the same model."""
    return run_cells(_code_before(load(CH03), "## 2. "), tmp_path_factory.mktemp("zero3"),
                     keep=("zero", "fsdp2", "WORLD"))


@pytest.mark.dist
def test_zero3_by_hand_counts_its_traffic_and_measures_its_peak(zero3_run):
    """Sent per step: 3(N−1)/N·Ψ·8 B (counted); peak params + grads alive ≤ shards + their grads + largest layer."""
    assert not zero3_run.failed(), zero3_run.failed()
    world = zero3_run.values["WORLD"]
    for z in zero3_run.values["zero"].values():
        assert z["sent_per_step"] == 3 * (world - 1) / world * z["psi"] * 8
        assert z["peak"] <= z["shard_bytes"] + z["largest_layer"] < 2 * 8 * z["psi"]   # less than a DDP rank's
        assert z["held"] == 32 * z["psi"] // world                                   # AdamW in float64: 8+8+16
    for rank, theirs in zero3_run.values["fsdp2"].items():   # FSDP2's shards and traffic, counted by its collectives
        assert [len(s) for s in theirs["shards"]] == [len(s) for s in zero3_run.values["zero"][rank]["shards"]]
        assert theirs["sent_per_step"] == zero3_run.values["zero"][rank]["sent_per_step"]
    assert zero3_run.held("gap < TOL")


@pytest.mark.dist
def test_zero3_value_checks_fail_without_the_division_by_the_world_size(zero3_run, tmp_path):
    """3 steps in float64: removing ``/ WORLD`` fails the SGD check and the AdamW one (Adam hides most of a scale)."""
    run = run_cells(mutated(_tagged_source(CH03, "mechanism"), {"return mine / WORLD": "return mine"}), tmp_path)
    assert zero3_run.held('z["sgd"] < TOL') and zero3_run.held('z["adamw"] < TOL')
    assert not run.held('z["sgd"] < TOL') and not run.held('z["adamw"] < TOL'), run.checks


KEEP_FULL_WEIGHT = {   # ZeRO-2's habit: the forward keeps the gathered weight for the backward
    "return x @ gather(shard, shape).T": "ctx.weight = gather(shard, shape)\n        return x @ ctx.weight.T",
    "grad_x = grad_y @ gather(shard, ctx.shape)": "grad_x = grad_y @ ctx.weight",
}


@pytest.mark.dist
def test_zero3_traffic_and_peak_checks_fail_when_the_forward_keeps_the_full_weight(tmp_path):
    run = run_cells(mutated(_tagged_source(CH03, "mechanism"), KEEP_FULL_WEIGHT), tmp_path)
    assert run.held('z["sgd"] < TOL') and run.held('z["adamw"] < TOL')          # the same arithmetic ...
    assert not run.held('z["sent_per_step"] ==') and not run.held('z["peak"] <='), run.checks   # ... not ZeRO-3


@pytest.fixture(scope="module")
def ch04_run(tmp_path_factory):
    """Chapter 04's lesson before its runs: TP by hand (MLP, block) and the library's, FSDP2, the pipeline."""
    return run_cells(_code_before(load(CH04), "## 5. "), tmp_path_factory.mktemp("ch04"),
                     keep=("tp", "lib", "inside", "pp"))


def _block_parameters() -> set[str]:
    from ecomkit.models.bloom import build_model

    return {name for name, _ in build_model("tiny", device="meta").transformer.h[0].named_parameters()}


@pytest.mark.dist
def test_tp_block_by_hand_equals_the_unsplit_block_and_apply_tensor_parallel(ch04_run):
    """Output and every gradient against BLOOM's BloomBlock, every gradient against the library; 2 + 2 all-reduces."""
    assert not ch04_run.failed(), ch04_run.failed()
    params = _block_parameters()
    for rank in ("0", "1"):
        by_hand, lib = ch04_run.values["tp"][rank], ch04_run.values["lib"][rank]
        assert set(by_hand["gaps"]) == params | {"x", "output"} and max(by_hand["gaps"].values()) < 1e-5
        assert by_hand["all_reduces"] == {"forward": 2, "backward": 2}
        assert set(lib["gaps"]) == params and max(lib["gaps"].values()) < 1e-5
        assert lib["all_reduces"] == [2, 2]


@pytest.mark.dist
@pytest.mark.parametrize("mistake", [
    {".chunk(WORLD)[rank]   # ALiBi": "[:n]   # ALiBi"},      # every rank adds the first heads' slopes
    {"dist.all_reduce(grad)": "pass"},                        # f's backward forgets the other ranks' share
])
def test_tp_block_check_fails_on_a_split_mistake(tmp_path, mistake):
    cells = load(CH04)
    tp_cells = [i for i in tagged(cells, "mechanism") + tagged(cells, "by-hand")
                if "def pipeline" not in cells[i]["source"]]
    run = run_cells(mutated("\n\n".join(cells[i]["source"] for i in tp_cells), mistake), tmp_path)
    assert not run.held("worst < 1e-5"), run.checks


def test_chapter04_checks_tensor_parallelism_by_value_not_by_a_table_of_shapes():
    assert not hasattr(tensor, "tensor_parallel_shapes")
    cells = load(CH04)
    by_hand = tagged(cells, "by-hand")
    assert len(by_hand) == 3 and not any("ecomkit" in cells[i]["source"] for i in by_hand)
    for library in ("apply_tensor_parallel(model", "PipelineRunner"):   # the library's version right after
        lib = first_index(cells, re.escape(library))
        assert 0 < lib - max(i for i in by_hand if i < lib) <= 3, (library, lib, by_hand)


@pytest.mark.dist
def test_fsdp2_from_inside_counts_each_phase_and_shards_every_parameter(ch04_run):
    inside = ch04_run.values["inside"]
    counted = inside["0"]["counted"]
    assert counted["forward"]["all_gather"][0] == 3                            # 2 blocks and the root
    assert counted["backward"]["all_gather"][0] == 2 and counted["backward"]["reduce_scatter"][0] == 3
    assert counted["optimizer step"] == {}
    for name, (whole, local) in inside["0"]["shapes"].items():
        assert local[0] * 2 == whole[0] and inside["1"]["shapes"][name][1] == local, name


@pytest.mark.dist
def test_pipeline_by_hand_equals_one_process_in_both_orders(ch04_run):
    for stage in ch04_run.values["pp"].values():
        for schedule in ("gpipe", "1f1b"):
            assert stage[schedule]["grad_gap"] < 1e-5 and stage[schedule]["loss_gap"] < 1e-6, stage
            assert 0 < stage[schedule]["idle"] < 1
    assert ch04_run.held("stage_order(k, s, p, m)")       # the orders the chapter's picture is drawn from


@pytest.mark.dist
def test_pipeline_check_fails_when_the_loss_is_not_averaged_over_micro_batches(tmp_path):
    cells = load(CH04)
    source = _tagged_source(CH04, "mechanism") + "\n\n" + cells[first_index(cells, r"def pipeline_step")]["source"]
    run = run_cells(mutated(source, {"mse_loss(out, ys[k]) / MICRO": "mse_loss(out, ys[k])"}), tmp_path)
    assert not run.held('pp[s][k]["grad_gap"] < 1e-5'), run.checks
