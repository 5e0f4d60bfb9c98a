"""Data for ecomkit: synthetic catalog, loaders with validation, task formats, tokenization, samplers.

Typical use::

    from ecomkit.data import build_datasets, DistributedBatchSampler, pad_collate
    train_ds, eval_ds, eval_records, report = build_datasets(
        "synthetic", n_rows=2000, seed=0, task="lm", tokenizer=tok, max_length=256)
    sampler = DistributedBatchSampler(train_ds["length"], micro_batch_size=8, grad_accum=2,
                                      num_replicas=world_size, rank=rank, seed=0)
"""

from ecomkit.data.build import BuildReport, build_datasets
from ecomkit.data.catalog import CATEGORIES, CATEGORY_ENGLISH, generate_catalog
from ecomkit.data.loaders import LoadResult, load_records, write_csv, write_hf_dataset, write_jsonl
from ecomkit.data.padding import PaddingComparison, compare_padding, epoch_micro_batches, padding_rate
from ecomkit.data.sampler import DistributedBatchSampler, plan_global_batches
from ecomkit.data.tasks import (
    CATEGORY_LABELS,
    CLASSIFICATION_TASKS,
    NLU_TASKS,
    SENTIMENT_LABELS,
    TASKS,
    ClassificationExample,
    NluExample,
    build_classification_example,
    build_nlu_examples,
    category_labels_for,
    format_lm_text,
    required_fields_for_task,
)
from ecomkit.data.tokenize import IGNORE_INDEX, encode_prompt_answer, pad_collate, tokenize_records
from ecomkit.data.validate import REASONS, ValidationIssue, ValidationReport

__all__ = [
    "BuildReport", "build_datasets", "CATEGORIES", "CATEGORY_ENGLISH", "generate_catalog", "LoadResult",
    "load_records", "write_csv", "write_hf_dataset", "write_jsonl", "PaddingComparison", "compare_padding",
    "epoch_micro_batches", "padding_rate", "DistributedBatchSampler", "plan_global_batches", "CATEGORY_LABELS",
    "CLASSIFICATION_TASKS", "NLU_TASKS", "SENTIMENT_LABELS", "TASKS", "ClassificationExample", "NluExample",
    "build_classification_example", "build_nlu_examples", "category_labels_for", "format_lm_text",
    "required_fields_for_task", "IGNORE_INDEX", "encode_prompt_answer", "pad_collate", "tokenize_records",
    "REASONS", "ValidationIssue", "ValidationReport",
]
