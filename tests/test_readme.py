"""The README is for users: short, in the order a new user needs it, its measured tables and suite timings in docs/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_BYTES = 25_000
ORDER = ["The two commands", "Your own task, data and checkpoint", "The chapters", "GPU install",
         "Where the measured numbers live"]


def test_the_readme_is_under_25_kb():
    size = len(README.read_bytes())
    assert size < MAX_BYTES, f"README.md is {size:,} bytes; move reference material to docs/"


def test_the_readme_says_what_ecomkit_is_then_follows_a_users_order():
    text = README.read_text(encoding="utf-8")
    heads = [h for h in re.findall(r"^## (.+)$", text, flags=re.M)]
    assert heads == ORDER, heads
    intro = text.split("\n## ", 1)[0]
    assert "ecomkit is" in intro and "**For whom.**" in intro


def test_measured_tables_and_suite_timings_live_in_docs():
    text = README.read_text(encoding="utf-8")
    assert "<!-- report:" not in text                                  # every rendered table moved
    bench = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert bench.count("<!-- report:") >= 18                           # ... to docs/benchmarks.md
    assert "minutes for the first phase" in (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    assert "minutes for the first phase" not in text


def test_the_readme_says_presets_are_random_init_and_where_real_weights_go():
    text = README.read_text(encoding="utf-8")
    assert "random-init" in text and "--model ./models/SeqGPT-560M" in text and "DAMO-NLP/SeqGPT-560M" in text
    assert "scripts/00_demo.py" in text and "scripts/00_demo.py" in (REPO / "Makefile").read_text()


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = []
    for page in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} → {target}")
    assert not broken, broken


def test_the_readme_says_its_commands_need_the_venv_before_the_first_one():
    """Issue 49 item 10: `torchrun` and `python -m ecomkit…` only run with `.venv/bin` on PATH (or activated)."""
    text = README.read_text(encoding="utf-8")
    first_command = min(text.index(f"\n{cmd}") for cmd in ("torchrun ", "python -m ecomkit"))
    said = text.find("source .venv/bin/activate")
    assert 0 <= said < first_command, "say how to activate .venv before the first torchrun / python -m ecomkit line"
    assert '.venv/bin:$PATH' in text[:first_command] and ".venv/bin/torchrun" in text[:first_command]
