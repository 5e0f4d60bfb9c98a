"""Issue 49 item 3: one precision rule for every entry point; the demo and the command it prints agree.

The demo ran at ``precision auto`` (bf16 on a CPU that multiplies faster in it) while the command it then
suggested trained at fp32, and nothing said so. ``--precision auto`` is now every script's default
(the chapters that assert 1 vs N processes equal pin fp32 in their own scripts); the start-up line says
which precision ran and why (tests/test_recipe.py reads it from a run).
"""

from __future__ import annotations

import shlex

from ecomkit.config import TrainConfig, parse_config
from ecomkit.train.demo import demo_config, next_command


def test_the_demo_and_the_command_it_suggests_train_at_the_same_precision(tmp_path):
    """Issue 49 item 3: the demo ran at ``precision auto`` while the command it printed trained at fp32."""
    data = tmp_path / "mine.csv"
    data.write_text("title,category\n华为 手机,手机\n", encoding="utf-8")
    words = shlex.split(next_command(demo_config()).replace("YOUR_FILE.csv", str(data)))
    suggested, _ = parse_config(words[words.index("scripts/02_data_parallel.py") + 1:])
    assert suggested.precision == demo_config().precision == "auto"


def test_precision_auto_is_every_entry_point_s_default():
    assert TrainConfig().precision == "auto" and parse_config([])[0].precision == "auto"
