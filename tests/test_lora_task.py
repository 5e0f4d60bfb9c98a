"""LoRA trains and beats its task baselines, by generation, in the three acceptance launches:
``scripts/02_data_parallel.py --peft lora``, ``scripts/03_zero3.py --zero-stage 3 --peft lora`` and
``scripts/04_mixed_parallel.py --strategy fsdp --peft lora``, each on 2 gloo processes.

An adapter on a randomly initialised frozen base has no features to adapt, so the base is built first, the
way SeqGPT-560M is used: a tiny BLOOM fully fine-tuned (DDP, 2 processes) and saved (``final/``, loaded
with ``--model <dir>``) on :func:`ecomkit.data.toy_tasks.base_schema_rows`, which holds none of the
evaluated task's labels or examples: other seeds of the same kind of product text, extracted under
another schema (``主色``/``配件颜色``, never ``颜色``), reviews classified ``好评``/``差评`` (never
``positive``/``negative``), plus catalog reviews with the catalog's three sentiment labels. LoRA r=16 then
adapts that frozen base to :func:`ecomkit.data.toy_tasks.write_colour_task` (extract the product's own
colour as ``颜色``; the dictionary baseline scores F1 2/3 there by construction; sentiment against the
majority label).

Assertions, per launch: the final span F1 clears the dictionary baseline and the accuracy the majority
baseline, each by ``MARGIN_POINTS``; the base alone clears neither, so the gain is the adapter's; only the
adapters trained. The base alone is the DDP launch's step-0 evaluation, before any adapter update: the same
examples, and the same function in every launch (LoRA's B starts at zero), so the ZeRO-3 and FSDP2 launches
evaluate only at the end (each step-0 generation of 96 examples cost about 24 s on a 2-core CPU).

Why 96 decoded examples (48 extractions, 48 reviews): the adapters confuse one colour (``绿色`` answered
as ``蓝色``) more than the others, and the first 24 extractions of the dev file hold it 5 times, twice its
share. On a CPU without AVX-512 (other kernels, other rounding, other weights after 300 steps) FSDP2's
adapter then scored F1 0.708 on 24 extractions, 17 of 24 right, below the 0.717 this test asks; on 48 the
same runs scored 0.833 (DDP), 0.875 (ZeRO-3) and 0.812 (FSDP2), against the dictionary's 0.667.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_script
from ecomkit.data.toy_tasks import write_base_task, write_colour_task

pytestmark = [pytest.mark.dist, pytest.mark.slow]

COMMON = ["--precision", "fp32", "--task", "nlu", "--model", "tiny", "--seq-len", "64", "--micro-batch-size", "16", "--warmup-steps", "20",
          "--eval-batches", "2", "--eval-nlu-samples", "16", "--gen-eval-samples", "96", "--gen-max-new-tokens",
          "12", "--gen-batch-size", "12", "--final-eval-samples", "96", "--no-progress"]   # final = step 0's 96
BASE = ["--max-steps", "800", "--lr", "6e-3", "--eval-interval", "0", "--gen-eval-samples", "0"]
LORA_STEPS = 300
LORA = ["--peft", "lora", "--lora-r", "16", "--lora-alpha", "32", "--lr", "1e-2", "--max-steps", str(LORA_STEPS)]
BASE_ALONE = ["--eval-interval", str(LORA_STEPS)]   # evaluations at step 0 (the base alone) and at the end
AT_THE_END = ["--eval-interval", "0"]               # the final evaluation only
LAUNCHES = {"ddp": ("02_data_parallel.py", BASE_ALONE),
            "zero3": ("03_zero3.py", ["--zero-stage", "3", *AT_THE_END]),
            "fsdp": ("04_mixed_parallel.py", ["--strategy", "fsdp", *AT_THE_END])}
MARGIN_POINTS = 5.0   # each baseline must be cleared by at least this much


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The pretrained base every launch adapts: full fine-tuning on the base schema, saved as ``final/``."""
    out = tmp_path_factory.mktemp("lora_base")
    train, dev = write_base_task(out / "data")
    run_script("02_data_parallel.py", ["--data", str(train), "--eval-data", str(dev), *COMMON, *BASE,
                                       "--output-dir", str(out / "run")], nproc=2, timeout=600)
    return out / "run" / "final"


@pytest.fixture(scope="module")
def runs(base, tmp_path_factory) -> dict[str, tuple[dict, list[dict]]]:
    out = tmp_path_factory.mktemp("lora_task")
    train, dev = write_colour_task(out / "data")
    results = {}
    for name, (script, extra) in LAUNCHES.items():
        run_dir = out / name
        run_script(script, ["--data", str(train), "--eval-data", str(dev), *COMMON, "--model", str(base), *LORA,
                            *extra, "--output-dir", str(run_dir)], nproc=2, timeout=600)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        results[name] = (json.loads((run_dir / "summary.json").read_text()), [r for r in rows if "gen_decoded" in r])
    return results


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_lora_beats_both_baselines_and_the_base_alone_does_not(runs, name):
    s, evals = runs[name]
    assert s["world_size"] == 2 and s["peft"] == "lora" and 0 < s["trainable_params"] < 0.2 * s["params"], s
    run_dir = Path(s["output_dir"])   # what the launch saved: the adapter, and the merged model
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file() and (run_dir / "final" / "config.json").is_file()
    assert [r["step"] for r in evals] == ([0, LORA_STEPS] if name == "ddp" else [LORA_STEPS])
    after = evals[-1]
    assert after["gen_extract_n"] > 0 and after["gen_classify_n"] > 0
    margin = MARGIN_POINTS / 100
    assert after["gen_span_f1"] > after["dict_span_f1"] + margin, (name, after["gen_span_f1"], after["dict_span_f1"])
    assert after["gen_acc"] > after["gen_majority_acc"] + margin, (name, after["gen_acc"], after["gen_majority_acc"])
    assert s["gen_span_f1"] == pytest.approx(after["gen_span_f1"]) and s["gen_acc"] == pytest.approx(after["gen_acc"])
    # the base alone, on the same examples: the adapter made the difference
    before = runs["ddp"][1][0]
    assert before["step"] == 0 and before["gen_decoded"] == after["gen_decoded"], (before, after)
    assert before["gen_span_f1"] <= before["dict_span_f1"], (name, before["gen_span_f1"], before["dict_span_f1"])
    assert before["gen_acc"] <= before["gen_majority_acc"], (name, before["gen_acc"], before["gen_majority_acc"])
