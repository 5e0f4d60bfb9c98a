"""Extraction rows: the three shapes users have, read into one list of checked spans.

Shapes (key names after ``column_map``; ``docs/data.md`` has examples):

- span lists ``{"text", "spans": [{"type", "term", "start", "end"}]}``, ``end`` exclusive unless
  ``span_end="inclusive"``; a file whose spans mostly look inclusive is refused with that fix;
- spans nested by label (CLUENER) ``{"text", "label": {type: {surface: [[start, end]]}}}``, end inclusive;
- token tags ``{"tokens", "ner_tags"}`` in BIO or BIOES, as names or integer ids with names given; the text is the
  tokens joined by nothing when all are one character, else by a space.

Each span becomes ``(type, start, end_exclusive)``; out-of-range, mismatched, overlapping spans and malformed tags
are counted per reason, each apart, so no problem hides another.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ecomkit.errors import ConfigError

SPAN_ENDS: tuple[str, ...] = ("exclusive", "inclusive")
SPAN_FIELDS: tuple[str, ...] = ("spans", "tokens", "ner_tags")       # row fields of the extraction shapes
SPAN_KEY_FIELDS: tuple[str, ...] = ("type", "term", "start", "end")  # keys inside one span of a span list
_ALIASES = {"type": ("type", "label"), "term": ("term", "span", "entity"), "start": ("start",), "end": ("end",)}
_PREFIXES = {"B", "I", "E", "S"}
MAX_TYPE_CHARS = 64

SPAN_REASONS: dict[str, str] = {
    "span_offsets": "a span's offsets are not integers, or do not cover its surface text",
    "span_out_of_range": "a span's offsets fall outside its text, or the span is empty",
    "inclusive_span_end": "a span's term is text[start:end + 1]: its end offset is inclusive",
    "overlapping_spans": "two spans of one label overlap",
    "malformed_tags": "a tag sequence is malformed (BIO/BIOES order, unknown tag, or not one tag per token)",
}
SPAN_ADVICE: dict[str, str] = {
    "span_offsets": "Each span needs integer start/end with 0 <= start < end <= len(text) (end exclusive, as in "
                    "Python slicing) and text[start:end] equal to its term.",
    "span_out_of_range": "Each span needs 0 <= start < end <= len(text) (end exclusive, as in Python slicing); "
                         "check that the offsets count characters of this row's text, not bytes or tokens.",
    "inclusive_span_end": "Your offsets include the last character; load with span_end='inclusive' "
                          "(--span-end inclusive), or add 1 to every end.",
    "overlapping_spans": "Spans of one label must not overlap: keep the longer one, or give them different labels.",
    "malformed_tags": "Use one tag per token: O, B-<type>, I-<type> (BIO), plus E-<type>, S-<type> (BIOES); an "
                      "I- tag continues an entity of the same type. For integer tags give the tag names once: "
                      "--label-map '{\"ner_tags\": [\"O\", \"B-PER\", ...]}'.",
}


class SpanProblem(Exception):
    """A bad extraction row: its reason (a key of SPAN_REASONS), the field concerned and details."""

    def __init__(self, reason: str, field_name: str | None, detail: str):
        super().__init__(detail)
        self.reason, self.field, self.detail = reason, field_name, detail


def check_span_end(span_end: str) -> str:
    if span_end not in SPAN_ENDS:
        raise ConfigError(f"--span-end must be 'exclusive' (end offsets as in Python slicing, the default) or "
                          f"'inclusive' (the end offset is the last character), got {span_end!r}.")
    return span_end


def has_spans(raw: Mapping[str, Any]) -> bool:
    """Whether a row (after the column map) is in one of the extraction shapes."""
    return raw.get("spans") is not None or isinstance(raw.get("label"), Mapping) or raw.get("tokens") is not None


def tokens_text(tokens: Sequence[str]) -> tuple[str, list[int]]:
    """The text of a token list and each token's start offset."""
    sep = "" if all(len(t) == 1 for t in tokens) else " "
    starts, pos = [], 0
    for token in tokens:
        starts.append(pos)
        pos += len(token) + len(sep)
    return sep.join(tokens), starts


