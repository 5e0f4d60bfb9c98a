"""``python -m ecomkit.predict``: a saved model answers every row of your file as its run read it, and scores it.

::

    python -m ecomkit.predict --model runs/mine/final "华为 Mate 60 雅川青 手机"
    python -m ecomkit.predict --model runs/mine/final --input new_reviews.csv --output answers.csv
    python -m ecomkit.predict --model runs/tasks/final --task extract --labels 品牌,颜色 "华为 Mate 60 雅川青 手机"

Prompts, decoding and parsing are evaluation's. What the run recorded (``final/ecomkit_task.json``: prompt format,
targets and label sets, sequence length, answer budget, column and label maps) is the default; flags override it.
Without ``--labels`` every learned target is answered, one row each. Every input row is in the output; one that
cannot be answered gets an ``error`` and is counted. Rows carrying labels are scored as evaluation scores them,
beside the training majority baseline, into ``<name>.scores.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import torch

from ecomkit.config import TrainConfig
from ecomkit.config.cli import field_docs, parse_json_object
from ecomkit.config.vocabulary import SPAN_ENDS
from ecomkit.data.columns import heads
from ecomkit.data.formats import KIND_CLASSIFY, PROMPT_FORMATS, TaskExample, build_prompt, parse_answer
from ecomkit.data.questions import (Item, Recorded, command_line_rows, output_row, problem_lines, row_items,
                                    split_labels)
from ecomkit.data.rows import RowsRead, read_rows
from ecomkit.data.task_file import read_task_file
from ecomkit.data.writers import ROW_FORMATS, write_rows
from ecomkit.dist import DistEnv
from ecomkit.errors import ConfigError, EcomkitError, exit_on_user_error
from ecomkit.models.bloom import load_model
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.parallel.base import Strategy
from ecomkit.train.gen_eval import BUDGET_FLAG, budget_line, prediction_rows, scores_from_rows
from ecomkit.train.generate import DecodeSettings, decode_prompts
from ecomkit.train.task_metrics import SpanDictionary, training_majorities

NO_CUT = 1 << 30          # --seq-len when neither the flag nor the run says: prompts are not cut
DEFAULT_NEW_TOKENS = 32   # --gen-max-new-tokens when neither the flag nor the run says
TRAINING_BASELINE = "the run's training labels, as its model folder records"
FILE_BASELINE = "this file's own labels: the model folder records no training labels"


def recorded_prompt_format(model_dir: str | Path) -> str | None:
    """The prompt format the run that saved ``model_dir`` trained with (its ``ecomkit_task.json``), if any."""
    info = read_task_file(model_dir)
    return info["prompt_format"] if info else None


class Predictor:
    """A saved model, its tokenizer and its prompt format: prompts in, parsed answers out (one process)."""

    def __init__(self, model_dir: str, prompt_format: str | None = None, settings: DecodeSettings | None = None,
                 precision: str = "fp32"):
        self.fmt = prompt_format or recorded_prompt_format(model_dir) or "seqgpt"
        self.tokenizer = get_tokenizer(model_dir)
        self.env = DistEnv()
        model = load_model(model_dir, device=self.env.device)
        self.strategy = Strategy(TrainConfig(precision=precision), self.env)   # the model as is: no wrapper
        self.strategy.model = self.strategy.raw_model = model
        self.settings = settings or DecodeSettings(max_length=getattr(model.config, "seq_length", None) or NO_CUT)
        self.prompts_cut = 0

    @torch.no_grad()
    def predict(self, examples: Sequence[TaskExample], progress: bool = False) -> list[dict[str, Any]]:
        """Each example's ``generated`` text, parsed ``label`` or ``spans`` and ``at_budget``."""
        prompts = [build_prompt(self.fmt, ex.kind, ex.text, ex.labels) for ex in examples]
        decoded = decode_prompts(self.strategy, self.tokenizer, prompts, self.env, self.settings, progress=progress)
        self.prompts_cut += decoded.cut
        return [self.parsed(ex, text, stopped) for ex, text, stopped in zip(examples, decoded.texts,
                                                                              decoded.at_budget)]

    def parsed(self, ex: TaskExample, text: str, stopped: bool) -> dict[str, Any]:
        parsed = parse_answer(self.fmt, ex.kind, text, ex.labels)
        answer: dict[str, Any] = {"generated": text, "at_budget": bool(stopped)}
        if ex.kind == KIND_CLASSIFY:
            answer["label"] = parsed.label
        else:
            spans: dict[str, list[str]] = {}
            for label, span in sorted(parsed.spans, key=lambda s: (list(ex.labels).index(s[0]), s[1])):
                spans.setdefault(label, []).append(span)
            answer["spans"] = spans
        if parsed.unknown_labels:
            answer["unknown_labels"] = list(parsed.unknown_labels)
        return answer


