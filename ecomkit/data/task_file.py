"""A run's task settings: its prompt format and ``--labels`` checked, and recorded in a saved model's task file.

A training run checks and records them without loading the prompt builders and the answer parser (``data.formats``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from ecomkit.config.vocabulary import PROMPT_FORMATS
from ecomkit.errors import ConfigError, DataError, did_you_mean

TASK_FILE = "ecomkit_task.json"   # beside config.json in a saved model: the format and labels it was trained with
DEFAULT_PROMPT_FORMAT = "seqgpt"
LABEL_CUTOFF = 0.5  # difflib's similarity for "did you mean": one character off a two-character label


def check_format(fmt: str) -> str:
    if fmt not in PROMPT_FORMATS:
        raise ConfigError(f"Unknown prompt format {fmt!r}; use one of {list(PROMPT_FORMATS)} ('seqgpt' is SeqGPT's "
                          f"own prompt, 'ecomgpt' EcomGPT's instruction layout).")
    return fmt


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
