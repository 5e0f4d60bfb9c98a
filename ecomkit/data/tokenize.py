"""Records to token ids: ``input_ids``, ``labels`` (-100 = no loss) and ``length``, plus the padding collator.

Why ``labels`` are stored rather than derived in the training loop: the loss
mask differs per task (every token for ``lm``, only the answer for ``nlu``), and
storing it keeps the training loop task-agnostic: it always computes the
shifted cross-entropy over positions whose label is not -100.

When every record has a ``sentiment``, a ``polarity`` column (+1 positive,
0 neutral, -1 negative, from the source record) is kept as well, and
:func:`pad_collate` passes it on as a tensor: the training loop's
sentiment-adaptive clipping policy reads it per batch.

No BOS is prepended (BLOOM's own tokenizer does not add one either); an EOS is
appended so the model learns where a record, or an answer, ends.
"""

from __future__ import annotations

import functools
import os
from typing import Sequence

import torch
from datasets import Dataset

from ecomkit.data.tasks import (
    CATEGORY_LABELS,
    SENTIMENT_POLARITY,
    build_nlu_examples,
    check_task,
    format_lm_text,
)
from ecomkit.errors import ConfigError

IGNORE_INDEX = -100
MIN_MAX_LENGTH = 16
_PROMPT_TAIL = 8  # prompt tokens kept at the end when a prompt is truncated (the "答:" cue)


def _eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise ConfigError("The tokenizer has no EOS token; set tokenizer.eos_token (e.g. '</s>') before "
                          "tokenizing, so sequences can be terminated.")
    return tokenizer.eos_token_id


def encode_lm_ids(ids: list[int], eos_id: int, max_length: int) -> tuple[list[int], list[int]]:
    """Truncate to ``max_length - 1`` ids, append EOS; labels equal the inputs."""
    input_ids = ids[: max_length - 1] + [eos_id]
    return input_ids, list(input_ids)


