"""Chapter 03 unit tests (one process, no torchrun): DeepSpeed config generation and validation,
the CPU-Adam fallback, the memory formulas and DeepSpeed's estimators, the guide's table, variant parsing.

No test prepares DeepSpeed's environment at import: the library sets it before it imports deepspeed,
so each test passes alone and in any order."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from conftest import REPO, load_module
from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.errors import ConfigError
from ecomkit.hardware import extensions_dir
from ecomkit.models.bloom import build_model
from ecomkit.parallel.state_bytes import tensor_bytes, unique_storage_bytes
from ecomkit.parallel.zero.config import build_zero_config, validate_user_config
from ecomkit.parallel.zero.env import ensure_deepspeed_env, prebuild_cpu_adam
from ecomkit.parallel.zero.strategy import CPUAdamUnavailableWarning, _check_precision_supported, build_zero_optimizer
from ecomkit.parallel.zero.variants import parse_variants
from ecomkit.planner.zero_formulas import (SEQGPT_GUIDE_TABLE, check_guide_table, deepspeed_estimates, formula_bytes,
                                           guide_plausibility)
from ecomlab.measure.zero import max_relative_loss_difference


def zero_cfg(**zero) -> TrainConfig:
    cfg = TrainConfig(strategy="zero", precision="fp32", micro_batch_size=4, grad_accum=2, max_grad_norm=0.5)
    for k, v in zero.items():
        setattr(cfg.zero, k, v)
    return cfg


def all_values(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from all_values(v)
    else:
        yield node


# ---------------------------------------------------------------------- generation
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_generated_config_is_consistent_and_has_no_auto(stage):
    ds = build_zero_config(zero_cfg(stage=stage), world_size=4, grad_accum=2)
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 4 == 32
    assert ds["gradient_clipping"] == 0.5 and ds["zero_optimization"]["stage"] == stage
    assert "auto" not in list(all_values(ds))
    assert ("stage3_param_persistence_threshold" in ds["zero_optimization"]) == (stage == 3)
    if stage == 3:
        assert ds["zero_optimization"]["stage3_param_persistence_threshold"] == 0  # tiny models really partition


def test_offload_precision_buckets_and_activation_checkpointing():
    cfg = zero_cfg(stage=3, offload_optimizer=True, offload_param=True, activation_checkpointing=True)
    cfg.precision = "fp16"
    ds = build_zero_config(cfg, 2, 2, n_params=1000)
    z = ds["zero_optimization"]
    assert z["offload_optimizer"]["device"] == "cpu" and z["offload_param"]["device"] == "cpu"
    assert ds["zero_force_ds_cpu_optimizer"] is False           # lets the torch-AdamW fallback run offloaded
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    assert z["reduce_bucket_size"] == z["stage3_prefetch_bucket_size"] == 1000  # capped at Ψ
    assert "activation_checkpointing" in ds
    cfg.precision = "bf16"
    assert build_zero_config(cfg, 2, 2)["bf16"] == {"enabled": True}


def test_offload_param_needs_stage_3():
    with pytest.raises(ConfigError, match="needs ZeRO stage 3"):
        zero_cfg(stage=2, offload_param=True).validate(world_size=2)


# ---------------------------------------------------------------------- user configs
@pytest.mark.parametrize("user, match", [
    ({"gradient_clip": 1.0}, "unknown top-level key 'gradient_clip'. Did you mean 'gradient_clipping'"),
    ({"zero_optimization": {"stage3_param_persistance_threshold": 0}},
     "unknown zero_optimization key 'stage3_param_persistance_threshold'. Did you mean "
     "'stage3_param_persistence_threshold'"),
    ({"gradient_clipping": "auto"}, "'gradient_clipping' is \"auto\""),
    ({"amp": {"enabled": True}}, "'amp': NVIDIA Apex AMP integration has been removed"),
])
def test_bad_user_config_is_rejected_clearly(user, match):
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
        validate_user_config(user, "my_ds.json")


def test_valid_user_config_is_merged(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": 1234}, "train_batch_size": 16,
                                "wall_clock_breakdown": True}))
    ds = build_zero_config(zero_cfg(stage=2, user_config=str(path)), 2, 2)
    assert ds["zero_optimization"]["reduce_bucket_size"] == 1234 and ds["wall_clock_breakdown"] is True
    assert ds["zero_optimization"]["stage"] == 2  # untouched keys keep ecomkit's values


def load_script():
    return load_module(REPO / "scripts" / "03_zero3.py", "zero3_script")


def test_script_rejects_a_bad_user_config_before_any_process_group(tmp_path, capsys):
    bad = tmp_path / "ds.json"
    bad.write_text('{"zero_optimization": {"stage": 3}, "train_batch_size": 999}')
    with pytest.raises(SystemExit) as exc:
        load_script().main(["--zero-user-config", str(bad), "--output-dir", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "train_batch_size=999 disagrees" in err and str(bad) in err
    assert not torch.distributed.is_initialized()


def test_print_ds_config_prints_the_generated_json(capsys):
    load_script().main(["--print-ds-config", "--ds-world-size", "8", "--zero-stage", "2", "--zero-offload-optimizer",
                        "--micro-batch-size", "4"])
    ds = json.loads(capsys.readouterr().out)
    assert ds["train_batch_size"] == 32 and ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


# ---------------------------------------------------------------------- CPU Adam fallback, precision
def test_offload_falls_back_to_torch_adamw_with_a_warning_when_cpu_adam_cannot_build(monkeypatch):
    ensure_deepspeed_env()  # this test patches DeepSpeed itself, so it imports deepspeed the way the library does
    import deepspeed.ops.adam.cpu_adam as cpu_adam

    class BrokenBuilder:
        def load(self):
            raise RuntimeError("Error building extension 'cpu_adam': g++ not found")

    monkeypatch.setattr(cpu_adam, "CPUAdamBuilder", BrokenBuilder)
    import cpuinfo

    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: {})  # its subprocess probing takes seconds
    model = build_model("tiny", vocab_size=256)
    with pytest.warns(CPUAdamUnavailableWarning, match="g\\+\\+ not found.*Falling back to torch.optim.AdamW"):
        opt = build_zero_optimizer(model, zero_cfg(stage=2, offload_optimizer=True), DistEnv())
    assert type(opt) is torch.optim.AdamW
    assert len(opt.param_groups) == 2  # same decay / no-decay groups as chapter 02


@pytest.mark.parametrize("fp16_supported", [False, True])
def test_fp16_without_accelerator_support_is_a_clear_config_error(monkeypatch, fp16_supported):
    """Whether this machine's CPU has fp16 kernels (DeepSpeed asks oneDNN) must not decide the outcome."""
    _check_precision_supported("bf16")   # sets DeepSpeed's environment and picks its accelerator, alone or not
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(get_accelerator(), "is_fp16_supported", lambda: fp16_supported)
    if fp16_supported:
        _check_precision_supported("fp16")
    else:
        with pytest.raises(ConfigError, match="use --precision bf16"):
            _check_precision_supported("fp16")


