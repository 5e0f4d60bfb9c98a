"""``python -m ecomkit.predict``: a saved model answers classification or extraction prompts, parsed.

::

    python -m ecomkit.predict --model runs/tasks/final "华为 Mate 60 雅川青 手机"
    python -m ecomkit.predict --model runs/tasks/final --task extract --labels 品牌,颜色 "华为 Mate 60 雅川青 手机"
    python -m ecomkit.predict --model runs/tasks/final --input texts.jsonl --output answers.jsonl

The prompt is built and the answer parsed by the same functions evaluation
uses (``ecomkit.data.formats.build_prompt`` / ``parse_answer``), and decoding
is evaluation's (``ecomkit.train.generate``: batched, left-padded, greedy by
default, the KV cache on).

**What the run recorded is the default** (``final/ecomkit_task.json``,
:func:`ecomkit.data.formats.read_task_file`): the prompt format, the task (when
the model learned one kind, classification or extraction), its label set (when
it learned one per kind), the sequence length prompts are cut to (``--seq-len``)
and the answer budget (``--gen-max-new-tokens``). Flags override each. A model
that learned several targets (category and sentiment, or classification and
extraction) answers **every one** of them for a text given without
``--labels``: one output line per target, each with its ``target``;
``--task`` keeps the targets of one kind, ``--labels`` asks one set.

Each ``--input`` row is ``{"text": ...}``, optionally with its own ``"task"``
(classify/extract) and ``"labels"`` (a list, or a comma-separated string);
rows without them use ``--task`` and ``--labels``, or what the run recorded.
Each output row is the input row plus ``generated`` and the parsed answer:
``label`` (classify) or ``spans`` (extract, ``{label: [span, ...]}`` in label
order), and ``at_budget`` (the answer used every new token allowed without
ending; the count is printed with the flag that raises the budget).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from ecomkit.config import TrainConfig
from ecomkit.data.formats import (KIND_CLASSIFY, KIND_EXTRACT, PROMPT_FORMATS, build_prompt, check_kind, parse_answer,
                                  read_task_file)
from ecomkit.data.tasks import BRAND_LABEL, CLASSIFICATION_TASKS
from ecomkit.dist import DistEnv
from ecomkit.errors import DataError, EcomkitError, exit_on_user_error
from ecomkit.models.bloom import load_model
from ecomkit.models.tokenizer import get_tokenizer
from ecomkit.parallel.base import Strategy
from ecomkit.train.gen_eval import BUDGET_FLAG, budget_line
from ecomkit.train.generate import DecodeSettings, decode_prompts

NO_CUT = 1 << 30          # --seq-len when neither the flag nor the run says: prompts are not cut
DEFAULT_NEW_TOKENS = 32   # --gen-max-new-tokens when neither the flag nor the run says

TASK_ALIASES = {"classify": KIND_CLASSIFY, "classification": KIND_CLASSIFY, "cls": KIND_CLASSIFY,
                "extract": KIND_EXTRACT, "extraction": KIND_EXTRACT, "ner": KIND_EXTRACT}


def split_labels(labels: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"品牌,颜色"`` (or ``，``/``、``) or a list → a label tuple in the given order."""
    if labels is None:
        return ()
    if isinstance(labels, str):
        for sep in ("，", "、"):
            labels = labels.replace(sep, ",")
        labels = labels.split(",")
    return tuple(label.strip() for label in labels if label.strip())


def recorded_prompt_format(model_dir: str | Path) -> str | None:
    """The prompt format the run that saved ``model_dir`` trained with (its ``ecomkit_task.json``), if any."""
    info = read_task_file(model_dir)
    return info["prompt_format"] if info else None


