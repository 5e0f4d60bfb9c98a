"""Row validation: every malformed row is either fatal (strict) or counted by reason (lenient).

Strict points at the first bad row (file, line, field, fix); lenient skips and counts, and stops past
``max_bad_fraction``. Every field is optional, a row needs one text field or an instruction pair; a present but
malformed field makes the row bad, counted once under the first problem (:data:`CHECK_ORDER`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from ecomkit.data.spans import (
    SPAN_ADVICE,
    SPAN_FIELDS,
    SPAN_KEY_FIELDS,
    SPAN_REASONS,
    SpanProblem,
    has_spans,
    read_spans,
    tokens_text,
)
from ecomkit.data.build import ValidationIssue
from ecomkit.data.catalog import RECORD_FIELDS, TARGET_FIELDS, TEXT_FIELDS, spans_json
from ecomkit.data.task_file import LABEL_CUTOFF
from ecomkit.errors import ConfigError, DataError, did_you_mean

LABEL_FIELDS: tuple[str, ...] = ("category", "sentiment", "brand")   # the targets label_map can map
INSTRUCTION_FIELDS: tuple[str, ...] = ("instruction", "input", "output", "prompt", "response")
ALL_FIELDS: tuple[str, ...] = ("sku", "category", "brand", "title", "price", "spec", "review", "sentiment", "text",
                               *INSTRUCTION_FIELDS, *SPAN_FIELDS, *SPAN_KEY_FIELDS)
MAP_KEYS: tuple[str, ...] = (*LABEL_FIELDS, "spans", "ner_tags")   # spans: rename types; ner_tags: id -> tag name
CHECK_ORDER: tuple[str, ...] = ("title", "price", "spec", "review", "text", "category", "sentiment", "brand", "sku",
                                *INSTRUCTION_FIELDS)
MAX_LABEL_CHARS = 64

REASONS: dict[str, str] = {
    "missing_field": "the row has no text field (title, review, spec, text) and no instruction pair",
    "empty_field": "every text field of the row is empty or only whitespace",
    "non_numeric_price": "price is not a number",
    "negative_price": "price is zero or negative",
    "wrong_type": "a field has the wrong type (text expected, or a number for price)",
    "undecodable_bytes": "the line is not valid UTF-8",
    "over_long_text": "a text field is longer than max_chars",
    "malformed_line": "the line is not a JSON object, or a CSV row has the wrong number of columns",
    "invalid_label": "a label spans lines or is longer than 64 characters (a text column mapped as a label?)",
    "unmapped_label": "a label value is not a key of label_map",
    **SPAN_REASONS,
}

_ADVICE: dict[str, str] = {
    "missing_field": "Give every row a text field (title, review, spec or text) or an instruction pair "
                     "(instruction/output or prompt/response); if your data calls it differently, pass "
                     "--column-map '{\"your_column\": \"<field>\"}' (a nested value by its path, e.g. "
                     "'{\"labels.coarse[0]\": \"<field>\"}').",
    "empty_field": "Fill in the text or remove the row.",
    "non_numeric_price": "Write the price as a plain number such as 199.00 (a leading ¥/$ and thousands "
                         "separators are accepted).",
    "negative_price": "Prices must be greater than zero.",
    "wrong_type": "Store this field as text (a JSON string), and price as a number or numeric string.",
    "undecodable_bytes": "Re-save the file as UTF-8 (e.g. `iconv -f GBK -t UTF-8 in.csv > out.csv`).",
    "over_long_text": "Shorten the text, or raise max_chars if such long texts are intended.",
    "malformed_line": "Each JSONL line must be one JSON object; each CSV row must match the header.",
    "invalid_label": "Check the column_map: a label column holds short names such as 'positive' or '手机'.",
    "unmapped_label": "Add the value to label_map (--label-map '{\"<field>\": {\"0\": \"negative\", ...}}'), or "
                      "remove the row.",
    **SPAN_ADVICE,
}

SENTIMENT_ALIASES: dict[str, str] = {
    "positive": "positive", "neutral": "neutral", "negative": "negative", "pos": "positive", "neu": "neutral",
    "neg": "negative", "正面": "positive", "中性": "neutral", "负面": "negative",
}
_SENTIMENT_NAMES = tuple(dict.fromkeys(SENTIMENT_ALIASES.values()))
_CURRENCY = "¥￥$€£元 "


class RowProblem(Exception):
    """One malformed row: its reason (a key of REASONS), the field concerned and details."""

    def __init__(self, reason: str, field_name: str | None, detail: str):
        super().__init__(detail)
        self.reason, self.field, self.detail = reason, field_name, detail


# What a row needs for task nlu to build an example from it (besides a text): a target, spans or a pair.
LEARNABLE_FIELDS: tuple[str, ...] = (*TARGET_FIELDS, "spans", "prompt")
UNLABELED_SHOWN = 5                     # how many rows without a label the report names


def strict_error(source: str, issue: ValidationIssue, column_of: Mapping[str, str]) -> DataError:
    """The one-paragraph error of strict mode: file, location, field, problem, fix."""
    where = f"{source}, {issue.location}"
    if issue.field:
        user_col = column_of.get(issue.field, issue.field)
        where += f", field '{issue.field}'" + (f" (your column '{user_col}')" if user_col != issue.field else "")
    advice = _ADVICE[issue.reason].replace("<field>", issue.field or "field")
    return DataError(f"{where}: {issue.detail} [{issue.reason}]. {advice} Or drop --strict-data (the default, "
                     f"--no-strict-data; strict=False in Python) to skip malformed rows and get a count per reason.")


def check_label_map(label_map: Mapping[str, Mapping[str, str]] | None) -> dict[str, dict[str, str]]:
    """``{target: {raw value: label}}`` with string keys and values, for the keys in MAP_KEYS.

    ``spans`` renames extraction types; ``ner_tags`` names integer tag ids, as a list (id = position) or an object.
    """
    out: dict[str, dict[str, str]] = {}
    for target, mapping in (label_map or {}).items():
        if target not in MAP_KEYS:
            raise ConfigError(f"--label-map has the key {target!r}.{did_you_mean(target, MAP_KEYS)} It maps the "
                              f"values of one of {list(MAP_KEYS)}, "
                              f"e.g. --label-map '{{\"sentiment\": {{\"0\": \"negative\", \"1\": \"positive\"}}}}', "
                              f"'{{\"spans\": {{\"PER\": \"人物\"}}}}' or "
                              f"'{{\"ner_tags\": [\"O\", \"B-PER\", \"I-PER\"]}}'.")
        if target == "ner_tags" and isinstance(mapping, (list, tuple)):
            mapping = dict(enumerate(mapping))
        if not isinstance(mapping, Mapping) or not mapping:
            raise ConfigError(f"--label-map [{target!r}] must be a non-empty object of raw value -> label name, "
                              f"got {mapping!r}.")
        out[target] = {label_key(k): str(v).strip() for k, v in mapping.items()}
    _check_sentiment_names(out.get("sentiment", {}))
    return out


def _check_sentiment_names(mapping: Mapping[str, str]) -> None:
    """A sentiment name one letter off a known one ("postive") is a typo the model would learn as a fourth label."""
    for raw, name in mapping.items():
        hint = "" if name.lower() in SENTIMENT_ALIASES else did_you_mean(name.lower(), _SENTIMENT_NAMES)
        if hint:
            raise ConfigError(f"--label-map maps sentiment {raw!r} to {name!r}, which is not a sentiment label "
                              f"({', '.join(_SENTIMENT_NAMES)}, or your own names).{hint} Fix its spelling.")


def label_key(value: Any) -> str:
    """A raw label as text: 1, 1.0 and "1" are the same key (JSON numbers, CSV strings)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def parse_price(value: Any) -> float | None:
    """A positive finite float from a number or a numeric string such as '¥1,299.00'; None when empty."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RowProblem("wrong_type", "price", f"price has type {type(value).__name__}, expected a number")
    if isinstance(value, str):
        text = value.strip().strip(_CURRENCY).replace(",", "")
        if not text:
            return None
        try:
            number = float(text)
        except ValueError:
            raise RowProblem("non_numeric_price", "price", f"price {value!r} is not a number") from None
    else:
        number = float(value)
    if not math.isfinite(number):
        raise RowProblem("non_numeric_price", "price", f"price {value!r} is not a finite number")
    if number <= 0:
        raise RowProblem("negative_price", "price", f"price {value!r} is not greater than zero")
    return number


def _check_text(name: str, value: Any, max_chars: int) -> str:
    if name in LABEL_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = label_key(value)
    if isinstance(value, (dict, list)):
        inside = f"keys {list(value)[:6]}" if isinstance(value, dict) else f"{len(value)} items"
        raise RowProblem("wrong_type", name, f"{name} has type {type(value).__name__} ({inside}), expected text; "
                                             f"map the value inside it by its path, e.g. --column-map "
                                             f"'{{\"<column>.key[0]\": \"{name}\"}}'")
    if not isinstance(value, str):
        raise RowProblem("wrong_type", name, f"{name} has type {type(value).__name__}, expected text")
    if any("\udc80" <= ch <= "\udcff" for ch in value):
        raise RowProblem("undecodable_bytes", name, f"{name} contains bytes that are not valid UTF-8")
    value = value.strip()
    if len(value) > max_chars:
        raise RowProblem("over_long_text", name, f"{name} has {len(value):,} characters, max_chars is {max_chars:,}")
    return value


def _label(name: str, text: str, label_map: Mapping[str, Mapping[str, str]]) -> str:
    if name in label_map:
        if text not in label_map[name]:
            keys = ", ".join(repr(k) for k in list(label_map[name])[:8])
            hint = did_you_mean(text, label_map[name], cutoff=LABEL_CUTOFF)
            raise RowProblem("unmapped_label", name, f"{name} value {text!r} is not in label_map['{name}'] "
                                                     f"(its keys: {keys})" + (f".{hint}" if hint else ""))
        text = label_map[name][text]
    if "\n" in text or len(text) > MAX_LABEL_CHARS:
        raise RowProblem("invalid_label", name, f"{name} label {text[:40]!r}... spans lines or has {len(text):,} "
                                                f"characters (a label has at most {MAX_LABEL_CHARS})")
    if name == "sentiment":
        text = SENTIMENT_ALIASES.get(text.lower(), text)
    return text


def validate_row(raw: Mapping[str, Any], max_chars: int = 4096,
                 label_map: Mapping[str, Mapping[str, str]] | None = None, span_end: str = "exclusive",
                 column_map: Mapping[str, str] | None = None) -> dict:
    """Return the normalised record (all of :data:`RECORD_FIELDS`, None where absent) or raise :class:`RowProblem`.

    Unknown columns are dropped, labels mapped, instruction rows become ``prompt``/``response``; extraction rows keep
    ``text`` unstripped, as offsets point into it.
    """
    values: dict[str, Any] = {}
    empty_text = None
    for name in CHECK_ORDER:
        value = raw.get(name)
        if value is None:
            continue
        if name == "price":
            values["price"] = parse_price(value)
            continue
        text = _check_text(name, value, max_chars)
        if not text:
            empty_text = empty_text or (name if name in TEXT_FIELDS else None)
            continue
        values[name] = _label(name, text, label_map or {}) if name in LABEL_FIELDS else text
    record = {name: values.get(name) for name in RECORD_FIELDS}
    raw = _decoded_span_fields(raw)
    if has_spans(raw):
        _extraction(raw, record, max_chars, label_map or {}, span_end, column_map or {})
    _instruction_pair(values, record)
    if not any(record[f] for f in (*TEXT_FIELDS, "prompt")):
        if empty_text:
            raise RowProblem("empty_field", empty_text, "every text field of the row is empty")
        raise RowProblem("missing_field", None, "the row has no text field (title, review, spec or text) and no "
                                                "instruction pair")
    return record


def _instruction_pair(values: Mapping[str, Any], record: dict) -> None:
    """Alpaca/SeqGPT ``instruction`` (+ ``input``) → ``output``, or ``prompt`` → ``response``; both halves needed."""
    if values.get("instruction") or values.get("output"):
        for half in ("instruction", "output"):
            if not values.get(half):
                raise RowProblem("missing_field", half, f"an instruction row needs both instruction and output; "
                                                        f"{half} is missing or empty")
        body = values["instruction"] + (f"\n{values['input']}" if values.get("input") else "")
        record["prompt"], record["response"] = f"{body}\n答:", values["output"]
    elif values.get("prompt") or values.get("response"):
        for half in ("prompt", "response"):
            if not values.get(half):
                raise RowProblem("missing_field", half, f"a prompt/response row needs both; {half} is missing "
                                                        f"or empty")


def _extraction(raw: Mapping[str, Any], record: dict, max_chars: int, label_map: Mapping[str, Mapping[str, str]],
                span_end: str, column_map: Mapping[str, str]) -> None:
    """Text and checked spans of an extraction row, into ``record`` (or a RowProblem)."""
    if raw.get("tokens") is not None:
        if not isinstance(raw["tokens"], list) or not all(isinstance(t, str) for t in raw["tokens"]):
            raise RowProblem("malformed_tags", "tokens", "tokens must be a list of strings")
        text = tokens_text(raw["tokens"])[0]
        if len(text) > max_chars:
            raise RowProblem("over_long_text", "tokens", f"the tokens make {len(text):,} characters, max_chars is "
                                                         f"{max_chars:,}")
    else:
        text = raw.get("text")
        if not isinstance(text, str) or not text.strip():
            raise RowProblem("missing_field", "text", "a row with spans needs the text they point into (a 'text' "
                                                      "field, or --column-map '{\"your_column\": \"text\"}')")
    try:
        spans = read_spans(raw, text, span_end=span_end, column_map=column_map, type_map=label_map.get("spans"),
                           tag_names=label_map.get("ner_tags"))
    except SpanProblem as problem:
        raise RowProblem(problem.reason, problem.field, problem.detail) from None
    except KeyError as missing:
        keys = ", ".join(repr(k) for k in list(label_map["spans"])[:8])
        raise RowProblem("unmapped_label", "spans", f"span type {missing.args[0]!r} is not in label_map['spans'] "
                                                    f"(its keys: {keys})") from None
    record["text"], record["spans"] = text, spans_json(spans, text)


def _decoded_span_fields(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """A CSV cell holds spans, tokens or tags as JSON text: decode it (an empty cell is absent)."""
    if not any(isinstance(raw.get(k), str) for k in SPAN_FIELDS):
        return raw
    out = dict(raw)
    for name in SPAN_FIELDS:
        value = out.get(name)
        if isinstance(value, str):
            try:
                out[name] = json.loads(value) if value.strip() else None
            except json.JSONDecodeError as exc:
                reason = "span_offsets" if name == "spans" else "malformed_tags"
                raise RowProblem(reason, name, f"{name} is text that is not JSON ({exc.msg} at column "
                                               f"{exc.colno})") from None
    return out