# ---------------------------------------------------------------------- formulas and estimators
def test_formulas_are_the_papers():
    psi, n = 1000, 4
    assert [formula_bytes(s, psi, n)["total"] for s in range(4)] == [16 * psi, 4 * psi + 12 * psi / n,
                                                                      2 * psi + 14 * psi / n, 16 * psi / n]


def test_deepspeed_estimators_are_what_we_explain():
    psi, largest, n = 1_000_000, 100_000, 4
    est = deepspeed_estimates(psi, largest, n)
    assert est["zero2"]["gpu"] == 2 * psi + 18 * psi // n
    assert est["zero3"]["gpu"] == 4 * largest + 18 * psi // n
    assert est["zero3+offload_opt+offload_param"]["gpu"] == 4 * largest


def test_guide_table_check_uses_the_dp_row_to_infer_activations():
    table = SEQGPT_GUIDE_TABLE
    assert (table.dp_gb, table.dp_batch, table.z3_gb, table.z3_batch, table.n_gpus) == (38.2, 12, 16.8, 24, 4)
    g = guide_plausibility(psi=500_000_000, largest_layer=1_000_000)
    assert g["dp_model_states_gb"] == pytest.approx(8.0)
    assert g["activation_gb_per_sample"] == pytest.approx((38.2 - 8.0) / 12)
    assert g["z3_predicted_gb"] == pytest.approx(2.0 + 24 * (38.2 - 8.0) / 12)
    assert g["z3_offload_predicted_gb"] == pytest.approx(0.004 + 24 * (38.2 - 8.0) / 12)


