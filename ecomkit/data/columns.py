"""``--column-map``: your columns -> ecomkit fields, by name or by a path into a nested value.

A key is a column name or a path (``"labels.coarse[0]"`` is ``row["labels"]["coarse"][0]``), so nested labels are
read without rewriting the file. A key that matches no row is an error naming the columns found: a typo must not train
on the wrong fields.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Iterable, Mapping, Sequence

from ecomkit.errors import ConfigError, did_you_mean

ColumnPath = tuple[str | int, ...]
MISSING = object()   # what resolve() returns where the row has no value at the path
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]|(\.)")
EXAMPLE = '--column-map \'{"labels.coarse[0]": "category"}\''


@functools.lru_cache(maxsize=256)
def parse_path(key: str) -> ColumnPath:
    """``"labels.coarse[0]"`` -> ``("labels", "coarse", 0)``; a plain name -> ``(name,)``."""
    if not is_path(key):
        return (key,)
    steps: list[str | int] = []
    pos, after_dot = 0, False
    for match in _STEP.finditer(key):
        if match.start() != pos:
            break
        name, index, dot = match.groups()
        if dot:
            if not steps or after_dot:
                break
            after_dot = True
        elif index is not None:
            if not steps or after_dot:
                break
            steps.append(int(index))
        else:
            if steps and not after_dot:
                break
            steps.append(name)
            after_dot = False
        pos = match.end()
    if pos != len(key) or after_dot or not steps or not isinstance(steps[0], str):
        raise ConfigError(f"--column-map key {key!r} is not a column name or a path such as 'labels.coarse[0]' "
                          f"(keys joined by '.', list positions in [N]).")
    return tuple(steps)


def is_path(key: str) -> bool:
    return "." in key or "[" in key


def resolve(row: Any, path: ColumnPath) -> Any:
    """The value at ``path`` in ``row``, or :data:`MISSING`. A JSON text met on the way is read (CSV cells)."""
    value = row
    for step in path:
        if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return MISSING
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                return MISSING
            value = value[step]
        elif isinstance(value, Mapping) and step in value:
            value = value[step]
        else:
            return MISSING
    return value


def path_keys(column_map: Mapping[str, str]) -> dict[str, ColumnPath]:
    """The keys of ``column_map`` that are paths, parsed."""
    return {key: parse_path(key) for key in column_map if is_path(key)}


def map_columns(row: Mapping[str, Any], column_map: Mapping[str, str]) -> dict[str, Any]:
    """``row`` with its columns renamed by ``column_map``; path keys put the value they reach under their field.

    A column reached by a path is left out unless mapped itself, so an object column is not misread (e.g. as spans).
    """
    paths = {key: path for key, path in path_keys(column_map).items() if key not in row}
    consumed = {path[0] for path in paths.values()} - set(column_map)
    out = {column_map.get(k, k): v for k, v in row.items() if k not in consumed}
    for key, path in paths.items():
        value = resolve(row, path)
        if value is not MISSING:
            out[column_map[key]] = value
    return out


def heads(column_map: Mapping[str, str]) -> set[str]:
    """The top-level columns the map reads: its plain keys and the first step of its paths."""
    return {parse_path(key)[0] if is_path(key) else key for key in column_map}


def found_keys(rows: Iterable[Mapping[str, Any]], column_map: Mapping[str, str]) -> set[str]:
    """The keys of ``column_map`` that match a column (or reach a value) in at least one of ``rows``."""
    wanted, found = set(column_map), set()
    for row in rows:
        for key in wanted - found:
            if key in row or (is_path(key) and resolve(row, parse_path(key)) is not MISSING):
                found.add(key)
        if found == wanted:
            break
    return found


def describe_columns(rows: Iterable[Mapping[str, Any]], limit: int = 40) -> list[str]:
    """The columns of ``rows`` as a user would map them (``text``, ``labels.coarse``, ``labels.coarse[0]``)."""
    seen: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            for name in _names(key, value):
                seen.setdefault(name, None)
        if len(seen) >= limit:
            break
    return list(seen)[:limit]


def _names(key: str, value: Any, depth: int = 0) -> list[str]:
    if isinstance(value, Mapping) and value and depth < 2:
        return [name for k, v in value.items() for name in _names(f"{key}.{k}", v, depth + 1)]
    if isinstance(value, list) and value and depth < 2:
        return _names(f"{key}[0]", value[0], depth + 1)
    return [key]


def unmatched_error(source: str, missing: Sequence[str], columns: Sequence[str]) -> ConfigError:
    """The error for map keys that match no column: which keys, the columns found, and the path syntax."""
    keys = ", ".join(repr(k) for k in missing)
    hints = "".join(f"{f' For {k!r}:' if len(missing) > 1 else ''}{hint}" for k in missing
                    if (hint := did_you_mean(k, columns)))
    return ConfigError(f"--column-map key(s) {keys} match no column of {source}.{hints} The columns found: "
                       f"{list(columns)}. Map a column by its name, or a value inside one by its path, e.g. "
                       f"{EXAMPLE}.")