def score_items(items: Sequence[Item], recorded: Recorded, fmt: str) -> dict[str, dict[str, Any]]:
    """Per target, the figures evaluation computes, on the rows that carry that target's label.

    The majority baseline comes from the run's training labels when the folder records them, else from this file's.
    """
    dictionary = SpanDictionary.from_spans(recorded.train_spans) if recorded.train_spans is not None else None
    groups: dict[str, list[Item]] = {}
    for item in items:
        if item.question is not None and item.question.scored and item.answer:
            groups.setdefault(item.target, []).append(item)
    out = {}
    for target, group in groups.items():
        examples = [i.question.example for i in group]
        labels = examples[0].labels
        counts, source = recorded.train_label_counts.get(target), TRAINING_BASELINE
        if counts is None:
            counts, source = Counter(e.gold_label for e in examples), FILE_BASELINE
        classify = examples[0].kind == KIND_CLASSIFY
        majorities = training_majorities({target: labels}, {target: counts}) if classify else {}
        rows = prediction_rows(fmt, examples, [i.answer["generated"] for i in group],
                               dictionary or SpanDictionary({}), majorities,
                               [i.answer["at_budget"] for i in group])
        scores = scores_from_rows(rows)
        if not classify and dictionary is None:
            scores = {k: v for k, v in scores.items() if not k.startswith("dict_") and "margin" not in k}
        out[target] = {"rows": len(group), "baseline": source if majorities else (
            "the dictionary of the run's training spans" if dictionary else "none recorded"), **scores}
    return out


def score_lines(scores: dict[str, dict[str, Any]]) -> list[str]:
    """One line per scored target: its figures beside its baseline."""
    lines = []
    for target, s in scores.items():
        if "gen_acc" in s:
            line = f"{target:<10} accuracy {s['gen_acc']:.3f}, macro-F1 {s['gen_macro_f1']:.3f} on {s['rows']} rows"
            if s.get("gen_majority_acc") is not None:
                line += (f"; majority baseline {s['gen_majority_acc']:.3f} (answers "
                         f"{'/'.join(s['gen_majority_labels'])}, from {s['baseline']}), margin "
                         f"{s['gen_acc_margin_points']:+.1f} points")
        else:
            line = (f"{target:<10} span F1 {s['gen_span_f1']:.3f} (P {s['gen_span_precision']:.3f}, R "
                    f"{s['gen_span_recall']:.3f}), strict {s['gen_strict_acc']:.3f} on {s['rows']} rows")
            line += (f"; dictionary baseline F1 {s['dict_span_f1']:.3f} ({s['baseline']}), margin "
                     f"{s['gen_span_f1_margin_points']:+.1f} points" if "dict_span_f1" in s else
                     "; no dictionary baseline (the model folder records no training spans)")
        lines.append(line)
    return lines


