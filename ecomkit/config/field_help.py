"""Help text for every config flag, read from the comments next to the fields in ``schema.py``.

Why comments, not ``field(metadata=...)``: one line per field is what a reader scans. Read with :mod:`tokenize`:
a comment on a field's line describes it, an indented comment-only line (``#   ...``) continues it, and
``# --- name ---`` opens a section. A field without a comment fails ``tests/test_cli_help.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
from functools import lru_cache
from typing import NamedTuple

_FIELD = re.compile(r"^\s*([A-Za-z_]\w*)\s*:\s*[^=]")
_SECTION = re.compile(r"^#\s*-{2,}\s*(.+?)\s*-{2,}\s*$")


class FieldDoc(NamedTuple):
    """What the source says about one field: its comment (may be empty) and its section (may be empty)."""

    help: str
    section: str


@lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, FieldDoc]:
    """``{field name: FieldDoc}`` for the dataclass ``cls``, from the comments in its source."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = {tok.start[0]: (tok.start[1], tok.string) for tok in
                tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    names = {f.name for f in dataclasses.fields(cls)}
    texts: dict[str, list[str]] = {}
    sections: dict[str, str] = {}
    section, last, last_col = "", None, None
    for row, line in enumerate(source.splitlines(), start=1):
        col, comment = comments.get(row, (len(line), ""))
        code = line[:col]
        text = comment.lstrip("#").strip()
        match = _FIELD.match(code)
        if match and match.group(1) in names and line[: len(line) - len(line.lstrip())] == "    ":
            last, last_col = match.group(1), col
            texts[last], sections[last] = [text] if text else [], section
        elif not code.strip() and comment:
            head = _SECTION.match(comment)
            if head:
                section, last = head.group(1), None
            elif last is not None and last_col is not None and col >= last_col and comment.startswith("#  "):
                texts[last].append(text)  # an indented continuation line
            else:
                last = None
        elif code.strip():
            last = None
    return {name: FieldDoc(" ".join(texts.get(name, [])), sections.get(name, "")) for name in names}


__all__ = ["FieldDoc", "field_docs"]
