"""The one training configuration: dataclasses and presets, the strategy vocabulary, validation, and the CLI.

``ecomkit.config`` is the import path; the package is split by concern:

- :mod:`~ecomkit.config.vocabulary`: :class:`StrategyName` and the other allowed words;
- :mod:`~ecomkit.config.schema`: :class:`TrainConfig` and its parts, and the named presets;
- :mod:`~ecomkit.config.validate`: every check, run by :meth:`TrainConfig.validate`
  before any process group exists;
- :mod:`~ecomkit.config.cli`: flags derived from the fields, ``--config`` files, :func:`parse_config`;
- :mod:`~ecomkit.config.recipe`: the ``auto`` lr, warm-up, length, batch and evaluation interval, chosen by what
  is trained and on what data (resolved by the training loop, printed with their reasons).
"""

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
