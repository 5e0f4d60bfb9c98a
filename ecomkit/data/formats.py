"""Prompt formats: how a classification or extraction example is shown to the model, and how its answer reads.

One module builds every prompt and parses every answer, so training, generation and ``ecomkit.predict`` agree;
the formats (``--prompt-format``) and the answers' layout are in docs/data.md.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Mapping, Sequence

from ecomkit.config.vocabulary import PROMPT_FORMATS as _FORMATS
from ecomkit.data.task_file import check_format
from ecomkit.errors import ConfigError

PROMPT_FORMATS: tuple[str, ...] = _FORMATS      # ("seqgpt", "ecomgpt", "ecomkit"), one home in config.vocabulary
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