def test_guide_verdict_rejects_the_seqgpt_table_and_flips_for_a_consistent_one():
    seqgpt = check_guide_table()   # SeqGPT-560M's real Ψ and largest layer, counted on the meta device
    assert seqgpt["psi"] > 500_000_000 and not seqgpt["plausible"]
    assert seqgpt["z3_offload_predicted_gb"] > SEQGPT_GUIDE_TABLE.gpu_gb   # batch 24 cannot fit a 40 GB GPU
    assert seqgpt["verdict"].startswith("not plausible")
    # the same DP row, with a ZeRO-3 row that keeps the batch and claims what activations alone need: plausible
    same_batch = dataclasses.replace(SEQGPT_GUIDE_TABLE, z3_batch=12, z3_gb=30.0)
    g = guide_plausibility(seqgpt["psi"], seqgpt["largest_layer"], same_batch)
    assert g["plausible"] and g["verdict"].startswith("plausible")
    # ... and one that claims too little for that batch is not
    assert not guide_plausibility(seqgpt["psi"], seqgpt["largest_layer"],
                                  dataclasses.replace(same_batch, z3_gb=16.8))["plausible"]


def test_storage_counters_count_views_once_and_differ_only_on_padding():
    flat = torch.zeros(10)                      # one storage of 40 bytes, e.g. a padded flat buffer
    first, second = flat[:4], flat[4:8]         # two views covering 32 of its bytes
    assert unique_storage_bytes([first, second, flat]) == 40    # the whole storage, once
    assert tensor_bytes([first, second, first]) == 32           # the bytes the views cover, each view once
    assert unique_storage_bytes([torch.zeros(3, device="meta"), None]) == 0


def test_loss_difference_compares_the_steps_both_runs_logged():
    ref = [{"type": "train", "step": 1, "loss": 2.0}, {"type": "train", "step": 2, "loss": 1.0}, {"type": "eval"}]
    run = [{"type": "train", "step": 1, "loss": 2.0}, {"type": "train", "step": 2, "loss": 1.01}]
    assert max_relative_loss_difference(run, ref) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="no logged training step"):
        max_relative_loss_difference([], ref)


def test_stage_list_parsing():
    vs = parse_variants("ddp,1,3+opt+param@bf16")
    assert [(v.strategy, v.stage, v.offload_optimizer, v.offload_param, v.precision) for v in vs] == [
        ("ddp", 0, False, False, None), ("zero", 1, False, False, None), ("zero", 3, True, True, "bf16")]
    with pytest.raises(ConfigError, match="only ZeRO stage 3"):
        parse_variants("2+param")


def test_each_python_environment_gets_its_own_extension_build_folder(monkeypatch):
    """Two venvs sharing one TORCH_EXTENSIONS_DIR rebuild each other's DeepSpeed ops on every run."""
    monkeypatch.setattr(sys, "prefix", "/a/.venv")
    first = extensions_dir()
    monkeypatch.setattr(sys, "prefix", "/b/.venv")
    assert extensions_dir() != first and extensions_dir().parent == first.parent


def test_deepspeed_does_not_build_its_inference_only_shm_op_on_cpu():
    """Only DeepSpeed's inference all-reduce uses it, and its first build costs about a minute per environment."""
    ensure_deepspeed_env()
    import deepspeed.ops
    assert deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] is False


def test_prebuild_reports_a_failed_cpu_adam_build_instead_of_failing_the_install(monkeypatch, tmp_path):
    """make install builds CPU Adam once; without a compiler the install must go on (offload then falls back)."""
    ensure_deepspeed_env()
    from deepspeed.ops.op_builder import CPUAdamBuilder

    def broken(self, verbose=True):
        raise RuntimeError("Error building extension 'cpu_adam'\nninja: build stopped")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(CPUAdamBuilder, "load", broken)
    assert prebuild_cpu_adam() == "DeepSpeed CPU Adam: not built (RuntimeError: Error building extension 'cpu_adam')"
    monkeypatch.setattr(CPUAdamBuilder, "load", lambda self, verbose=True: None)
    assert prebuild_cpu_adam() == f"DeepSpeed CPU Adam: built (or already there) in {tmp_path}"


def test_a_restarted_attempt_resumes_from_its_own_newest_checkpoint_and_a_first_attempt_never(tmp_path, monkeypatch):
    from ecomkit.parallel.zero.checkpoint import restart_resume_dir

    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert restart_resume_dir(tmp_path) is None                      # a first attempt, nothing saved
    (tmp_path / "latest").write_text("step4")
    assert restart_resume_dir(tmp_path) is None                      # a first attempt: a rerun starts fresh
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restart_resume_dir(tmp_path) == str(tmp_path)             # torchrun restarted the workers
    assert restart_resume_dir(tmp_path, allowed=False) is None       # --no-fault-resume
    (tmp_path / "latest").unlink()
    assert restart_resume_dir(tmp_path) is None                      # died before the first save: from step 0
