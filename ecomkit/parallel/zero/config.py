"""DeepSpeed configs generated from :class:`~ecomkit.config.TrainConfig`, and checks of user-supplied ones.

Why generate: the DeepSpeed JSON files passed around in tutorials (the
SeqGPT guide's included) are full of ``"auto"`` placeholders that only Hugging
Face's Trainer knows how to fill in, and whose batch sizes silently disagree
with the launch command. Here every value is computed from the same
``TrainConfig`` the training loop uses, so batch arithmetic
(``train_batch_size = micro_batch × grad_accum × world_size``), clipping,
precision and bucket sizes cannot drift apart. The result is a plain dict:
saved next to each run as ``ds_config.json``, printable with
``--print-ds-config``, and accepted as is by ``deepspeed.initialize`` and by
``TrainingArguments(deepspeed=...)``.

A user JSON (``--zero-user-config``) is merged on top after validation:
unknown top-level or ``zero_optimization`` keys (compared with the keys
DeepSpeed itself reads) and batch sizes that disagree with the run fail with a
:class:`~ecomkit.errors.ConfigError` instead of being ignored.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import os
from pathlib import Path
from typing import Any

from ecomkit.config import TrainConfig
from ecomkit.errors import ConfigError

# Keys read outside ``DeepSpeedConfig._initialize_params`` (so the key recorder below misses them).
EXTRA_TOP_LEVEL_KEYS = frozenset({"sequence_parallel_size"})
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def ensure_deepspeed_env() -> None:
    """Environment DeepSpeed reads at import time; call before the first ``import deepspeed``.

    - ``DS_ACCELERATOR=cpu`` without a GPU: otherwise DeepSpeed probes for CUDA
      and fails; with it, its communication falls back to gloo when oneCCL is absent.
    - ``TORCH_EXTENSIONS_DIR``: where the JIT-built CPU Adam is cached (the
      first build takes ~50 s; every later run reuses it).
    """
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # per user, not per checkout: every clone (and CI on this machine) reuses one build
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "ecomkit" / "torch_extensions"))


# ---------------------------------------------------------------------- generation
def precision_section(precision: str) -> dict[str, Any]:
    """bf16 needs no loss scaling (fp32's exponent range); fp16 gets dynamic loss scaling."""
    if precision == "bf16":
        return {"bf16": {"enabled": True}}
    if precision == "fp16":
        # loss_scale 0 = dynamic; start at 2^16, halve on overflow, double after 1000 clean steps
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                         "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}}
    return {}  # fp32: DeepSpeed still keeps an fp32 master partition inside the ZeRO optimizer


def bucket_elements(cfg: TrainConfig, n_params: int | None) -> int:
    """``zero.bucket_size``, capped at the model size.

    DeepSpeed allocates its reduce bucket at full size up front (ZeRO-3: an
    fp32 buffer of ``reduce_bucket_size`` elements, 200 MB for 5e7), so a
    bucket larger than the model only wastes memory: one bucket already holds
    every gradient.
    """
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
    """The complete DeepSpeed config of a run: no ``"auto"``, batch sizes consistent by construction.

    ``n_params`` (Ψ, when known) caps the bucket sizes at the model size.
    """
    import torch

    validate_zero_options(cfg)
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": cfg.micro_batch_size * grad_accum * world_size,
        "gradient_clipping": float(cfg.max_grad_norm),   # 0.0 disables clipping
        "zero_optimization": zero_section(cfg, pin_memory=torch.cuda.is_available(), n_params=n_params),
        # the optimizer is built by ecomkit (torch AdamW or DeepSpeedCPUAdam) and passed in
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000_000,                # ecomkit logs every step itself
        "wall_clock_breakdown": False,
        **precision_section(cfg.precision),
    }
    if cfg.zero.offload_optimizer:
        # lets a torch optimizer run on the offloaded partitions when CPU Adam cannot be built
        ds["zero_force_ds_cpu_optimizer"] = False
    if cfg.zero.activation_checkpointing:
        # configures deepspeed.checkpointing, which ZeroStrategy hands to the model's checkpointed blocks
        ds["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                          "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False}
    if cfg.zero.user_config:
        user = load_user_config(cfg.zero.user_config)
        validate_user_config(user, ds, cfg.zero.user_config)
        ds = merge_configs(ds, user)
    return ds


