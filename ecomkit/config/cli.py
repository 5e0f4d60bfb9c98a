"""Command-line flags derived from :class:`~ecomkit.config.TrainConfig`, config files and overrides.

Why derived: a flag written by hand drifts from its field; :func:`parse_config` validates before any process group.
A flag's help is the comment beside its field in ``schema.py`` (:func:`field_docs`): a comment on a field's line
describes it, an indented comment-only line (``#   ...``) continues it, ``# --- name ---`` opens a section.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from functools import lru_cache
from typing import Any, Callable, Mapping, NamedTuple

from ecomkit import find
from ecomkit.config.schema import CONFIG_PRESETS, TrainConfig
from ecomkit.config.vocabulary import FIELD_CHOICES
from ecomkit.errors import ConfigError, did_you_mean

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


def _flag(prefix: str, name: str) -> str:
    return "--" + (f"{prefix}-" if prefix else "") + name.replace("_", "-")


def _dest(prefix: str, name: str) -> str:
    return f"{prefix}__{name}" if prefix else name


def _base_type(tp: Any) -> Any:
    """Strip ``X | None`` to ``X``; ``int | str`` (a number or a word such as ``auto``) stays as it is."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if set(args) in ({int, str}, {float, str}):
        return tp
    return args[0] if args and typing.get_origin(tp) in (typing.Union, types.UnionType) else tp


def _number_or_word(text: str) -> int | str:
    """``--seq-len 256`` -> 256, ``--seq-len auto`` -> "auto" (validate() says which words a field takes)."""
    try:
        return int(text)
    except ValueError:
        return text


def _real_or_word(text: str) -> float | str:
    """``--lr 2e-5`` -> 2e-05, ``--lr auto`` -> "auto" (validate() says which words a field takes)."""
    try:
        return float(text)
    except ValueError:
        return text


def _is_number_or_word(tp: Any) -> bool:
    return set(typing.get_args(tp)) - {type(None)} in ({int, str}, {float, str})


def _word_parser(tp: Any) -> Callable[[str], Any]:
    return _real_or_word if float in typing.get_args(tp) else _number_or_word


def parse_json_object(text: str) -> dict[str, str]:
    """A flag's JSON object (``--column-map``, ``--label-map``), or argparse's error for anything else."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected JSON such as '{{\"name\": \"title\"}}', got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


# Titles of the --help sections: TrainConfig's ``# --- name ---`` comments, then its nested dataclasses.
SECTION_TITLES = {"model": "model", "data": "data", "optimisation": "optimisation", "run": "strategy and run",
                  "zero": "zero (DeepSpeed, --strategy zero)", "compression": "compression (DDP hooks)",
                  "parallel": "parallel (FSDP2, TP, PP)", "fault": "faults (checkpoints, health, hangs)"}


def _metavar(name: str, tp: Any, choices: tuple | None) -> str:
    """``{0,1,2,3}`` for a field with fixed choices, else a word for its type (never ``ZERO__STAGE``)."""
    if choices:
        return "{" + ",".join(str(c) for c in choices) + "}"
    if typing.get_origin(tp) is dict or tp is dict:
        return "JSON"
    if tp is str and (name.endswith(("_dir", "_from", "_config")) or name in ("data", "model", "tokenizer")):
        return "PATH"
    if _is_number_or_word(tp):
        return "{X,auto}" if float in typing.get_args(tp) else "{N,auto}"
    return {int: "N", float: "X", str: "TEXT"}.get(tp, "VALUE")


def _help_text(doc: str, default: Any, choices: tuple | None, alias: str | None) -> str:
    """The field's comment, then its default, its allowed values and its short alias (argparse escapes %)."""
    parts = [doc.rstrip(".")] if doc else []
    shown = '""' if default == "" else default
    parts.append(f"default: {shown}")
    if choices:
        parts.append("choices: " + ", ".join(str(c) for c in choices))
    if alias:
        parts.append(f"short: {alias}")
    return "; ".join(parts).replace("%", "%%")