def read_input(args: argparse.Namespace, recorded: Recorded) -> RowsRead:
    """``--input`` read as the run read its data: its column and label maps unless flags override them."""
    reading = recorded.reading
    column_map = args.column_map if args.column_map is not None else reading.get("column_map")
    label_map = args.label_map if args.label_map is not None else reading.get("label_map")
    optional = list(column_map or ()) if args.column_map is None else []   # the run's label columns may be absent
    return read_rows(args.input, column_map, label_map, span_end=args.span_end or reading.get("span_end", "exclusive"),
                     optional_keys=optional)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ecomkit.predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    docs = field_docs(TrainConfig)
    run = "; default: the run's (its model folder's ecomkit_task.json)"
    p.add_argument("texts", nargs="*", help="texts to answer (or --input FILE)")
    p.add_argument("--model", required=True, metavar="PATH", help="a saved model directory (a run's <output-dir>/final)")
    p.add_argument("--task", help="classify | extract (rows of --input may carry their own 'task'); default: "
                                  "every kind the model learned")
    p.add_argument("--labels", help="the label set, comma-separated, in prompt order, e.g. 品牌,颜色; default: "
                                    "every set the model learned (one answer row per target, e.g. category and "
                                    "sentiment)")
    p.add_argument("--input", metavar="PATH", help="a file or folder of rows, in any format --data reads (.csv, "
                                                   ".jsonl/.json, .arrow, a save_to_disk folder)")
    p.add_argument("--output", metavar="PATH", help=f"write every answer row here, by extension: {', '.join(ROW_FORMATS)} "
                                                    f"(default: print them); the scores go beside it, "
                                                    f"<name>.scores.json")
    p.add_argument("--column-map", type=parse_json_object, metavar="JSON", help=docs["column_map"].help + run)
    p.add_argument("--label-map", type=parse_json_object, metavar="JSON", help=docs["label_map"].help + run)
    p.add_argument("--span-end", choices=SPAN_ENDS, help=docs["span_end"].help + run)
    p.add_argument("--prompt-format", choices=PROMPT_FORMATS, help="default: the format the model was trained with")
    p.add_argument("--gen-max-new-tokens", "--max-new-tokens", dest="max_new_tokens", type=int, default=None, metavar="N",
                   help=f"answer tokens generated at most; default: the run's --gen-max-new-tokens "
                        f"({DEFAULT_NEW_TOKENS} for a model without one)")
    p.add_argument("--num-beams", type=int, default=1, metavar="N", help="1 = greedy; > 1 = beam search")
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="prompts decoded together (left-padded)")
    p.add_argument("--seq-len", "--max-length", dest="max_length", type=int, default=None, metavar="N",
                   help="cut prompts as training did at this sequence length; default: the run's --seq-len (no "
                        "cut for a model without one)")
    return p


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    labels = split_labels(args.labels)
    if bool(args.input) == bool(args.texts):
        raise EcomkitError("Give either texts on the command line or --input FILE (not both, not neither).")
    if args.output and Path(args.output).suffix.lower() not in ROW_FORMATS:
        raise ConfigError(f"--output {args.output}: predict writes {', '.join(ROW_FORMATS)} (by the extension).")
    recorded = Recorded(read_task_file(args.model) if Path(args.model).is_dir() else None, args.model)
    recorded.check_spelling(labels)
    read = read_input(args, recorded) if args.input else RowsRead("the command line", command_line_rows(args.texts))
    mapped = heads(read.column_map)
    items = [i for r in read.rows for i in row_items(r, args.task, labels, recorded, f"{read.source}, {r.location}",
                                                     mapped)]
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens or recorded.gen_max_new_tokens or DEFAULT_NEW_TOKENS,
                              num_beams=args.num_beams, batch_size=args.batch_size,
                              max_length=args.max_length or recorded.seq_len or NO_CUT)
    predictor = Predictor(args.model, args.prompt_format, settings)
    asked = [i for i in items if i.question is not None]
    for item, answer in zip(asked, predictor.predict([i.question.example for i in asked], progress=bool(args.output))):
        item.answer = answer
    report(items, read, args, recorded, predictor, settings)


def report(items: list[Item], read: RowsRead, args: argparse.Namespace, recorded: Recorded, predictor: Predictor,
           settings: DecodeSettings) -> None:
    """Write or print every answer row; say what was left out, cut, stopped at the budget, and the scores."""
    notes = []
    if read.absent_keys:
        notes.append(f"the run's --column-map keys {', '.join(map(repr, read.absent_keys))} match no column of "
                     f"{read.source} and are left out (new rows need not carry the labels)")
    notes += problem_lines(items, read.source, len(read.rows), args.output)
    answered = [i for i in items if i.answer]
    stopped = sum(i.answer["at_budget"] for i in answered)
    if stopped:
        notes.append(budget_line(stopped, len(answered), settings.max_new_tokens, BUDGET_FLAG))
    if predictor.prompts_cut:
        notes.append(f"{predictor.prompts_cut} prompts were cut at the end of their input to fit --seq-len "
                     f"{settings.max_length}, as training cut them")
    scores = score_items(items, recorded, predictor.fmt)
    rows = [output_row(i, bool(args.input)) for i in items]
    if args.output:
        write_rows(rows, args.output)
        notes.append(f"{len(answered):,} answers ({len(rows):,} rows) written to {args.output}")
        if scores:
            path = Path(args.output).with_suffix(".scores.json")
            path.write_text(json.dumps(scores, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
            notes.append(f"scores written to {path}")
    else:
        for row in rows:
            shown = row if args.input else {k: row[k] for k in ("text", "target", "label", "spans", "generated",
                                                                  "error") if k in row and (k != "target" or row[k])}
            if not args.input and row.get("at_budget"):
                shown["at_budget"] = True
            print(json.dumps(shown, ensure_ascii=False))
    for line in notes + (["scores (generation, exact match, as evaluation scores):", *score_lines(scores)]
                         if scores else []):
        print(line, file=sys.stderr)