def validate_zero_options(cfg: TrainConfig) -> None:
    """Combinations DeepSpeed would reject late (after start-up) or silently ignore."""
    z = cfg.zero
    if z.stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero.stage={z.stage} must be 0, 1, 2 or 3 (--zero-stage).")
    if z.offload_param and z.stage != 3:
        raise ConfigError(
            f"--zero-offload-param needs ZeRO stage 3 (got --zero-stage {z.stage}): only stage 3 partitions the "
            "parameters, so only it can keep them on the CPU between uses. Use --zero-stage 3, or drop "
            "--zero-offload-param (--zero-offload-optimizer works with stages 1-3).")
    if z.offload_optimizer and z.stage == 0:
        raise ConfigError("--zero-offload-optimizer needs ZeRO stage 1, 2 or 3 (got --zero-stage 0).")
    if z.bucket_size <= 0:
        raise ConfigError(f"zero.bucket_size={z.bucket_size} must be > 0 (elements per bucket).")
    if z.param_persistence_threshold < 0:
        raise ConfigError(f"zero.param_persistence_threshold={z.param_persistence_threshold} must be >= 0.")


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


# ---------------------------------------------------------------------- validation
def load_user_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read a DeepSpeed JSON; errors name the file, line and column."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"DeepSpeed config '{path}' (--zero-user-config) does not exist. Pass the path of a "
                          "JSON file, or omit the flag to use the config ecomkit generates.")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"DeepSpeed config '{path}', line {exc.lineno}, column {exc.colno}: not valid JSON "
                          f"({exc.msg}). Fix the file; note that JSON allows no comments or trailing commas.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"DeepSpeed config '{path}' must hold a JSON object, not {type(data).__name__}.")
    return data


@functools.lru_cache(maxsize=1)
def deepspeed_top_level_keys() -> frozenset[str]:
    """The top-level keys DeepSpeed reads, recorded by letting its own parser read a config.

    DeepSpeed ignores top-level keys it does not know, so a typo such as
    ``"gradient_clip"`` silently trains without clipping. Rather than a
    hand-kept list that goes stale with each release, we parse an empty config
    with ``DeepSpeedConfig._initialize_params`` through a dict that records
    every key looked up.
    """
    ensure_deepspeed_env()
    from deepspeed.runtime.config import DeepSpeedConfig

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
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

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
    from deepspeed.runtime import config as ds_config

    for key, message in getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}).items():
        if key in user:
            return f"'{key}': {message}"
    zero = user.get("zero_optimization")
    for key, message in getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {}).items():
        if isinstance(zero, dict) and key in zero:
            return f"'zero_optimization.{key}': {message}"
    return None


def validate_user_config(user: dict[str, Any], generated: dict[str, Any], source: str) -> None:
    """Reject unknown keys, ``"auto"`` values and batch sizes that disagree with the run."""
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
    _check_batch_sizes(user, generated, source)


def _reject_auto(node: Any, source: str, path: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _reject_auto(v, source, f"{path}.{k}" if path else k)
    elif node == "auto":
        raise ConfigError(
            f"DeepSpeed config '{source}': '{path}' is \"auto\". Only Hugging Face Trainer fills in \"auto\" "
            "values; ecomkit computes every value from its own flags. Delete the key (ecomkit's generated value "
            "is used) or give a number.")


def _check_batch_sizes(user: dict[str, Any], generated: dict[str, Any], source: str) -> None:
    """Each batch key the user sets must equal what this launch computes (``train = micro × accum × world``)."""
    for key in BATCH_KEYS:
        if key in user and user[key] != generated[key]:
            g = generated
            world = g["train_batch_size"] // (g["train_micro_batch_size_per_gpu"] * g["gradient_accumulation_steps"])
            raise ConfigError(
                f"DeepSpeed config '{source}': {key}={user[key]!r} disagrees with this run, which has "
                f"train_micro_batch_size_per_gpu={g['train_micro_batch_size_per_gpu']} (--micro-batch-size) × "
                f"gradient_accumulation_steps={g['gradient_accumulation_steps']} (--grad-accum / "
                f"--global-batch-size) × {world} processes = train_batch_size={g['train_batch_size']}. Remove the "
                "batch keys from the JSON (ecomkit fills them in) or change the flags to match.")
