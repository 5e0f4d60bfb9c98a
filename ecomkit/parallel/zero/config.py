"""DeepSpeed configs generated from :class:`~ecomkit.config.TrainConfig`, and checks of user-supplied ones.

Every value comes from the config the loop uses, so batch sizes, clipping and precision cannot drift from the launch
(tutorial JSONs' ``"auto"`` values only HF Trainer fills). A ``--zero-user-config`` is merged on top after its unknown,
removed and ``"auto"`` keys are refused.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import os
from pathlib import Path
from typing import Any

import torch

from ecomkit.config import TrainConfig, load_deepspeed_json
from ecomkit.errors import ConfigError
from ecomkit.models.bloom import PRESETS, preset_parameter_count
from ecomkit.parallel.zero.env import ensure_deepspeed_env

# Keys read outside ``DeepSpeedConfig._initialize_params`` (so the key recorder below misses them).
EXTRA_TOP_LEVEL_KEYS = frozenset({"sequence_parallel_size"})


def precision_section(precision: str) -> dict[str, Any]:
    """bf16 needs no loss scaling (fp32's exponent range); fp16 gets dynamic loss scaling."""
    if precision == "bf16":
        return {"bf16": {"enabled": True}}
    if precision == "fp16":
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                         "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}}
    return {}


def bucket_elements(cfg: TrainConfig, n_params: int | None) -> int:
    """``zero.bucket_size``, capped at the model size (DeepSpeed allocates the full bucket up front)."""
    if n_params is None:
        return cfg.zero.bucket_size
    return max(1, min(cfg.zero.bucket_size, n_params))


def zero_section(cfg: TrainConfig, pin_memory: bool, n_params: int | None = None) -> dict[str, Any]:
    """The ``zero_optimization`` block for stages 0-3 with optional CPU offload."""
    z = cfg.zero
    bucket = bucket_elements(cfg, n_params)
    section: dict[str, Any] = {
        "stage": z.stage,
        "overlap_comm": z.overlap_comm,
        "contiguous_gradients": z.contiguous_gradients,
        "reduce_bucket_size": bucket,
    }
    if z.stage in (1, 2):
        section.update({"allgather_bucket_size": bucket, "reduce_scatter": True})
    if z.stage == 3:
        section.update({
            # 0: even tiny tensors are partitioned (the 1e5 default keeps a toy model fully replicated)
            "stage3_param_persistence_threshold": z.param_persistence_threshold,
            "stage3_prefetch_bucket_size": bucket,
            "stage3_max_live_parameters": 1_000_000_000,
            "stage3_max_reuse_distance": 1_000_000_000,
            "stage3_gather_16bit_weights_on_model_save": True,
        })
    if z.offload_optimizer:
        section["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if z.offload_param:
        section["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}
    return section


def build_zero_config(cfg: TrainConfig, world_size: int, grad_accum: int,
                      n_params: int | None = None) -> dict[str, Any]:
    """The complete DeepSpeed config of a run: no ``"auto"``, batch sizes consistent by construction."""
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": cfg.micro_batch_size * grad_accum * world_size,
        "gradient_clipping": float(cfg.max_grad_norm),   # 0.0 disables clipping
        "zero_optimization": zero_section(cfg, pin_memory=torch.cuda.is_available(), n_params=n_params),
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000_000,                # ecomkit logs every step itself
        "wall_clock_breakdown": False,
        **precision_section(cfg.precision),
    }
    if cfg.zero.offload_optimizer:
        ds["zero_force_ds_cpu_optimizer"] = False
    if cfg.zero.activation_checkpointing:
        ds["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                          "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False}
    if cfg.zero.user_config:
        user = load_deepspeed_json(cfg.zero.user_config)
        validate_user_config(user, cfg.zero.user_config)
        ds = merge_configs(ds, user)
    return ds


def launch_world_size() -> int:
    """Processes of this launch: ``$WORLD_SIZE`` under torchrun or the deepspeed launcher, else 1."""
    return int(os.environ.get("WORLD_SIZE", 1))


def zero_config_for_launch(cfg: TrainConfig, world_size: int | None = None,
                           n_params: int | None = None) -> dict[str, Any]:
    """The DeepSpeed config this launch will use, built before any process group (``--print-ds-config``)."""
    world = world_size or launch_world_size()
    return build_zero_config(cfg, world, cfg.resolve_grad_accum(world), n_params=n_params)


def trainer_zero_config(cfg: TrainConfig) -> dict[str, Any]:
    """The DeepSpeed dict for ``TrainingArguments(deepspeed=...)``, saved as ``<output_dir>/ds_config.json``.

    Buckets are capped by the preset's Ψ, since Trainer builds the engine and there is no model to count here.
    """
    psi = preset_parameter_count(cfg.model) if cfg.model in PRESETS else None
    ds = zero_config_for_launch(cfg, n_params=psi)
    if int(os.environ.get("RANK", 0)) == 0:
        save_zero_config(ds, cfg.output_dir)
    return ds


# Keys HF Trainer fills in from its TrainingArguments when they say "auto".
TRAINER_AUTO_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping")
TRAINER_AUTO_ZERO_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size")


def trainer_auto_config(cfg: TrainConfig) -> dict[str, Any]:
    """The ``"auto"`` form for ``TrainingArguments(deepspeed=...)`` (``--print-ds-config --ds-for-trainer``).

    ``train_batch_size`` is left out: with it, ZeRO-3 under ``from_pretrained`` on CPU sees a world size of 1 and
    fails DeepSpeed's batch assertion.
    """
    ds = zero_config_for_launch(cfg, world_size=1)
    ds.pop("train_batch_size", None)
    for key in TRAINER_AUTO_KEYS:
        ds[key] = "auto"
    for key in TRAINER_AUTO_ZERO_KEYS:
        if key in ds["zero_optimization"]:
            ds["zero_optimization"][key] = "auto"
    for section in ("bf16", "fp16"):
        ds.pop(section, None)
        ds[section] = {"enabled": "auto"}
    return ds


def merge_configs(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: ``override`` wins, nested dicts are merged key by key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_configs(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def save_zero_config(ds: dict[str, Any], output_dir: str | os.PathLike) -> Path:
    """Write ``output_dir/ds_config.json`` (what the run used, reusable with the deepspeed launcher)."""
    path = Path(output_dir) / "ds_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ds, indent=2, sort_keys=True) + "\n")
    return path


def format_zero_config(ds: dict[str, Any]) -> str:
    return json.dumps(ds, indent=2, sort_keys=True)


@functools.lru_cache(maxsize=1)
def deepspeed_top_level_keys() -> frozenset[str]:
    """The top-level keys DeepSpeed reads, recorded by letting its own parser read a config.

    DeepSpeed ignores unknown top-level keys, so a typo like ``"gradient_clip"`` would train without clipping.
    """
    ensure_deepspeed_env()
    from deepspeed.runtime.config import DeepSpeedConfig  # lazy: heavy optional dependency

    seen: set[str] = set()

    class _KeysView:
        def __init__(self, d: dict):
            self.d = d

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return dict.__contains__(self.d, key)

        def __iter__(self):
            return iter(dict.keys(self.d))

    class _Recorder(dict):
        def get(self, key, default=None):
            seen.add(key)
            return super().get(key, default)

        def __getitem__(self, key):
            seen.add(key)
            return super().__getitem__(key)

        def __contains__(self, key):
            seen.add(key)
            return super().__contains__(key)

        def keys(self):
            return _KeysView(self)

    parser = object.__new__(DeepSpeedConfig)
    parser.world_size, parser.global_rank = 1, 0
    parser._initialize_params(_Recorder({"train_micro_batch_size_per_gpu": 1}))
    return frozenset(seen) | EXTRA_TOP_LEVEL_KEYS


@functools.lru_cache(maxsize=1)
def deepspeed_zero_keys() -> frozenset[str]:
    """Field names and aliases of DeepSpeed's ``zero_optimization`` model."""
    ensure_deepspeed_env()
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # lazy: heavy optional dependency

    names = set()
    for name, field in DeepSpeedZeroConfig.model_fields.items():
        names.add(name)
        if field.alias:
            names.add(field.alias)
    return frozenset(names)


def _unknown_key_message(source: str, where: str, key: str, known: frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return (f"DeepSpeed config '{source}': unknown {where} key '{key}'.{hint} DeepSpeed ignores (top level) or "
            f"rejects (zero_optimization) keys it does not read, so this setting would not do what you expect. "
            f"Fix or remove the key.")


def removed_key_message(user: dict[str, Any]) -> str | None:
    """DeepSpeed's own message for a key whose feature was removed (e.g. ``amp``, ``nebula``)."""
    ensure_deepspeed_env()
    from deepspeed.runtime import config as ds_config  # lazy: heavy optional dependency

    for key, message in getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}).items():
        if key in user:
            return f"'{key}': {message}"
    zero = user.get("zero_optimization")
    for key, message in getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {}).items():
        if isinstance(zero, dict) and key in zero:
            return f"'zero_optimization.{key}': {message}"
    return None


def validate_user_config(user: dict[str, Any], source: str) -> None:
    """Reject keys of removed features, unknown keys and ``"auto"`` values in a user's DeepSpeed JSON."""
    removed = removed_key_message(user)
    if removed:
        raise ConfigError(f"DeepSpeed config '{source}': {removed}")
    known = deepspeed_top_level_keys()
    for key in user:
        if key not in known:
            raise ConfigError(_unknown_key_message(source, "top-level", key, known))
    zero = user.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ConfigError(f"DeepSpeed config '{source}': 'zero_optimization' must be an object, not {zero!r}.")
    zero_known = deepspeed_zero_keys()
    for key in zero:
        if key not in zero_known:
            raise ConfigError(_unknown_key_message(source, "zero_optimization", key, zero_known))
    _reject_auto(user, source)


def _reject_auto(node: Any, source: str, path: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _reject_auto(v, source, f"{path}.{k}" if path else k)
    elif node == "auto":
        raise ConfigError(
            f"DeepSpeed config '{source}': '{path}' is \"auto\". Only Hugging Face Trainer fills in \"auto\" "
            "values; ecomkit computes every value from its own flags. Delete the key (ecomkit's generated value "
            "is used) or give a number.")
