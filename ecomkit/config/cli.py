"""Command-line flags derived from :class:`~ecomkit.config.TrainConfig`, config files and overrides.

Why derived: a flag written by hand drifts from the field it sets. Here every
field becomes a flag (``max_steps`` → ``--max-steps``, ``zero.stage`` →
``--zero-stage``), a YAML/JSON file can be loaded with ``--config``, and
:func:`parse_config` validates the result before any process group exists,
so a typo never costs a cluster start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from ecomkit.config.schema import CONFIG_PRESETS, TrainConfig
from ecomkit.errors import ConfigError


def _flag(prefix: str, name: str) -> str:
    return "--" + (f"{prefix}-" if prefix else "") + name.replace("_", "-")


def _dest(prefix: str, name: str) -> str:
    return f"{prefix}__{name}" if prefix else name


def _base_type(tp: Any) -> Any:
    """Strip ``X | None`` to ``X``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args and typing.get_origin(tp) in (typing.Union, types.UnionType) else tp


def _parse_dict(text: str) -> dict[str, str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected JSON such as '{{\"name\": \"title\"}}', got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _add_fields(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _base_type(hints[f.name])
        if dataclasses.is_dataclass(tp):
            _add_fields(parser, tp, f.name)
            continue
        kw: dict[str, Any] = {"dest": _dest(prefix, f.name), "default": argparse.SUPPRESS}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) is dict or tp is dict:
            kw["type"] = _parse_dict
        else:
            kw["type"] = tp
        parser.add_argument(_flag(prefix, f.name), **kw)


def build_arg_parser(description: str = "", extra: Callable[[argparse.ArgumentParser], None] | None = None
                     ) -> argparse.ArgumentParser:
    """An argparse parser whose flags are derived from :class:`TrainConfig` (dashes, nested prefixes)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(CONFIG_PRESETS), default=None, help="start from a named preset")
    parser.add_argument("--config", default=None, help="YAML or JSON file with config values")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    _add_fields(parser, TrainConfig)
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
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{where}unknown config key '{name}'.{hint} Valid keys: {', '.join(names)}.")
    setattr(obj, name, value)


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict (clear errors for missing or malformed files)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Config file '{path}' does not exist. Pass the path of a .yaml/.yml/.json file.")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml.YAMLError or json.JSONDecodeError
        raise ConfigError(f"Config file '{path}' could not be parsed: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Config file '{path}' must hold a mapping of keys to values, not {type(data).__name__}.")
    return data


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


def parse_config(argv: list[str] | None = None, description: str = "", defaults: TrainConfig | None = None,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None,
                 aliases: Mapping[str, str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    """Build a validated :class:`TrainConfig` from preset → ``--config`` file → flags.

    Returns the config and the namespace (for script-specific extra flags).
    ``aliases`` maps short flags to derived ones (e.g. :data:`PARALLEL_FLAG_ALIASES`).
    Validation happens here, before any process group exists.
    """
    parser = build_arg_parser(description, extra)
    if aliases:
        argv = expand_aliases(sys.argv[1:] if argv is None else list(argv), aliases)
    ns = parser.parse_args(argv)
    cfg = CONFIG_PRESETS[ns.preset]() if ns.preset else (defaults if defaults is not None else TrainConfig())
    if ns.config:
        apply_overrides(cfg, load_config_file(ns.config), ns.config)
    for dest, value in vars(ns).items():
        if dest in ("preset", "config", "print_config") or not hasattr(cfg, dest.split("__")[0]):
            continue
        if "__" in dest:
            outer, inner = dest.split("__", 1)
            setattr(getattr(cfg, outer), inner, value)
        else:
            setattr(cfg, dest, value)
    cfg.validate()
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, ensure_ascii=False))
        raise SystemExit(0)
    return cfg, ns
