"""Prompt formats: how a classification or extraction example is shown to the model, and how its answer reads.

One module builds every prompt and parses every answer, so training, generation and ``ecomkit.predict`` agree;
the formats (``--prompt-format``) and the answers' layout are in docs/data.md.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ecomkit.config.vocabulary import PROMPT_FORMATS as _FORMATS
from ecomkit.errors import ConfigError, DataError, did_you_mean

PROMPT_FORMATS: tuple[str, ...] = _FORMATS      # ("seqgpt", "ecomgpt", "ecomkit"), one home in config.vocabulary
TASK_FILE = "ecomkit_task.json"   # beside config.json in a saved model: the format and labels it was trained with
DEFAULT_PROMPT_FORMAT = "seqgpt"
LABEL_CUTOFF = 0.5  # difflib's similarity for "did you mean": one character off a two-character label
KIND_CLASSIFY, KIND_EXTRACT = "classify", "extract"
TASK_KINDS: tuple[str, ...] = (KIND_CLASSIFY, KIND_EXTRACT)
NO_SPANS = "无"                   # the whole answer of an extraction example without spans
LABEL_SEPARATOR = "，"            # between labels in a prompt, and between spans in an answer
Span = tuple[str, str]            # (label, surface text) -- what extraction is scored on

_SEQGPT_TASK = {KIND_CLASSIFY: "分类", KIND_EXTRACT: "抽取"}
_ECOMGPT_PREAMBLE = ("Below is an instruction that describes a task. "
                     "Write a response that appropriately completes the request.")
_ECOMGPT_TASK = {KIND_CLASSIFY: "对下面的文本进行分类，从候选标签中选出一个。",
                 KIND_EXTRACT: "从下面的文本中抽取候选标签对应的实体，每行一个标签，格式为“标签: 实体1，实体2”；没有实体时回答“无”。"}
_ECOMKIT_TASK = {KIND_CLASSIFY: "任务:文本分类。从候选标签中选出文本所属的一个。",
                 KIND_EXTRACT: "任务:实体抽取。从文本中抽出候选标签对应的实体。"}
# Where the input text sits in each format's prompt (:func:`input_span`), anchored at the end.
_INPUT_LAYOUTS = (re.compile(r"\A输入: (.*)\n(?:分类|抽取): [^\n]*\n输出: \[GEN\]\Z", re.S),   # seqgpt
                  re.compile(r"\n文本: (.*)\n\n### Response:\n\Z", re.S),                     # ecomgpt
                  re.compile(r"\n(?:商品|评论|文本):(.*)\n答:\Z", re.S))                          # ecomkit prompts
_SPAN_SPLIT = re.compile(r"[,，、;；]")
_LABEL_SPLIT = re.compile(r"[:：]")
_NEW_PROMPT = ("输入:", "输入：", "###", "任务:", "[GEN]")
_NONE_WORDS = frozenset({NO_SPANS, "none", "null", "n/a", "没有"})
_TRIM = " \t\r\u3000。.!！\"'“”‘’「」[]【】()（）"
# Spans lose spaces, quotes, a sentence end and repeated separators at their ends; brackets and dots may belong.
_SPAN_TRIM = " \t\r\u3000。！\"“”‘’:："


@dataclass(frozen=True)
class TaskExample:
    """One example that can be trained on (prompt -> answer) and evaluated by generation."""

    kind: str                      # "classify" | "extract"
    text: str                      # the input text shown to the model
    labels: tuple[str, ...]        # the label set listed in the prompt, in prompt order
    gold_label: str | None = None  # classify: the correct label (one of labels)
    gold_spans: tuple[Span, ...] = ()  # extract: sorted, de-duplicated (label, span) pairs
    source: str = ""               # a short id for predictions.jsonl, e.g. "file.jsonl:12" or "synthetic:7/brand"

    def __post_init__(self) -> None:
        check_kind(self.kind)
        object.__setattr__(self, "labels", tuple(self.labels))
        object.__setattr__(self, "gold_spans", tuple(sorted({(str(a), str(b)) for a, b in self.gold_spans})))
        if self.kind == KIND_CLASSIFY and self.gold_label is not None and self.gold_label not in self.labels:
            raise ConfigError(f"TaskExample {self.source or self.text[:20]!r}: gold label {self.gold_label!r} is "
                              f"not among its labels {list(self.labels)}.")
        stray = {label for label, _ in self.gold_spans} - set(self.labels)
        if stray:
            raise ConfigError(f"TaskExample {self.source or self.text[:20]!r}: span labels {sorted(stray)} are not "
                              f"among its labels {list(self.labels)}.")


@dataclass(frozen=True)
class ParsedAnswer:
    """What a generated (or gold) answer says."""

    label: str | None                     # classify: the label read (None if none matched)
    spans: frozenset[Span]                # extract: the set read
    unknown_labels: tuple[str, ...] = ()  # labels in the text that are not in `labels` (dropped, but counted)


def check_format(fmt: str) -> str:
    if fmt not in PROMPT_FORMATS:
        raise ConfigError(f"Unknown prompt format {fmt!r}; use one of {list(PROMPT_FORMATS)} ('seqgpt' is SeqGPT's "
                          f"own prompt, 'ecomgpt' EcomGPT's instruction layout).")
    return fmt


def check_kind(kind: str) -> str:
    if kind not in TASK_KINDS:
        raise ConfigError(f"Unknown example kind {kind!r}; use {KIND_CLASSIFY!r} or {KIND_EXTRACT!r}.")
    return kind


def build_prompt(fmt: str, kind: str, text: str, labels: Sequence[str]) -> str:
    """The prompt for ``text`` with the label set ``labels`` in format ``fmt``; the answer follows it directly."""
    check_format(fmt)
    check_kind(kind)
    listed = LABEL_SEPARATOR.join(labels)
    if fmt == "seqgpt":
        return f"输入: {text}\n{_SEQGPT_TASK[kind]}: {listed}\n输出: [GEN]"
    if fmt == "ecomgpt":
        return (f"{_ECOMGPT_PREAMBLE}\n\n### Instruction:\n{_ECOMGPT_TASK[kind]}\n候选标签: {listed}\n文本: {text}"
                f"\n\n### Response:\n")
    return f"{_ECOMKIT_TASK[kind]}\n候选:{'、'.join(labels)}\n文本:{text}\n答:"


def input_span(prompt: str) -> tuple[int, int]:
    """``[start, end)``: where the input text sits in ``prompt``, the part a cut to fit ``--seq-len`` shortens.

    A cut keeps the instruction, labels and answer cue, and loses the end of the input; a prompt in no known layout
    is all input.
    """
    for layout in _INPUT_LAYOUTS:
        match = layout.search(prompt)
        if match:
            return match.span(1)
    return 0, len(prompt)


def format_answer(fmt: str, ex: TaskExample) -> str:
    """The gold answer of ``ex`` (the same in every format)."""
    check_format(fmt)
    if ex.kind == KIND_CLASSIFY:
        if ex.gold_label is None:
            raise ConfigError(f"TaskExample {ex.source!r} is a classification example without a gold label.")
        return ex.gold_label
    by_label: dict[str, list[str]] = {}
    for label, span in ex.gold_spans:
        by_label.setdefault(label, []).append(span)
    lines = []
    for label in ex.labels:
        if label in by_label:
            spans = sorted(by_label[label], key=lambda s: (_first_index(ex.text, s), s))
            lines.append(f"{label}: {LABEL_SEPARATOR.join(spans)}")
    return "\n".join(lines) if lines else NO_SPANS


def prompt_and_answer(fmt: str, ex: TaskExample) -> tuple[str, str]:
    """``(prompt, answer)`` for training: the loss goes on the answer only."""
    return build_prompt(fmt, ex.kind, ex.text, ex.labels), format_answer(fmt, ex)


def parse_answer(fmt: str, kind: str, generated: str, labels: Sequence[str]) -> ParsedAnswer:
    """Read a generated answer (the text after the prompt) against the label set ``labels``; never raises on text."""
    check_format(fmt)
    check_kind(kind)
    canonical = {_norm_label(label): label for label in labels}
    if kind == KIND_CLASSIFY:
        return _parse_label(generated, canonical)
    spans: set[Span] = set()
    unknown: list[str] = []
    for line in generated.replace("\r", "\n").split("\n"):
        if line.strip().startswith(_NEW_PROMPT):
            break                      # the model went on to write a new prompt
        line = line.strip(" \t\r\u3000")
        if not line:
            continue
        parts = _LABEL_SPLIT.split(line, maxsplit=1)
        if len(parts) < 2:
            break                      # not "label: spans": the answer has ended (or it is 无)
        name, value = _norm_label(parts[0]), parts[1]
        if name not in canonical:
            raw = parts[0].strip(_TRIM)
            if raw and raw not in unknown:
                unknown.append(raw)
            continue
        for span in _SPAN_SPLIT.split(value):
            span = span.strip(_SPAN_TRIM)
            if span and span.lower() not in _NONE_WORDS:
                spans.add((canonical[name], span))
    return ParsedAnswer(None, frozenset(spans), tuple(unknown))


def _parse_label(generated: str, canonical: Mapping[str, str]) -> ParsedAnswer:
    """The first non-empty line, matched exactly, else by its longest label prefix; else unknown."""
    first = next((line for line in generated.replace("\r", "\n").split("\n") if line.strip(_TRIM)), "")
    raw = first.strip(_TRIM)
    first = _norm_label(raw)
    if not first:
        return ParsedAnswer(None, frozenset())
    if first in canonical:
        return ParsedAnswer(canonical[first], frozenset())
    for name in sorted(canonical, key=len, reverse=True):
        if name and first.startswith(name):
            return ParsedAnswer(canonical[name], frozenset())
    return ParsedAnswer(None, frozenset(), (raw,))


def _norm_label(text: str) -> str:
    """Labels compare after NFKC (full-width letters and digits → half-width), without spaces, case-folded."""
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text)).casefold().strip(_TRIM)


def _first_index(text: str, span: str) -> int:
    index = text.find(span)
    return index if index >= 0 else len(text)


def parse_labels(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"品牌,颜色"`` (``--labels``; ``，`` works too) or a sequence -> ``("品牌", "颜色")``; empty -> ``()``."""
    if not text:
        return ()
    items = re.split(r"[,，]", text) if isinstance(text, str) else list(text)
    return tuple(item.strip() for item in items if item.strip())


