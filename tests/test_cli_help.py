"""``--help`` explains itself: every flag described from its field's comment, readable metavars, sections.

And a plain DDP run neither imports DeepSpeed nor prints any of its lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ecomkit.config import PARALLEL_FLAG_ALIASES, TrainConfig, preset_zero3_tiny
from ecomkit.config.cli import SECTION_TITLES, build_arg_parser, field_docs

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ["model", "data", "optimisation", "strategy and run", "zero", "compression", "parallel", "faults"]


def _config_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest not in ("help",)]


def _all_fields(cls: type = TrainConfig, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        value = getattr(cls(), f.name)
        if dataclasses.is_dataclass(value):
            out += _all_fields(type(value), f.name)
        else:
            out.append(f"{prefix}.{f.name}" if prefix else f.name)
    return out


def test_every_config_field_has_a_comment_in_schema_py():
    """A field added without a ``# what it does`` comment would get a flag with no description."""
    missing = []
    for key in _all_fields():
        owner, _, name = key.rpartition(".")
        cls = type(getattr(TrainConfig(), owner)) if owner else TrainConfig
        if not field_docs(cls)[name].help:
            missing.append(key)
    assert not missing, f"fields without a comment in ecomkit/config/schema.py (add '# what it does'): {missing}"


def test_every_flag_has_help_with_its_default():
    parser = build_arg_parser()
    actions = _config_actions(parser)
    assert len(actions) == len(_all_fields()) + 3  # + --preset, --config, --print-config
    for action in actions:
        assert action.help and action.help.strip(), f"{action.option_strings} has no help"
        if action.dest not in ("preset", "config", "print_config"):
            assert "default: " in action.help, action.option_strings
            assert len(action.help.split("; default: ")[0]) > 5, f"{action.option_strings}: {action.help!r}"


def test_metavars_are_readable_and_show_the_choices():
    parser = build_arg_parser()
    by_flag = {a.option_strings[0]: a for a in _config_actions(parser)}
    assert by_flag["--zero-stage"].metavar == "{0,1,2,3}"
    assert by_flag["--strategy"].metavar == "{ddp,accelerate,zero,fsdp,tp,pp,mixed}"
    assert by_flag["--max-steps"].metavar == "{N,auto}" and by_flag["--lr"].metavar == "{X,auto}"
    assert by_flag["--micro-batch-size"].metavar == "N" and by_flag["--weight-decay"].metavar == "X"
    assert by_flag["--column-map"].metavar == "JSON" and by_flag["--output-dir"].metavar == "PATH"
    assert "choices: fp32, bf16, fp16" in by_flag["--precision"].help
    parser.prog = "02_data_parallel.py"  # under pytest, argv[0] is pytest's __main__.py
    usage = parser.format_usage() + parser.format_help()
    assert "__" not in usage and "ZERO_STAGE" not in usage


def test_help_is_grouped_by_section_in_order():
    parser = build_arg_parser()
    titles = [g.title for g in parser._action_groups]
    found = [next(t for t in titles if t.startswith(s)) for s in SECTIONS]
    assert [titles.index(t) for t in found] == sorted(titles.index(t) for t in found)
    group_of = {a.option_strings[0]: g.title for g in parser._action_groups for a in g._group_actions}
    assert group_of["--attn"] == "model" and group_of["--seq-len"] == "data"
    assert group_of["--lr"] == "optimisation" and group_of["--strategy"] == SECTION_TITLES["run"]
    assert group_of["--zero-stage"].startswith("zero") and group_of["--fault-hang-dump-s"].startswith("faults")
    assert group_of["--parallel-tp"].startswith("parallel")
    assert group_of["--compression-method"].startswith("compression")


def test_help_shows_the_scripts_own_defaults_and_short_aliases():
    zero = {a.option_strings[0]: a.help for a in _config_actions(build_arg_parser(defaults=preset_zero3_tiny()))}
    assert "default: zero;" in zero["--strategy"] and "default: 20" in zero["--max-steps"]
    mixed = {a.option_strings[0]: a.help for a in _config_actions(build_arg_parser(aliases=PARALLEL_FLAG_ALIASES))}
    assert mixed["--parallel-tp"].endswith("short: --tp")


