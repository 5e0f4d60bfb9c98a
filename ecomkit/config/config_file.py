"""A ``--config`` file (YAML or JSON) read into a dict; ``parse_config`` applies it between preset and flags.

Why apart from the flags: only a run given ``--config`` reads one (``cli.CONFIG_FILE`` imports it by name).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from ecomkit.errors import ConfigError


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
