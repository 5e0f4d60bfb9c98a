"""Row validation: every malformed row is either fatal (strict) or counted by reason (lenient).

Why both modes: a user preparing a data set wants the first bad row pointed
out precisely (``strict=True``: a DataError naming file, line, field and the
fix); a user training on a large scraped file wants bad rows skipped but
*counted*, so that "kept 98,812 of 100,000 rows" is visible in the log instead
of a silent shrink. Each row is counted once, under the first problem found
(fields are checked in the order title, price, spec, review, then optional
fields).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ecomkit.errors import DataError

TEXT_FIELDS: tuple[str, ...] = ("title", "spec", "review", "category", "brand", "sku", "sentiment")
ALL_FIELDS: tuple[str, ...] = ("sku", "category", "brand", "title", "price", "spec", "review", "sentiment")
CHECK_ORDER: tuple[str, ...] = ("title", "price", "spec", "review", "category", "sentiment", "brand", "sku")

REASONS: dict[str, str] = {
    "missing_field": "a required field is absent (or null)",
    "empty_field": "a required field is empty or only whitespace",
    "non_numeric_price": "price is not a number",
    "negative_price": "price is zero or negative",
    "wrong_type": "a field has the wrong type (text expected, or a number for price)",
    "undecodable_bytes": "the line is not valid UTF-8",
    "over_long_text": "a text field is longer than max_chars",
    "malformed_line": "the line is not a JSON object, or a CSV row has the wrong number of columns",
    "invalid_label": "sentiment is not positive, neutral or negative",
}

_ADVICE: dict[str, str] = {
    "missing_field": "Add the field to every row; if your data calls it differently, pass "
                     "column_map={'your_column': '<field>'}.",
    "empty_field": "Fill in the value or remove the row.",
    "non_numeric_price": "Write the price as a plain number such as 199.00 (a leading ¥/$ and thousands "
                         "separators are accepted).",
    "negative_price": "Prices must be greater than zero.",
    "wrong_type": "Store this field as text (a JSON string), and price as a number or numeric string.",
    "undecodable_bytes": "Re-save the file as UTF-8 (e.g. `iconv -f GBK -t UTF-8 in.csv > out.csv`).",
    "over_long_text": "Shorten the text, or raise max_chars if such long texts are intended.",
    "malformed_line": "Each JSONL line must be one JSON object; each CSV row must match the header.",
    "invalid_label": "Use positive, neutral or negative (正面/中性/负面 are also accepted).",
}

SENTIMENT_ALIASES: dict[str, str] = {
    "positive": "positive", "neutral": "neutral", "negative": "negative", "pos": "positive", "neu": "neutral",
    "neg": "negative", "正面": "positive", "中性": "neutral", "负面": "negative",
}
_CURRENCY = "¥￥$€£元 "


class RowProblem(Exception):
    """One malformed row: its reason (a key of REASONS), the field concerned and details."""

    def __init__(self, reason: str, field_name: str | None, detail: str):
        super().__init__(detail)
        self.reason, self.field, self.detail = reason, field_name, detail


@dataclass(frozen=True)
class ValidationIssue:
    reason: str
    location: str  # "line 12", "row 7", "item 3"
    field: str | None
    detail: str


@dataclass
class ValidationReport:
    """What a load kept and skipped: ``counts`` per reason, ``total`` rows seen, ``kept`` rows."""

    source: str
    total: int = 0
    kept: int = 0
    counts: Counter = field(default_factory=Counter)
    first_issue: dict[str, ValidationIssue] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return self.total - self.kept

    def add_issue(self, issue: ValidationIssue) -> None:
        self.counts[issue.reason] += 1
        self.first_issue.setdefault(issue.reason, issue)

    def summary(self) -> str:
        head = f"{self.source}: kept {self.kept:,} of {self.total:,} rows"
        if not self.skipped:
            return head + "."
        parts = []
        for reason, count in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])):
            first = self.first_issue[reason]
            where = f"{first.location}" + (f", field '{first.field}'" if first.field else "")
            parts.append(f"{reason} {count:,} (first at {where}: {first.detail})")
        return f"{head}; skipped {self.skipped:,}: " + "; ".join(parts) + "."


def strict_error(source: str, issue: ValidationIssue, column_of: Mapping[str, str]) -> DataError:
    """The one-paragraph error of strict mode: file, location, field, problem, fix."""
    where = f"{source}, {issue.location}"
    if issue.field:
        user_col = column_of.get(issue.field, issue.field)
        where += f", field '{issue.field}'" + (f" (your column '{user_col}')" if user_col != issue.field else "")
    advice = _ADVICE[issue.reason].replace("<field>", issue.field or "field")
    return DataError(f"{where}: {issue.detail} [{issue.reason}]. {advice} Or load with strict=False to skip "
                     f"malformed rows and get a count per reason.")


def parse_price(value: Any) -> float:
    """A positive finite float from a number or a numeric string such as '¥1,299.00'."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RowProblem("wrong_type", "price", f"price has type {type(value).__name__}, expected a number")
    if isinstance(value, str):
        text = value.strip().strip(_CURRENCY).replace(",", "")
        if not text:
            raise RowProblem("empty_field", "price", "price is empty")
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
    if not isinstance(value, str):
        raise RowProblem("wrong_type", name, f"{name} has type {type(value).__name__}, expected text")
    if any("\udc80" <= ch <= "\udcff" for ch in value):
        raise RowProblem("undecodable_bytes", name, f"{name} contains bytes that are not valid UTF-8")
    value = value.strip()
    if len(value) > max_chars:
        raise RowProblem("over_long_text", name, f"{name} has {len(value):,} characters, max_chars is {max_chars:,}")
    return value


def validate_row(raw: Mapping[str, Any], required: Sequence[str], max_chars: int) -> dict:
    """Return the normalised record (our field names, price as float) or raise :class:`RowProblem`.

    Optional fields that are absent, null or empty are left out of the record.
    Columns that are not ecomkit fields are dropped.
    """
    record: dict = {}
    for name in CHECK_ORDER:
        value = raw.get(name)
        if value is None:
            if name in required:
                raise RowProblem("missing_field", name, f"{name} is missing")
            continue
        if name == "price":
            record["price"] = parse_price(value)
            continue
        text = _check_text(name, value, max_chars)
        if not text:
            if name in required:
                raise RowProblem("empty_field", name, f"{name} is empty")
            continue
        if name == "sentiment":
            if text.lower() not in SENTIMENT_ALIASES:
                raise RowProblem("invalid_label", name, f"sentiment {text!r} is not positive/neutral/negative")
            text = SENTIMENT_ALIASES[text.lower()]
        record[name] = text
    return record
