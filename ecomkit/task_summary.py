"""A run's task scores: each figure's method, and the printed lines (candidate scoring, generation, how they differ).

Why apart from ``metrics``: only a run or an evaluation with task scores reads them (``metrics.TASK_SUMMARY``).
"""

from __future__ import annotations

import os
from typing import Any

from ecomkit.metrics import examples_note

# Which method made each headline figure: candidate scoring ranks the labels (an untrained model still picks one),
# generation scores what it parses (a non-label scores 0), so the two may disagree and each figure names its method.
CANDIDATE_SCORING = "candidate scoring"
GENERATED_EXACT = "generation, exact match"
GENERATED_SPANS = "generation, span F1"
METHOD_OF_PREFIX = (("acc_", CANDIDATE_SCORING), ("macro_f1_", CANDIDATE_SCORING),
                    ("gen_acc", GENERATED_EXACT), ("gen_macro_f1", GENERATED_EXACT),
                    ("gen_span_", GENERATED_SPANS), ("gen_strict_acc", GENERATED_SPANS))


def task_lines(summary: dict[str, Any]) -> str:
    """Classification, generation and method lines, in the order the run summary prints them."""
    return classification_lines(summary) + generation_lines(summary) + methods_line(summary)


def eval_methods(row: dict[str, Any]) -> dict[str, str]:
    """``{figure: method}`` for the scores in an evaluation row (recorded in eval rows and ``summary.json``)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            method = next((m for prefix, m in METHOD_OF_PREFIX if key.startswith(prefix)), None)
            if method is not None and not key.endswith("_margin_points"):
                out[key] = method
    return out


def methods_line(summary: dict[str, Any]) -> str:
    """One line saying how the two methods differ, when a summary holds figures from both."""
    methods = set((summary.get("eval_methods") or {}).values())
    if CANDIDATE_SCORING not in methods or not methods - {CANDIDATE_SCORING}:
        return ""
    return ("methods         candidate scoring ranks the candidate labels by mean log-probability after the prompt "
            "(no decoding, always one of them); generation decodes an answer and scores the label or spans "
            "parsed from it (an answer that names no label is wrong)\n")


def classification_lines(summary: dict[str, Any]) -> str:
    """One line per classification target: accuracy, macro-F1, the majority baseline and the margin over it."""
    lines = ""
    for key in [k for k in summary if k.startswith("acc_")]:
        target, acc = key[4:], summary[key]
        line = f"eval {target:<11}accuracy {acc:.3f} by {CANDIDATE_SCORING}"
        if summary.get(f"macro_f1_{target}") is not None:
            line += f", macro-F1 {summary[f'macro_f1_{target}']:.3f}"
        if summary.get(f"majority_{target}") is not None:
            base = summary[f"majority_{target}"]
            line += (f"; majority baseline {base:.3f} (training's most frequent label "
                     f"{summary.get(f'majority_label_{target}')!r}), margin {100 * (acc - base):+.1f} points")
        if summary.get(f"scored_{target}"):
            line += f" ({summary[f'scored_{target}']} held-out records)"
        lines += line + "\n"
    return lines


def generation_lines(summary: dict[str, Any]) -> str:
    """Scores by generation beside their baselines (training majority label, training-span dictionary) and margins."""
    lines = ""
    if summary.get("gen_acc") is not None:
        line = (f"generated labels accuracy {summary['gen_acc']:.3f} by {GENERATED_EXACT}, "
                f"macro-F1 {summary['gen_macro_f1']:.3f}")
        if summary.get("gen_majority_acc") is not None:
            margin = summary["gen_acc_margin_points"]
            line += (f"; training-majority baseline {summary['gen_majority_acc']:.3f}, margin {margin:+.1f} points "
                     f"({'clears' if margin > 0 else 'does NOT clear'} it")
        else:
            line += " (no baseline: the rows name no training majority"
        lines += line + f"; {summary['gen_classify_n']} examples)\n"
    if summary.get("gen_span_f1") is not None:
        margin = summary["gen_span_f1_margin_points"]
        per = ", ".join(f"{k} {v:.2f}" for k, v in summary.get("gen_span_f1_per_label", {}).items())
        lines += (f"generated spans  micro-F1 {summary['gen_span_f1']:.3f} by {GENERATED_SPANS} "
                  f"(P {summary['gen_span_precision']:.3f}, "
                  f"R {summary['gen_span_recall']:.3f}), strict {summary['gen_strict_acc']:.3f}; dictionary "
                  f"baseline F1 {summary['dict_span_f1']:.3f}, margin {margin:+.1f} points "
                  f"({'clears' if margin > 0 else 'does NOT clear'} it; {summary['gen_extract_n']} examples)\n"
                  + (f"  per label F1   {per}\n" if per else ""))
    if summary.get("gen_decoded"):
        held = summary.get("gen_held_out")
        of = f" of {held}" if held is not None else ""
        lines += (f"decoding         {summary['gen_decoded']}{of} held-out examples, "
                  f"{summary['gen_examples_per_s']:.1f} examples/s ({summary['gen_decode_mode']}), "
                  f"{summary['gen_prompts_cut']} prompts cut to fit, {summary['gen_unknown_labels']} unknown labels "
                  f"in answers, {summary.get('gen_invalid_text', 0)} answers with invalid text (U+FFFD), "
                  f"{summary.get('gen_spans_not_in_input', 0)} predicted spans not in their input, "
                  f"{summary.get('gen_at_budget', 0)} answers stopped at the budget\n")
    if summary.get("gen_budget_advice"):
        lines += "budget           " + summary["gen_budget_advice"] + "\n"
    return lines


def print_evaluation(result: dict[str, Any]) -> None:
    """The evaluation of a saved model (``ecomkit.train.eval_run``), on rank 0."""
    if int(os.environ.get("RANK", 0)) != 0:
        return
    print(f"\n=== evaluation of {result['model']} ({result['strategy']} × {result['world_size']}) ===\n"
          f"eval loss       {result['eval_loss']:.4f}{examples_note(result)}\n" + classification_lines(result)
          + generation_lines(result) + methods_line(result),
          flush=True)
