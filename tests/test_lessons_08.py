"""Chapter 08 teaches the mechanism before the wrapper, defines its terms where they first appear, keeps its
interpretation readable without running, folds a solution under every exercise, and shows transfer learning.

Read from the committed notebook JSON (``tests/lessons.py``); nothing is run here. The notebook's own asserts check
its numbers when ``pytest --nbmake`` runs it.
"""

from __future__ import annotations

import re
from pathlib import Path

import lessons

NB = "08_tasks.ipynb"
# Terms a learner meets in this chapter: each is first written in bold, in markdown, where it is defined.
TERMS = ("span micro-F1", "strict accuracy", "dictionary baseline", "majority baseline", "candidate scoring",
         "left-padded", "greedy", "KV cache", "beam search", "transfer", "catastrophic forgetting")


def cells() -> list[dict]:
    return lessons.load(NB)


def test_the_first_technique_code_is_the_technique_itself():
    nb = cells()
    tagged = lessons.tagged(nb, "mechanism")
    assert len(tagged) == 1, tagged
    at = tagged[0]
    assert nb[at]["cell_type"] == "code"
    before = [src for i, src in lessons.code_cells(nb) if i < at]
    for src in before:   # only imports and paths come before it: no prompt built, no score, no launch
        assert not re.search(r"build_prompt\(|prompt_and_answer\(|_scores\(|run_torchrun\(|subprocess\.run\(", src), src
    src = nb[at]["source"]
    by_hand = src.index('f"输入: {')                      # SeqGPT's prompt, written out
    assert "2 * tp" in src                                 # span F1 from counts, by hand
    assert by_hand < src.index("build_prompt(")           # then checked against the library
    assert re.search(r"assert .*extraction_scores\(", src) and re.search(r"assert .*classification_scores\(", src)


def test_the_library_functions_are_named_with_their_files_right_after():
    nb = cells()
    at = lessons.tagged(nb, "mechanism")[0]
    following = nb[at + 1]
    assert following["cell_type"] == "markdown"
    for name in ("ecomkit/data/formats.py", "build_prompt", "ecomkit/train/task_metrics.py", "extraction_scores",
                 "classification_scores"):
        assert name in following["source"], name


def test_run_scores_are_checked_by_hand():
    code = "\n".join(src for _, src in lessons.code_cells(cells()))
    assert re.search(r"span_f1_by_hand\(.*\n?.*\n?.*\bassert abs\(by_hand_f1 - s\[\"gen_span_f1\"\]\)", code, re.S)


def test_terms_are_defined_where_first_used():
    nb = cells()
    for term in TERMS:
        first = lessons.first_index(nb, "(?i)" + (re.escape(term) if term != "transfer" else r"\btransfer"))
        assert first is not None, term
        assert nb[first]["cell_type"] == "markdown", (term, first)
        assert re.search(r"\*\*[^*]*" + re.escape(term) + r"[^*]*\*\*", nb[first]["source"], re.I), (term, first)


def test_interpretation_is_in_markdown_not_in_code():
    for i, src in lessons.code_cells(cells()):
        assert "display(Markdown(" not in src and "Markdown(f" not in src, i


def test_every_exercise_has_a_folded_solution():
    nb = cells()
    at = lessons.first_index(nb, r"^## Exercises")
    assert at is not None
    text = "\n".join(c["source"] for c in nb[at:] if c["cell_type"] == "markdown")
    exercises = re.findall(r"^\d+\. ", text, re.M)
    assert len(exercises) >= 3
    assert len(re.findall(r"<details><summary>Solution</summary>", text)) == len(exercises)
    assert text.count("</details>") == len(exercises)


def test_transfer_section_measures_and_asserts_the_comparison():
    nb = cells()
    head = lessons.first_index(nb, r"^## \d+\. Transfer learning")
    assert head is not None
    code = "\n".join(src for i, src in lessons.code_cells(nb) if i > head)
    for needed in ("pretrain_args(", "finetune_args(", "lm_eval_args(", "plot_transfer(", "run_torchrun("):
        assert needed in code, needed
    assert re.search(r"assert tuned\.mean_accuracy > scratch\.mean_accuracy", code)
    assert re.search(r"kept, lost = \(forgotten_share\(a, .*\) for a in \(tuned, hot\)\)", code)
    assert re.search(r"assert kept <= FORGET_BOUND", code) and re.search(r"assert lost > kept", code)


def test_the_transfer_runs_are_launched_once_in_the_suite():
    """The notebook is the transfer comparison's test (nbmake runs it): no test file launches the same runs again."""
    tests = Path(__file__).parent
    # the runs' arguments come from the measure package's transfer module: a test importing it launches them
    launching = [p.name for p in tests.glob("test_*.py")
                 if re.search(r"^from \S*measure(\.transfer| import transfer)", p.read_text(), re.M)]
    assert launching == [], launching
    code = "\n".join(src for _, src in lessons.code_cells(cells()))
    assert "save_model=pretrained" in code          # the scratch arm's model is never read, so never saved