class Recorded:
    """What a saved model's ``ecomkit_task.json`` says predict should default to (nothing for other models)."""

    def __init__(self, info: dict[str, Any] | None, model_dir: str = ""):
        info = info or {}
        self.model_dir = model_dir
        kinds, labels = set(info.get("kinds") or ()), info.get("labels") or {}
        self.label_sets: dict[str, dict[str, tuple[str, ...]]] = {KIND_CLASSIFY: {}, KIND_EXTRACT: {}}
        for target in CLASSIFICATION_TASKS:
            if target in kinds and len(labels.get(target) or ()) >= 2:
                self.label_sets[KIND_CLASSIFY][target] = tuple(labels[target])
        if "extract" in kinds and labels.get("extract"):
            self.label_sets[KIND_EXTRACT]["extract"] = tuple(labels["extract"])
        elif "brand" in kinds:
            self.label_sets[KIND_EXTRACT]["brand"] = (BRAND_LABEL,)
        learned = [kind for kind, sets in self.label_sets.items() if sets]
        self.task = learned[0] if len(learned) == 1 else None
        self.seq_len = info.get("seq_len")
        self.gen_max_new_tokens = info.get("gen_max_new_tokens")

    def labels(self, kind: str, where: str) -> tuple[str, ...]:
        """The one label set the model learned for ``kind``; a clear error when there are several, or none."""
        sets = self.label_sets.get(kind, {})
        if len(sets) == 1:
            return next(iter(sets.values()))
        if sets:
            options = "; ".join(f"{target}: --labels {','.join(v)}" for target, v in sets.items())
            raise DataError(f"{where}: {self.model_dir} learned {len(sets)} {kind} label sets; say which with "
                            f"--labels or a 'labels' field in the row ({options}).")
        raise DataError(f"{where}: no labels; give --labels 品牌,颜色 or a 'labels' field in the row (the model "
                        f"records no {kind} label set).")


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

    def prompts(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        return [build_prompt(self.fmt, r["task"], r["text"], r["labels"]) for r in rows]

    @torch.no_grad()
    def predict(self, rows: Sequence[dict[str, Any]], progress: bool = False) -> list[dict[str, Any]]:
        """``rows``: ``{"text", "task", "labels"}`` each; returns each row with ``generated``, its parsed answer
        and ``at_budget`` (it used every new token allowed without ending)."""
        decoded = decode_prompts(self.strategy, self.tokenizer, self.prompts(rows), self.env, self.settings,
                                 progress=progress)
        out = []
        for row, text, stopped in zip(rows, decoded.texts, decoded.at_budget):
            parsed = parse_answer(self.fmt, row["task"], text, row["labels"])
            answer: dict[str, Any] = {**row, "labels": list(row["labels"]), "generated": text,
                                      "at_budget": stopped}
            if row["task"] == KIND_CLASSIFY:
                answer["label"] = parsed.label
            else:
                spans: dict[str, list[str]] = {}
                for label, span in sorted(parsed.spans, key=lambda s: (list(row["labels"]).index(s[0]), s[1])):
                    spans.setdefault(label, []).append(span)
                answer["spans"] = spans
            if parsed.unknown_labels:
                answer["unknown_labels"] = list(parsed.unknown_labels)
            out.append(answer)
        return out


def check_text(row: Any, where: str) -> None:
    """An input row is a dict with a string ``text``; else a clear error naming ``where``."""
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise DataError(f"{where}: a row needs a string field 'text', got {str(row)[:80]!r}.")


def normalise_row(row: dict[str, Any], task: str | None, labels: tuple[str, ...], where: str,
                  recorded: Recorded | None = None) -> dict[str, Any]:
    """One input row with its task and labels resolved; a clear error naming ``where`` when one is missing.

    Order: the row's own ``task``/``labels``, then ``--task``/``--labels``, then what the run recorded.
    """
    check_text(row, where)
    recorded = recorded or Recorded(None)
    kind = TASK_ALIASES.get(str(row.get("task") or task or recorded.task or "").lower())
    if kind is None:
        learned = " and ".join(k for k, sets in recorded.label_sets.items() if sets)
        why = f" (the model learned {learned})" if learned else ""
        raise DataError(f"{where}: no task{why}; give --task classify|extract or a 'task' field in the row.")
    row_labels = split_labels(row.get("labels")) or labels or recorded.labels(kind, where)
    return {**row, "task": check_kind(kind), "labels": row_labels}


def answer_rows(row: dict[str, Any], task: str | None, labels: tuple[str, ...], where: str,
                recorded: Recorded | None = None) -> list[dict[str, Any]]:
    """The questions one input row asks: one per target the model learned when no labels are given, else one.

    Why: a model trained on a review file learned category and sentiment; asked about a text without
    ``--labels`` it answers both (each row carries its ``target``), rather than stopping to ask which.
    A row's own ``task`` or ``--task`` keeps the targets of that kind.
    """
    check_text(row, where)
    recorded = recorded or Recorded(None)
    if split_labels(row.get("labels")) or labels:
        return [normalise_row(row, task, labels, where, recorded)]
    asked = row.get("task") or task
    kind = TASK_ALIASES.get(str(asked).lower()) if asked else None
    targets = [(k, target, label_set) for k, sets in recorded.label_sets.items() if kind in (None, k)
               for target, label_set in sets.items()]
    if len(targets) < 2 or (asked and kind is None):   # one question, or an unknown task: normalise_row says so
        return [normalise_row(row, task, labels, where, recorded)]
    return [{**row, "task": check_kind(k), "labels": label_set, "target": target} for k, target, label_set in targets]


def read_rows(path: str, task: str | None, labels: tuple[str, ...],
              recorded: Recorded | None = None) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {n}: not JSON ({e.msg}).") from None
            rows += answer_rows(row, task, labels, f"{path}, line {n}", recorded)
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ecomkit.predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("texts", nargs="*", help="texts to answer (or --input FILE)")
    p.add_argument("--model", required=True, help="a saved model directory (a run's <output-dir>/final)")
    p.add_argument("--task", help="classify | extract (rows of --input may carry their own 'task'); default: "
                                  "every kind the model learned")
    p.add_argument("--labels", help="the label set, comma-separated, in prompt order, e.g. 品牌,颜色; default: "
                                    "every set the model learned (one answer line per target, e.g. category and "
                                    "sentiment)")
    p.add_argument("--input", help="a .jsonl file of rows {'text': ...} (optionally 'task', 'labels')")
    p.add_argument("--output", help="write one JSON answer per row here (default: print them)")
    p.add_argument("--prompt-format", choices=PROMPT_FORMATS, help="default: the format the model was trained with")
    p.add_argument("--gen-max-new-tokens", "--max-new-tokens", dest="max_new_tokens", type=int, default=None,
                   help=f"answer tokens generated at most; default: the run's --gen-max-new-tokens "
                        f"({DEFAULT_NEW_TOKENS} for a model without one)")
    p.add_argument("--num-beams", type=int, default=1, help="1 = greedy; > 1 = beam search")
    p.add_argument("--batch-size", type=int, default=8, help="prompts decoded together (left-padded)")
    p.add_argument("--seq-len", "--max-length", dest="max_length", type=int, default=None,
                   help="cut prompts as training did at this sequence length; default: the run's --seq-len (no "
                        "cut for a model without one)")
    return p


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    labels = split_labels(args.labels)
    if bool(args.input) == bool(args.texts):
        raise EcomkitError("Give either texts on the command line or --input FILE (not both, not neither).")
    recorded = Recorded(read_task_file(args.model) if Path(args.model).is_dir() else None, args.model)
    rows = (read_rows(args.input, args.task, labels, recorded) if args.input
            else [r for t in args.texts for r in answer_rows({"text": t}, args.task, labels, "command line", recorded)])
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens or recorded.gen_max_new_tokens or DEFAULT_NEW_TOKENS,
                              num_beams=args.num_beams, batch_size=args.batch_size,
                              max_length=args.max_length or recorded.seq_len or NO_CUT)
    answers = Predictor(args.model, args.prompt_format, settings).predict(rows, progress=bool(args.output))
    stopped = sum(a["at_budget"] for a in answers)
    if stopped:
        print(budget_line(stopped, len(answers), settings.max_new_tokens, BUDGET_FLAG), file=sys.stderr)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            for a in answers:
                f.write(json.dumps(a, ensure_ascii=False) + "\n")
        print(f"{len(answers)} answers written to {args.output}", file=sys.stderr)
        return
    for a in answers:
        shown = {k: a[k] for k in ("text", "target", "label", "spans", "generated") if k in a}
        print(json.dumps({**shown, **({"at_budget": True} if a["at_budget"] else {})}, ensure_ascii=False))