@dataclass
class _Documented:
    """A stand-in for schema.py's layout."""

    # --- first ---
    name: str = "a # not a comment"   # the name
    size: int = 3                     # how many, continued
                                      #   on the next line
    # a free-standing remark, not a continuation
    bare: float = 1.0
    # --- second ---
    flag: bool = False                # a switch


def test_field_comments_are_read_with_tokenize():
    docs = field_docs(_Documented)
    assert docs["name"] == ("the name", "first")
    assert docs["size"] == ("how many, continued on the next line", "first")
    assert docs["bare"] == ("", "first")
    assert docs["flag"] == ("a switch", "second")


@pytest.mark.slow
def test_ddp_script_help_and_run_print_nothing_from_deepspeed(tmp_path):
    """``--help`` shows described sections; a 1-step DDP run never imports DeepSpeed nor prints its lines."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    script = str(REPO / "scripts" / "02_data_parallel.py")
    helped = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert helped.returncode == 0, helped.stderr[-2000:]
    for title in SECTIONS:
        assert f"\n{title}" in helped.stdout, title
    assert "--zero-stage {0,1,2,3}" in helped.stdout and "--lr {X,auto}" in helped.stdout
    assert "peak learning rate (AdamW). auto: by what is trained" in helped.stdout
    code = ("import runpy, sys; sys.argv = [sys.argv[1], *sys.argv[2:]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__'); "
            "print('DS_MODULE_LOADED', 'deepspeed' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code, script, "--max-steps", "1", "--eval-interval", "0",
                          "--eval-batches", "1", "--n-rows", "200", "--no-progress",  # evaluates and saves too
                          "--output-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    text = run.stdout + run.stderr
    assert "DS_MODULE_LOADED False" in text
    assert [line for line in text.splitlines() if "deepspeed" in line.lower()] == []


# ------------------------------------------------------------------ messages speak in flags (issue #43 item 5)

# Library arguments that are config fields under another name: a message saying "strict=False" means the flag
# --no-strict-data on the command line.
ARGUMENT_FIELDS = {"strict": "strict_data"}


def _flag_names() -> dict[str, str]:
    """Python spelling (``seq_len``, ``zero.stage``, ``strict``) -> the flag stem (``--seq-len``, ``--zero-stage``)."""
    out = {key: "--" + key.replace(".", "-").replace("_", "-") for key in _all_fields()}
    out.update({arg: out[field] for arg, field in ARGUMENT_FIELDS.items()})
    return out


def _messages(tree) -> list[tuple[int, str]]:
    """The text of every raise, log/warning call and ``*ADVICE`` dict value of a module (f-string parts joined)."""
    import ast

    def text(node) -> str:
        return "".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))

    def called(node) -> str:
        return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (called(node).endswith("Error") or called(node) in (
                "warning", "info", "error", "warn", "exception")):
            out.append((node.lineno, text(node)))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("ADVICE")
                                                  for t in node.targets) and isinstance(node.value, ast.Dict):
            out += [(v.lineno, text(v)) for v in node.value.values]
    return out


def test_user_facing_messages_that_name_a_config_field_name_its_flag():
    """A message that says ``strict=False`` or ``task='lm'`` also names ``--no-strict-data`` / ``--task lm``.

    Errors and advice reach users of the command line, who set fields with flags; Python's spelling alone
    sends them looking for a keyword argument they cannot pass. Every error, log call and advice text of the
    package that writes ``field=`` (a TrainConfig field, or a loader argument that is one), or names a field
    whose name has an underscore (``column_map``: no English word), must name the flag.
    """
    import re

    flags = _flag_names()
    words = sorted(map(re.escape, flags), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(words) + r")=|(?<![\w.-])(" +
                         "|".join(w for w in words if "_" in w) + r")(?![\w(])")
    missing = []
    for path in sorted((REPO / "ecomkit").rglob("*.py")):
        import ast
        for line, message in _messages(ast.parse(path.read_text(encoding="utf-8"))):
            for match in pattern.finditer(message):
                stem = flags[match.group(1) or match.group(2)]
                if stem not in message and stem.replace("--", "--no-", 1) not in message:
                    missing.append(f"{path.relative_to(REPO)}:{line}: {match.group(0)} without {stem}")
    assert not missing, "messages in Python's words only:\n" + "\n".join(missing)