def _add_fields(parser: argparse.ArgumentParser, cls: type, defaults: Any, prefix: str = "",
                groups: dict[str, Any] | None = None, aliases: Mapping[str, str] | None = None) -> None:
    """One flag per field, in a --help section per schema section; help from the field's comment."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    groups = {} if groups is None else groups
    short = {long: alias for alias, long in (aliases or {}).items()}
    for f in dataclasses.fields(cls):
        tp = _base_type(hints[f.name])
        if dataclasses.is_dataclass(tp):
            _add_fields(parser, tp, getattr(defaults, f.name), f.name, groups, aliases)
            continue
        section = prefix or docs[f.name].section or "other"
        if section not in groups:
            description = (inspect.getdoc(cls) or "").splitlines()[0].replace("``", "") if prefix else None
            groups[section] = parser.add_argument_group(SECTION_TITLES.get(section, section), description)
        key = f"{prefix}.{f.name}" if prefix else f.name
        choices = FIELD_CHOICES.get(key)
        flag = _flag(prefix, f.name)
        kw: dict[str, Any] = {"dest": _dest(prefix, f.name), "default": argparse.SUPPRESS,
                              "help": _help_text(docs[f.name].help, getattr(defaults, f.name), choices,
                                                 short.get(flag))}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif _is_number_or_word(tp):
            kw["type"] = _word_parser(tp)
            kw["metavar"] = _metavar(f.name, tp, choices)
        else:
            kw["type"] = parse_json_object if typing.get_origin(tp) is dict or tp is dict else tp
            kw["metavar"] = _metavar(f.name, tp, choices)
        groups[section].add_argument(flag, **kw)


class FlagParser(argparse.ArgumentParser):
    """argparse whose usage errors (a mistyped flag, a missing value) are :class:`ConfigError` s.
    Why: argparse exits in every process, so under torchrun a typo printed N usage blocks; a ConfigError is
    reported once, by rank 0 (:func:`ecomkit.errors.exit_on_user_error`)."""

    def error(self, message: str):  # noqa: D102 (argparse's hook)
        hint = ""
        if message.startswith("unrecognized arguments:"):
            known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
            close = [difflib.get_close_matches(w.split("=")[0], known, n=1) for w in message.split(":", 1)[1].split()]
            hint = "".join(f" Did you mean {c[0]}?" for c in close if c)
        raise ConfigError(f"{self.prog}: {message}.{hint} `{self.prog} --help` lists every flag.")


def build_arg_parser(description: str = "", extra: Callable[[argparse.ArgumentParser], None] | None = None,
                     defaults: TrainConfig | None = None, aliases: Mapping[str, str] | None = None
                     ) -> argparse.ArgumentParser:
    """An argparse parser whose flags are derived from :class:`TrainConfig` (dashes, nested prefixes).
    ``--help`` has a section per part of the config, each flag's text its field's comment in ``schema.py`` with
    this script's default and the allowed values (shown, not enforced: :meth:`TrainConfig.validate` rejects)."""
    parser = FlagParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    files = parser.add_argument_group("presets and config files")
    files.add_argument("--preset", choices=sorted(CONFIG_PRESETS), default=None,
                       help="start from a named preset instead of this script's defaults")
    files.add_argument("--config", default=None, metavar="PATH",
                       help="YAML or JSON file with config values (nested sections as mappings); flags win over it")
    files.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    _add_fields(parser, TrainConfig, defaults if defaults is not None else TrainConfig(), aliases=aliases)
    if extra is not None:
        extra(parser)
    return parser


def apply_overrides(cfg: TrainConfig, values: dict[str, Any], source: str) -> TrainConfig:
    """Set (possibly nested) fields from a dict, rejecting unknown keys with a suggestion."""
    for key, value in values.items():
        target, name = cfg, key
        if isinstance(value, dict) and key in _nested_names():
            sub = getattr(cfg, key)
            for k2, v2 in value.items():
                _set_known(sub, k2, v2, f"{source}: {key}.")
            continue
        _set_known(target, name, value, f"{source}: ")
    return cfg


def _nested_names() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig) if dataclasses.is_dataclass(f.default_factory() if f.default_factory is not dataclasses.MISSING else None)}


def _set_known(obj: Any, name: str, value: Any, where: str) -> None:
    names = [f.name for f in dataclasses.fields(obj)]
    if name not in names:
        raise ConfigError(f"{where}unknown config key '{name}'.{did_you_mean(name, names)} Valid keys: {', '.join(names)}.")
    setattr(obj, name, value)


# Chapter 04's short flags: ``--tp 2`` is ``--parallel-tp 2``, ``--dcp-dir D`` is ``--parallel-dcp-dir D``.
PARALLEL_FLAG_ALIASES = {"--dp": "--parallel-dp", "--tp": "--parallel-tp", "--pp": "--parallel-pp",
                         "--dcp-dir": "--parallel-dcp-dir"}


def expand_aliases(argv: list[str], aliases: Mapping[str, str]) -> list[str]:
    """``--tp 2`` / ``--tp=2`` → ``--parallel-tp 2``: the config's derived flag names, shorter."""
    out = []
    for arg in argv:
        flag, sep, value = arg.partition("=")
        out.append(aliases[flag] + sep + value if flag in aliases else arg)
    return out


# A ``--config`` file's reader (YAML or JSON), imported by name when the flag is given.
CONFIG_FILE = "ecomkit.config.config_file"


def config_from_namespace(ns: argparse.Namespace, defaults: TrainConfig | None = None) -> TrainConfig:
    """preset → ``--config`` file → flags, not yet validated (the planner validates for its own world size)."""
    cfg = CONFIG_PRESETS[ns.preset]() if ns.preset else (defaults if defaults is not None else TrainConfig())
    if ns.config:
        apply_overrides(cfg, find(f"{CONFIG_FILE}:load_config_file")(ns.config),
                        ns.config)
    for dest, value in vars(ns).items():
        if dest in ("preset", "config", "print_config") or not hasattr(cfg, dest.split("__")[0]):
            continue
        if "__" in dest:
            outer, inner = dest.split("__", 1)
            setattr(getattr(cfg, outer), inner, value)
        else:
            setattr(cfg, dest, value)
    return cfg


def parse_config(argv: list[str] | None = None, description: str = "", defaults: TrainConfig | None = None,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None,
                 aliases: Mapping[str, str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    """Build a validated :class:`TrainConfig` from preset → ``--config`` file → flags; returns it and the namespace
    (for extra flags). ``aliases`` maps short flags to derived ones (:data:`PARALLEL_FLAG_ALIASES`)."""
    parser = build_arg_parser(description, extra, defaults, aliases)
    if aliases:
        argv = expand_aliases(sys.argv[1:] if argv is None else list(argv), aliases)
    ns = parser.parse_args(argv)
    cfg = config_from_namespace(ns, defaults)
    cfg.validate()
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, ensure_ascii=False))
        raise SystemExit(0)
    return cfg, ns
