"""Data for ecomkit: synthetic catalog, loaders with validation, task formats, tokenization, samplers.

Between a source and the sampler every table is a memory-mapped ``datasets`` Arrow table cached by content hash::

    from ecomkit.data import build_datasets, DistributedBatchSampler, lengths_array, pad_collate
    train_ds, eval_ds, eval_records, report = build_datasets(
        "reviews.csv", seed=0, task="nlu", tokenizer=tok, max_length=256,
        column_map={"cat": "category", "label": "sentiment", "review": "review"},
        label_map={"sentiment": {"0": "negative", "1": "positive"}})
    sampler = DistributedBatchSampler(lengths_array(train_ds), micro_batch_size=8, grad_accum=2,
                                      num_replicas=world_size, rank=rank, seed=0)
"""

from typing import Any

from ecomkit.data.arrow import data_cache_dir
from ecomkit.data.build import BuildReport, build_datasets, stratified_split
from ecomkit.data.catalog import CATEGORIES, CATEGORY_ENGLISH, generate_catalog, generate_catalog_chunks
from ecomkit.data.formats import (
    KIND_CLASSIFY,
    KIND_EXTRACT,
    PROMPT_FORMATS,
    ParsedAnswer,
    TaskExample,
    build_prompt,
    format_answer,
    parse_answer,
    prompt_and_answer,
)
from ecomkit.data.stream import lengths_array, map_batches, read_columns
from ecomkit.data.sampler import DistributedBatchSampler, plan_global_batches
from ecomkit.data.tasks import (
    CATEGORY_LABELS,
    CLASSIFICATION_TASKS,
    KINDS,
    NLU_TASKS,
    SENTIMENT_LABELS,
    TASKS,
    ClassificationExample,
    NluExample,
    build_classification_example,
    build_nlu_examples,
    can_classify,
    category_labels_for,
    format_lm_text,
    labels_from_values,
)
from ecomkit.data.tokenize import IGNORE_INDEX, encode_prompt_answer, pad_collate, tokenize_records
from ecomkit.data.validate import REASONS, ValidationIssue, ValidationReport, check_label_map

# What a run on the catalog does not use, imported when first asked for (PEP 562).
LAZY = {**dict.fromkeys(("LoadResult", "load_records"), "ecomkit.data.loaders"),
        **dict.fromkeys(("write_csv", "write_hf_dataset", "write_jsonl"), "ecomkit.data.writers"),
        **dict.fromkeys(("PaddingComparison", "compare_padding", "epoch_micro_batches", "padding_rate"),
                        "ecomkit.data.padding")}


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(__import__(LAZY[name], fromlist=[name]), name)
    raise AttributeError(f"module 'ecomkit.data' has no attribute {name!r}")


__all__ = [
    "data_cache_dir", "lengths_array", "map_batches", "read_columns", "BuildReport", "build_datasets", "stratified_split", "CATEGORIES",
    "CATEGORY_ENGLISH", "generate_catalog", "generate_catalog_chunks", "LoadResult", "load_records", "write_csv",
    "write_hf_dataset", "write_jsonl", "PaddingComparison", "compare_padding", "epoch_micro_batches",
    "padding_rate", "DistributedBatchSampler", "plan_global_batches", "CATEGORY_LABELS", "CLASSIFICATION_TASKS",
    "KINDS", "NLU_TASKS", "SENTIMENT_LABELS", "TASKS", "ClassificationExample", "NluExample",
    "build_classification_example", "build_nlu_examples", "can_classify", "category_labels_for", "format_lm_text",
    "labels_from_values", "IGNORE_INDEX", "encode_prompt_answer", "pad_collate", "tokenize_records", "REASONS",
    "ValidationIssue", "ValidationReport", "check_label_map", "KIND_CLASSIFY", "KIND_EXTRACT", "PROMPT_FORMATS",
    "ParsedAnswer", "TaskExample", "build_prompt", "format_answer", "parse_answer", "prompt_and_answer",
]
