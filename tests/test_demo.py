"""``make demo``: it learns its task, prints the metric beside a baseline from the training labels, names the
model and the next command. The run is the Makefile's own demo line (read from the Makefile), with its
output folder moved under the test's."""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest

from conftest import run_script

REPO = Path(__file__).resolve().parents[1]
MIN_MARGIN = 0.30            # accuracy above the baseline, in [0, 1]; measured: +0.79 (bf16) to +0.89 (fp32)


def makefile_demo() -> tuple[str, list[str]]:
    """(script, its arguments) of the ``demo`` target's torchrun line."""
    text = (REPO / "Makefile").read_text()
    recipe = text.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    line = next(ln.strip() for ln in recipe.splitlines() if "torch.distributed.run" in ln)
    words = shlex.split(line)
    script = next(w for w in words if w.startswith("scripts/"))
    assert words[words.index("--nproc_per_node") + 1] == "2"
    return Path(script).name, words[words.index(script) + 1:]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("demo")
    script, args = makefile_demo()
    args[args.index("--output-dir") + 1] = str(out)
    proc = run_script(script, args, nproc=2, timeout=600)
    block = proc.stdout.split("=== what the model learned ===", 1)
    assert len(block) == 2, proc.stdout[-3000:]
    return block[1], out


@pytest.mark.dist
@pytest.mark.slow
def test_the_demo_prints_its_metric_beside_a_baseline_from_the_training_labels(demo):
    printed, out = demo
    summary = json.loads((out / "summary.json").read_text())
    line = next(ln for ln in printed.splitlines() if ln.startswith("result "))
    acc, base = map(float, re.search(r"accuracy ([\d.]+) .* baseline ([\d.]+)", line).groups())
    assert (acc, base) == (round(summary["gen_acc"], 3), round(summary["gen_majority_acc"], 3)), line
    assert acc >= base + MIN_MARGIN and "clears it" in line, line
    # the baseline answers the most frequent category among the titles that trained (not the held-out ones)
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    held_out = {json.loads(x)["title"] for x in (out / "data" / "titles.jsonl").read_text().splitlines()
                if any(json.loads(x)["title"] in r["prompt"] for r in rows)}
    training = Counter(json.loads(x)["category"] for x in (out / "data" / "titles.jsonl").read_text().splitlines()
                       if json.loads(x)["title"] not in held_out)
    majority = training.most_common(1)[0][0]
    assert summary["gen_majority_labels"] == [majority] and f"always answering {majority}" in line
    assert base == round(sum(r["gold"] == majority for r in rows) / len(rows), 3)


@pytest.mark.dist
@pytest.mark.slow
def test_the_demo_says_which_model_it_is_and_what_to_run_next(demo):
    printed, out = demo   # the demo's own block, after the run summary
    summary = json.loads((out / "summary.json").read_text())
    model = next(ln for ln in printed.splitlines() if ln.startswith("model     "))
    assert f"{summary['model']}: a random-init preset, {summary['params']:,} parameters" in model, model
    lines = printed.splitlines()
    nxt = lines[lines.index(next(ln for ln in lines if ln.startswith("next "))) + 1]
    assert "scripts/02_data_parallel.py --task nlu" in nxt and "--data YOUR_FILE.csv" in nxt, nxt
    assert "--model DAMO-NLP/SeqGPT-560M" in printed


def test_the_first_progress_line_is_not_an_empty_step_0(capsys):
    """The demo's first progress line read "train 0/60" with nothing after it (the loop's update(0))."""
    from ecomkit.metrics import LineProgress

    bar = LineProgress(60, "train")
    bar.update(0)                     # the loop's update(step) before the first step
    assert capsys.readouterr().out == ""
    bar.set_postfix(loss="8.1")
    for _ in range(6):
        bar.update(1)
    assert capsys.readouterr().out == "train 6/60 loss=8.1\n"
