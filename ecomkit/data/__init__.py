"""Data for ecomkit: synthetic catalog, loaders with validation, task formats, tokenization, samplers.

Each name loads its module when first asked for (PEP 562), so a run loads only the data code it uses.
"""

from typing import Any

from ecomkit import find

_HOMES: dict[str, tuple[str, ...]] = {
    "build": ("BuildReport", "ValidationIssue", "ValidationReport", "build_datasets", "stratified_split"),
    "catalog": ("CATEGORIES", "CATEGORY_ENGLISH", "generate_catalog", "generate_catalog_chunks"),
    "formats": ("KIND_CLASSIFY", "KIND_EXTRACT", "PROMPT_FORMATS", "ParsedAnswer", "TaskExample", "build_prompt",
                "format_answer", "parse_answer", "prompt_and_answer"),
    "loaders": ("LoadResult", "load_records"),
    "padding": ("PaddingComparison", "compare_padding", "epoch_micro_batches", "padding_rate"),
    "prompt_ids": ("encode_prompt_answer",),
    "sampler": ("DistributedBatchSampler", "plan_global_batches"),
    "stream": ("data_cache_dir", "lengths_array", "map_batches", "read_columns"),
    "tasks": ("CATEGORY_LABELS", "CLASSIFICATION_TASKS", "KINDS", "NLU_TASKS", "SENTIMENT_LABELS", "TASKS",
              "NluExample", "build_nlu_examples", "can_classify", "category_labels_for", "format_lm_text",
              "labels_from_values"),
    "targets": ("ClassificationExample", "build_classification_example"),
    "tokenize": ("IGNORE_INDEX", "pad_collate", "tokenize_records"),
    "validate": ("REASONS", "check_label_map"),
    "writers": ("write_csv", "write_hf_dataset", "write_jsonl"),
}
HOME_OF: dict[str, str] = {name: f"ecomkit.data.{module}" for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in HOME_OF:
        return find(f"{HOME_OF[name]}:{name}")
    raise AttributeError(f"module 'ecomkit.data' has no attribute {name!r}")


__all__ = list(HOME_OF)