def check_labels_spelling(asked: Sequence[str], found: Sequence[str]) -> None:
    """``--labels`` names that no span carries but one typo off a label that spans carry: an error.

    A label far from every one the data has stays a warning (``labels_not_in_data``).
    """
    unused = [name for name in found if name not in asked]
    hints = {name: hint for name in asked if name not in found and (hint := did_you_mean(name, unused, LABEL_CUTOFF))}
    if hints:
        said = " ".join(f"{name!r} never occurs in the spans of the data.{hint}" for name, hint in hints.items())
        raise ConfigError(f"--labels: {said} The data's span labels: {', '.join(found)}. Fix the spelling in "
                          f"--labels.")


def write_task_file(model_dir: str | os.PathLike, *, prompt_format: str, task: str,
                    labels: Mapping[str, Sequence[str]], kinds: Sequence[str] = (), seq_len: int | None = None,
                    gen_max_new_tokens: int | None = None, reading: Mapping[str, Any] | None = None,
                    train_label_counts: Mapping[str, Mapping[str, int]] | None = None,
                    train_spans: Mapping[tuple[str, str], int] | None = None) -> Path:
    """Record in a saved model how it was trained: ``<model_dir>/ecomkit_task.json`` (its keys: docs/data.md).

    Evaluation and ``ecomkit.predict`` read it back so a model is prompted, cut and scored as its run was.
    """
    check_format(prompt_format)
    path = Path(model_dir) / TASK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"prompt_format": prompt_format, "task": task,
                            "labels": {k: list(v) for k, v in labels.items()}, "kinds": list(kinds)}
    info.update({k: int(v) for k, v in (("seq_len", seq_len), ("gen_max_new_tokens", gen_max_new_tokens))
                 if v is not None})
    if reading is not None:
        info["reading"] = {k: v for k, v in reading.items() if v}
    if train_label_counts is not None or train_spans is not None:
        info["baselines"] = {"train_label_counts": {t: dict(c) for t, c in (train_label_counts or {}).items()},
                             "train_spans": spans_by_label(train_spans or {})}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def spans_by_label(counts: Mapping[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    """``{(label, span): n}`` -> ``{label: {span: n}}``, sorted: the task file's form (:func:`span_counts` reverses it)."""
    out: dict[str, dict[str, int]] = {}
    for (label, span), n in sorted(counts.items()):
        out.setdefault(label, {})[span] = int(n)
    return out


def span_counts(by_label: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, str], int]:
    """The inverse of :func:`spans_by_label`."""
    return {(label, span): int(n) for label, spans in by_label.items() for span, n in spans.items()}


def read_task_file(model_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The dict :func:`write_task_file` wrote, or None for a model ecomkit did not train (released SeqGPT weights)."""
    path = Path(model_dir) / TASK_FILE
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        check_format(info["prompt_format"])
    except (json.JSONDecodeError, KeyError, TypeError, ConfigError) as exc:
        raise DataError(f"{path} is not a valid ecomkit task file ({exc}). Delete it to prompt the model in the "
                        f"default '{DEFAULT_PROMPT_FORMAT}' format, or re-save the model.") from None
    return info