def read_spans(raw: Mapping[str, Any], text: str, *, span_end: str = "exclusive",
               column_map: Mapping[str, str] | None = None, type_map: Mapping[str, str] | None = None,
               tag_names: Mapping[str, str] | None = None) -> list[tuple[str, int, int]]:
    """The row's spans as sorted ``(type, start, end_exclusive)``; raises :class:`SpanProblem`, or ValueError."""
    if raw.get("tokens") is not None:
        spans = _tag_spans(raw.get("tokens"), raw.get("ner_tags"), tag_names)
    elif raw.get("spans") is not None:
        value = raw["spans"]
        spans = _nested_spans(value, text) if isinstance(value, Mapping) else _listed_spans(
            value, text, span_end, column_map or {})
    else:
        spans = _nested_spans(raw["label"], text)
    renamed = sorted({(rename_type(t, type_map), s, e) for t, s, e in spans}, key=lambda x: (x[1], x[2], x[0]))
    _check_overlaps(renamed)
    return renamed


def rename_type(name: Any, type_map: Mapping[str, str] | None) -> str:
    """A span type as text, renamed by ``label_map['spans']``; KeyError when the map lacks it."""
    if not isinstance(name, str) or not name.strip():
        raise SpanProblem("span_offsets", "spans", f"span type {name!r} is not a non-empty string")
    name = name.strip()
    if type_map:
        if name not in type_map:
            raise KeyError(name)
        name = type_map[name]
    if "\n" in name or len(name) > MAX_TYPE_CHARS:
        raise SpanProblem("span_offsets", "spans", f"span type {name[:40]!r} spans lines or is longer than "
                                                   f"{MAX_TYPE_CHARS} characters")
    return name