def encode_prompt_answer_ids(prompt: list[int], answer: list[int], eos_id: int,
                             max_length: int) -> tuple[list[int], list[int]]:
    """Concatenate prompt + answer + EOS; labels are -100 on the prompt.

    If too long, the answer is kept whole and the prompt loses tokens from its
    *middle*: its head carries the instruction and its last tokens the answer
    cue, both more important than the end of a long review.
    """
    answer = answer[: max_length - 2] + [eos_id]
    budget = max_length - len(answer)
    if len(prompt) > budget:
        tail = min(_PROMPT_TAIL, budget // 2)
        prompt = prompt[: budget - tail] + (prompt[-tail:] if tail else [])
    return prompt + answer, [IGNORE_INDEX] * len(prompt) + answer


def encode_prompt_answer(tokenizer, prompt: str, answer: str, max_length: int) -> tuple[list[int], list[int]]:
    """Token ids and labels for one (prompt, answer) pair, exactly as in training.

    Use it to score classification candidates: the candidate's log-probability
    is the sum over positions whose label is not -100 (answer tokens and EOS).
    """
    ids = tokenizer([prompt, answer], add_special_tokens=False)["input_ids"]
    return encode_prompt_answer_ids(ids[0], ids[1], _eos_id(tokenizer), max_length)


def _tokenize_lm_batch(batch: dict, tokenizer, max_length: int) -> dict:
    eos = _eos_id(tokenizer)
    encoded = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
    pairs = [encode_lm_ids(ids, eos, max_length) for ids in encoded]
    return _columns(pairs)


def _tokenize_nlu_batch(batch: dict, tokenizer, max_length: int) -> dict:
    eos = _eos_id(tokenizer)
    prompts = tokenizer(batch["prompt"], add_special_tokens=False)["input_ids"]
    answers = tokenizer(batch["answer"], add_special_tokens=False)["input_ids"]
    pairs = [encode_prompt_answer_ids(p, a, eos, max_length) for p, a in zip(prompts, answers)]
    return _columns(pairs)


def _columns(pairs: list[tuple[list[int], list[int]]]) -> dict:
    return {"input_ids": [p[0] for p in pairs], "labels": [p[1] for p in pairs],
            "length": [len(p[0]) for p in pairs]}


def task_table(records: Sequence[dict], task: str, category_labels: Sequence[str] = CATEGORY_LABELS) -> dict:
    """The untokenized columns: ``text`` for ``lm``; ``task``, ``prompt``, ``answer`` for ``nlu``.

    Plus ``polarity`` (one per row, from the source record) when every record has a sentiment.
    """
    with_polarity = bool(records) and all(r.get("sentiment") in SENTIMENT_POLARITY for r in records)
    if check_task(task) == "lm":
        table = {"text": [format_lm_text(r) for r in records]}
        sources = records
    else:
        pairs = [(r, ex) for r in records for ex in build_nlu_examples(r, category_labels)]
        table = {"task": [e.task for _, e in pairs], "prompt": [e.prompt for _, e in pairs],
                 "answer": [e.answer for _, e in pairs]}
        sources = [r for r, _ in pairs]
    if with_polarity:
        table["polarity"] = [SENTIMENT_POLARITY[r["sentiment"]] for r in sources]
    return table


def tokenize_records(records: Sequence[dict], tokenizer, task: str, max_length: int, num_proc: int = 1,
                     category_labels: Sequence[str] | None = None):
    """Tokenize records into a ``datasets.Dataset`` with ``input_ids``, ``labels``, ``length``.

    A ``polarity`` column is added when every record has a sentiment (see the
    module docstring). ``nlu`` produces several rows per record (see
    ``build_nlu_examples``).
    ``num_proc > 1`` tokenizes in worker processes with ``datasets.map``; the
    tokenizer's own Rust thread pool is then switched off
    (``TOKENIZERS_PARALLELISM=false``) to avoid oversubscribing the cores.
    """
    if max_length < MIN_MAX_LENGTH:
        raise ConfigError(f"max_length={max_length} is too short; use at least {MIN_MAX_LENGTH} (256 fits "
                          f"most catalog rows).")
    if num_proc < 1:
        raise ConfigError(f"num_proc must be >= 1, got {num_proc}.")
    _eos_id(tokenizer)
    table = task_table(records, task, category_labels or CATEGORY_LABELS)
    raw = Dataset.from_dict(table)
    n_proc = min(num_proc, max(1, len(raw)))
    if n_proc > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    fn = _tokenize_lm_batch if task == "lm" else _tokenize_nlu_batch
    text_columns = [c for c in raw.column_names if c != "polarity"]
    tokenized = raw.map(functools.partial(fn, tokenizer=tokenizer, max_length=max_length), batched=True,
                        batch_size=1000, num_proc=n_proc if n_proc > 1 else None, remove_columns=text_columns)
    order = [c for c in ("input_ids", "labels", "length", "polarity") if c in tokenized.column_names]
    return tokenized.select_columns(order)


def pad_collate(features: Sequence[dict], pad_id: int, pad_to_multiple_of: int | None = None) -> dict:
    """Right-pad a list of examples to the longest one: ``input_ids``, ``attention_mask``, ``labels`` tensors.

    ``labels`` are padded with -100 so pad positions never enter the loss.
    A ``polarity`` value per example, if present, is returned as a 1-D tensor.
    Use as ``collate_fn=functools.partial(pad_collate, pad_id=tokenizer.pad_token_id)``.
    """
    if not features:
        raise ValueError("pad_collate got an empty batch")
    longest = max(len(f["input_ids"]) for f in features)
    if pad_to_multiple_of:
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((len(features), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(features), longest), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(features), longest), dtype=torch.long)
    for row, feature in enumerate(features):
        n = len(feature["input_ids"])
        input_ids[row, :n] = torch.as_tensor(feature["input_ids"], dtype=torch.long)
        labels[row, :n] = torch.as_tensor(feature.get("labels", feature["input_ids"]), dtype=torch.long)
        attention_mask[row, :n] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    if "polarity" in features[0]:
        batch["polarity"] = torch.tensor([f["polarity"] for f in features], dtype=torch.long)
    return batch
