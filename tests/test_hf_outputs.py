"""Outputs Hugging Face's own tools accept: saved configs with the tokenizer's ids and the KV cache on,
and the "auto" DeepSpeed JSON that ``TrainingArguments(deepspeed=...)`` fills in.

What ZeRO-3 under Trainer needs on CPU: ``use_cpu=True`` under torchrun
(``ecomkit.train.hf_trainer`` sets it) and a DeepSpeed JSON without
``train_batch_size``. With ``use_cpu=True`` accelerate does not initialise
DeepSpeed's process group, so DeepSpeed checks ``train_batch_size`` against a
world size of 1 and asserts when a ZeRO-3 model comes from ``from_pretrained``
(``HfDeepSpeedConfig`` is then active). The ``"auto"`` form leaves
``train_batch_size`` out (DeepSpeed derives it), and
``test_hf_trainer_zero3_from_a_saved_checkpoint_with_the_auto_json`` runs that case.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import REPO, load_module, run_script
from ecomkit.config import TrainConfig
from ecomkit.parallel.zero.config import trainer_auto_config

COMMON = ["--model", "tiny", "--n-rows", "400", "--seq-len", "64", "--eval-interval", "0", "--eval-batches", "1",
          "--warmup-steps", "1", "--no-progress"]


def _script(name: str):
    return load_module(REPO / "scripts" / name, name.replace(".py", ""))


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A 2-step single-process run that saves its model and tokenizer (the loop's save path)."""
    out = tmp_path_factory.mktemp("saved")
    run_script("02_data_parallel.py", COMMON + ["--max-steps", "2", "--micro-batch-size", "4", "--output-dir", str(out)])
    return out / "final"


def test_saved_config_carries_the_tokenizers_ids_and_the_cache(saved_run):
    tok = AutoTokenizer.from_pretrained(saved_run)
    config = json.loads((saved_run / "config.json").read_text())
    generation = json.loads((saved_run / "generation_config.json").read_text())
    assert tok.pad_token_id == 3 and tok.unk_token_id == 0  # BLOOM's layout: the bug was pad_token_id 0 (= <unk>)
    for saved in (config, generation):
        assert saved["pad_token_id"] == tok.pad_token_id
        assert saved["bos_token_id"] == tok.bos_token_id and saved["eos_token_id"] == tok.eos_token_id
        assert saved["use_cache"] is True


def test_reloaded_model_generates_with_the_cache_and_matches_no_cache(saved_run):
    tok = AutoTokenizer.from_pretrained(saved_run)
    model = AutoModelForCausalLM.from_pretrained(saved_run).eval()
    assert model.config.pad_token_id == tok.pad_token_id and model.generation_config.use_cache
    enc = tok(["商品：蓝牙耳机", "评论：很好"], return_tensors="pt", padding=True)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        cached = model.generate(**enc, **kw)                      # use_cache from the saved generation config
        plain = model.generate(**enc, use_cache=False, **kw)
    assert cached.shape[1] > enc["input_ids"].shape[1]       # it generated (eos may stop it before 6 tokens)
    assert torch.equal(cached, plain)


def test_ds_for_trainer_prints_the_auto_form(capsys):
    _script("03_zero3.py").main(["--print-ds-config", "--ds-for-trainer", "--zero-stage", "2"])
    ds = json.loads(capsys.readouterr().out)
    assert "train_batch_size" not in ds
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
        assert ds[key] == "auto"
    assert ds["bf16"] == {"enabled": "auto"} and ds["fp16"] == {"enabled": "auto"}
    assert ds["zero_optimization"]["stage"] == 2 and ds["zero_optimization"]["reduce_bucket_size"] == "auto"


def test_auto_form_of_zero3_leaves_the_stage3_choices_to_ecomkit():
    cfg = TrainConfig()
    cfg.zero.stage = 3
    zero = trainer_auto_config(cfg)["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == "auto"
    assert zero["stage3_param_persistence_threshold"] == cfg.zero.param_persistence_threshold


def _trainer_run(tmp_path, stage: int, model: str, micro: int) -> tuple[dict, list[dict]]:
    ds_path = tmp_path / "ds_auto.json"
    ds_path.write_text(json.dumps(trainer_auto_config(_stage_config(stage))))
    out = tmp_path / f"hf-zero{stage}"
    run_script("03_hf_trainer_zero.py", ["--model", model, "--n-rows", "400", "--seq-len", "64", "--max-steps", "3",
                                         "--micro-batch-size", str(micro), "--zero-stage", str(stage),
                                         "--no-progress", "--trainer-ds-config", str(ds_path),
                                         "--output-dir", str(out)], nproc=2, timeout=240)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), [r for r in rows if r.get("type") == "train"]


def _stage_config(stage: int) -> TrainConfig:
    cfg = TrainConfig()
    cfg.zero.stage = stage
    return cfg


@pytest.mark.dist
@pytest.mark.slow
def test_hf_trainer_zero2_runs_on_the_auto_json_with_its_own_batch_size(tmp_path):
    summary, rows = _trainer_run(tmp_path, stage=2, model="tiny", micro=3)
    assert summary["strategy"] == "hf-trainer+deepspeed" and summary["world_size"] == 2 and summary["steps"] == 3
    assert [r["samples"] for r in rows] == [6, 6, 6]   # Trainer's micro-batch 3 × 2 processes, filled into "auto"
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


@pytest.mark.dist
@pytest.mark.slow
def test_hf_trainer_zero3_from_a_saved_checkpoint_with_the_auto_json(tmp_path, saved_run):
    summary, rows = _trainer_run(tmp_path, stage=3, model=str(saved_run), micro=2)
    assert summary["steps"] == 3 and [r["samples"] for r in rows] == [4, 4, 4]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


@pytest.mark.dist
def test_tensor_parallel_loads_only_its_slices_of_a_saved_checkpoint_and_matches_one_process(saved_run, tmp_path):
    """TP builds on the meta device and each rank reads its own slices (``parallel.fsdp.load_local_parts``):
    the first step's loss on the saved weights equals one process loading the whole checkpoint."""
    args = COMMON + ["--model", str(saved_run), "--tokenizer", str(saved_run), "--max-steps", "1",
                     "--micro-batch-size", "4", "--no-save-model",
                     "--precision", "fp32"]   # compared to 1e-5: both at fp32 (04's script pins it; 02's is auto)
    run_script("02_data_parallel.py", args + ["--output-dir", str(tmp_path / "one")])
    run_script("04_mixed_parallel.py", args + ["--strategy", "tp", "--tp", "2", "--output-dir", str(tmp_path / "tp")],
               nproc=2)

    def first_loss(d) -> float:
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return next(r["loss"] for r in rows if r.get("type") == "train")

    one, tp = first_loss(tmp_path / "one"), first_loss(tmp_path / "tp")
    assert abs(one - tp) <= 1e-5 * abs(one), (one, tp)