def _offset(value: Any, name: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpanProblem("span_offsets", "spans", f"{where}: {name} {value!r} is not an integer")
    return value


def _in_text(start: int, end: int, text: str, where: str) -> None:
    if not 0 <= start < end <= len(text):
        raise SpanProblem("span_out_of_range", "spans", f"{where}: offsets [{start}, {end}) are outside the text "
                                                   f"(length {len(text)}) or empty")


def _listed_spans(value: Any, text: str, span_end: str, column_map: Mapping[str, str]) -> list[tuple[str, int, int]]:
    if not isinstance(value, list):
        raise SpanProblem("span_offsets", "spans", f"spans is a {type(value).__name__}, expected a list of objects")
    out = []
    for number, item in enumerate(value, start=1):
        where = f"span {number}"
        if not isinstance(item, Mapping):
            raise SpanProblem("span_offsets", "spans", f"{where} is a {type(item).__name__}, expected an object")
        item = {column_map.get(k, k): v for k, v in item.items()}
        got = {key: next((item[a] for a in aliases if item.get(a) is not None), None)
               for key, aliases in _ALIASES.items()}
        if got["start"] is None or got["end"] is None:
            raise SpanProblem("span_offsets", "spans", f"{where} has no start/end offsets (its keys: {list(item)})")
        start, end = _offset(got["start"], "start", where), _offset(got["end"], "end", where)
        end += span_end == "inclusive"
        term = got["term"]
        if term is not None and text[start:end] != str(term):
            if span_end == "exclusive" and 0 <= start < end < len(text) and text[start:end + 1] == str(term):
                raise SpanProblem("inclusive_span_end", "spans", f"{where}: term {term!r} is text[{start}:{end + 1}]"
                                                                 f", so end={end} includes its last character")
            _in_text(start, end, text, where)   # offsets outside the text are named as such, not as a mismatch
            raise SpanProblem("span_offsets", "spans", f"{where}: text[{start}:{end}] is {text[start:end]!r}, "
                                                       f"not the term {term!r}")
        _in_text(start, end, text, where)
        out.append((got["type"], start, end))
    return out


def _nested_spans(value: Any, text: str) -> list[tuple[str, int, int]]:
    """CLUENER: ``{type: {surface: [[start, end_inclusive], ...]}}``."""
    out = []
    for label, forms in value.items():
        if not isinstance(forms, Mapping):
            raise SpanProblem("span_offsets", "label", f"label[{label!r}] is a {type(forms).__name__}, expected "
                                                       f"{{surface: [[start, end], ...]}}")
        for surface, positions in forms.items():
            where = f"label[{label!r}][{surface!r}]"
            if not isinstance(positions, list) or not all(isinstance(p, list) and len(p) == 2 for p in positions):
                raise SpanProblem("span_offsets", "label", f"{where} is not a list of [start, end] pairs")
            for start, end in positions:
                start, end = _offset(start, "start", where), _offset(end, "end", where) + 1
                _in_text(start, end, text, where)
                if text[start:end] != surface:
                    hint = " (the end of this shape is inclusive)" if text[start:end - 1] == surface else ""
                    raise SpanProblem("span_offsets", "label", f"{where}: text[{start}:{end}] is "
                                                               f"{text[start:end]!r}{hint}")
                out.append((label, start, end))
    return out


def _tag_names(tags: list, tag_names: Mapping[str, str] | None) -> list[str]:
    names = []
    for tag in tags:
        if isinstance(tag, bool) or not isinstance(tag, (int, str)):
            raise SpanProblem("malformed_tags", "ner_tags", f"tag {tag!r} is neither a name nor an integer id")
        if isinstance(tag, int):
            if not tag_names:
                raise SpanProblem("malformed_tags", "ner_tags",
                                  "integer tags without tag names (give them once: --label-map "
                                  "'{\"ner_tags\": [\"O\", \"B-PER\", ...]}')")
            if str(tag) not in tag_names:
                raise SpanProblem("malformed_tags", "ner_tags", f"tag id {tag} has no name (the tag names have "
                                                                f"{len(tag_names)} entries)")
            tag = tag_names[str(tag)]
        names.append(tag.strip())
    return names


def _tag_spans(tokens: Any, tags: Any, tag_names: Mapping[str, str] | None) -> list[tuple[str, int, int]]:
    if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens) or not tokens:
        raise SpanProblem("malformed_tags", "tokens", "tokens must be a non-empty list of non-empty strings")
    if not isinstance(tags, list) or len(tags) != len(tokens):
        n = len(tags) if isinstance(tags, list) else type(tags).__name__
        raise SpanProblem("malformed_tags", "ner_tags", f"{n} tags for {len(tokens)} tokens (one tag per token)")
    names = _tag_names(tags, tag_names)
    text, starts = tokens_text(tokens)
    bioes = any(n[:2] in ("E-", "S-") for n in names)
    out, open_type, open_start = [], None, 0

    def close(i: int) -> None:
        out.append((open_type, starts[open_start], starts[i] + len(tokens[i])))

    for i, name in enumerate(names):
        prefix, _, kind = name.partition("-")
        if name == "O":
            if open_type is not None and bioes:
                raise SpanProblem("malformed_tags", "ner_tags", f"token {i + 1}: O before the open {open_type} "
                                                                f"entity ends (BIOES ends it with E-)")
            if open_type is not None:
                close(i - 1)
            open_type = None
            continue
        if prefix not in _PREFIXES or not kind:
            raise SpanProblem("malformed_tags", "ner_tags", f"token {i + 1}: tag {name!r} is not O or "
                                                            f"B-/I-/E-/S-<type>")
        if prefix in ("B", "S"):
            if open_type is not None:
                if bioes:
                    raise SpanProblem("malformed_tags", "ner_tags", f"token {i + 1}: {name} starts an entity "
                                                                    f"before the open {open_type} one ends")
                close(i - 1)
            open_type, open_start = kind, i
            if prefix == "S":
                close(i)
                open_type = None
            continue
        if open_type != kind:
            after = f"after {names[i - 1]}" if i else "at the start"
            raise SpanProblem("malformed_tags", "ner_tags", f"token {i + 1}: {name} {after} (an {prefix}- tag "
                                                            f"continues an entity of the same type)")
        if prefix == "E":
            close(i)
            open_type = None
    if open_type is not None:
        if bioes:
            raise SpanProblem("malformed_tags", "ner_tags", f"the {open_type} entity at the end has no E- tag")
        close(len(names) - 1)
    return out


def _check_overlaps(spans: Sequence[tuple[str, int, int]]) -> None:
    last_end: dict[str, tuple[int, int]] = {}
    for label, start, end in spans:
        if label in last_end and start < last_end[label][1]:
            prev = last_end[label]
            raise SpanProblem("overlapping_spans", "spans", f"{label} spans [{prev[0]}, {prev[1]}) and "
                                                            f"[{start}, {end}) overlap")
        if label not in last_end or end > last_end[label][1]:
            last_end[label] = (start, end)
