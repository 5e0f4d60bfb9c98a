"""The one training configuration: ``vocabulary`` (the allowed words), ``schema`` (:class:`TrainConfig` and presets),
``validate`` and ``validate_options`` (every check), ``cli`` (flags, their help and ``--config`` files) and
``recipe`` (the ``auto`` defaults)."""

from ecomkit.config.cli import (PARALLEL_FLAG_ALIASES, apply_overrides, build_arg_parser, expand_aliases,
                                load_config_file, parse_config)
from ecomkit.config.schema import (CONFIG_PRESETS, CompressionConfig, FaultConfig, ParallelConfig, TrainConfig,
                                   ZeroConfig, preset_ddp_tiny, preset_ecomgpt_7b, preset_nlu_tiny,
                                   preset_seqgpt_560m, preset_small, preset_zero3_tiny)
from ecomkit.config.validate import (data_parallel_size, dcp_unsupported_reason, load_deepspeed_json,
                                     parse_report_to, parse_signal_names, resolve_parallel_degrees)
from ecomkit.config.vocabulary import (ATTN_IMPLS, CLIP_POLICIES, COMPRESSIONS, DEEPSPEED_PLAN_STRATEGIES,
                                       HOOK_STRATEGIES, MESH_STRATEGIES, PLAN_STRATEGIES, PLAN_STRATEGY_ALIASES,
                                       PP_BALANCES, PP_SCHEDULES, PRECISIONS, STRATEGIES, TASKS, StrategyName,
                                       parse_plan_strategy, plan_strategy_name)

__all__ = [
    "ATTN_IMPLS", "CLIP_POLICIES", "COMPRESSIONS", "CONFIG_PRESETS", "CompressionConfig", "DEEPSPEED_PLAN_STRATEGIES",
    "FaultConfig", "HOOK_STRATEGIES", "MESH_STRATEGIES", "PARALLEL_FLAG_ALIASES", "PLAN_STRATEGIES",
    "PLAN_STRATEGY_ALIASES", "PP_BALANCES", "PP_SCHEDULES", "PRECISIONS", "ParallelConfig", "STRATEGIES", "StrategyName", "TASKS",
    "TrainConfig", "ZeroConfig", "apply_overrides", "build_arg_parser", "data_parallel_size",
    "dcp_unsupported_reason", "expand_aliases", "load_config_file", "load_deepspeed_json", "parse_config",
    "parse_plan_strategy", "parse_report_to", "parse_signal_names", "plan_strategy_name", "preset_ddp_tiny", "preset_ecomgpt_7b",
    "preset_nlu_tiny",
    "preset_seqgpt_560m", "preset_small", "preset_zero3_tiny", "resolve_parallel_degrees",
]
