"""LoRA in the output: no bitsandbytes unless QLoRA asks for it, no warnings of others, the base as the user gave it.

The start-up line and the printed summary of a real LoRA run are checked by ``tests/test_lora.py``
(its DDP LoRA launch); here, in a fresh process, what a non-QLoRA run imports and writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ecomkit.metrics import model_lines
from ecomkit.models.bloom import model_origin

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, sys
    from ecomkit.config import TrainConfig
    from ecomkit.models.bloom import build_model, load_model
    from ecomkit.models.lora import apply_peft, save_peft_outputs

    build_model("tiny", vocab_size=64, seed=1).save_pretrained("base")   # a local checkpoint, named relatively
    cfg = TrainConfig(peft="lora", model="base")
    model = apply_peft(load_model("base"), cfg)
    save_peft_outputs(model.state_dict(), model.config, cfg, "out")
    print(json.dumps({"bitsandbytes": "bitsandbytes" in sys.modules,
                      "base": json.load(open("out/adapter/adapter_config.json"))["base_model_name_or_path"]}))
""")


def test_a_lora_run_without_base_bits_imports_no_bitsandbytes_and_records_an_absolute_base(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", CHILD], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]                    # no FutureWarning either (it would raise)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["bitsandbytes"] is False, "peft imported bitsandbytes for a run that quantizes nothing"
    assert "gemm_4bit_forward" not in proc.stderr                       # bitsandbytes' CPU-kernel warning
    assert found["base"] == str((tmp_path / "base").resolve())         # absolute: loadable from anywhere


def test_the_summary_names_a_preset_as_a_random_init_and_lora_with_its_rank_and_targets():
    summary = {"model": "tiny", "params": 372_800, "model_origin": model_origin("tiny"),
               "lora": {"r": 8, "alpha": 16.0, "targets": ["query_key_value", "dense"], "base_bits": 16,
                        "trainable_params": 16_384, "params": 372_800}}
    text = model_lines(summary)
    assert "tiny: 372,800 parameters, random-init preset" in text and "--model DAMO-NLP/SeqGPT-560M" in text
    assert "LoRA            on: r=8, alpha 16, targets query_key_value, dense" in text
    assert "16,384 of 372,800 parameters train (4.39%)" in text
    assert model_origin("ecomgpt-7b")["text"].endswith("--model Alibaba-NLP/EcomGPT-7B-Multilingual, or a local "
                                                       "save_pretrained folder")
    assert model_origin("Org/Model")["kind"] == "hub"

