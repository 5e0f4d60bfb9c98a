"""Records to token ids: ``input_ids``, ``labels`` (-100 = no loss) and ``length``, plus the padding collator.

Why ``labels`` are stored rather than derived in the training loop: the loss
mask differs per example kind (every token for ``lm``, only the answer for
NLU and instruction examples), and storing it keeps the training loop
task-agnostic: it always computes the shifted cross-entropy over positions
whose label is not -100.

Tokenisation is one batched map over the record table (records → examples →
ids, ``num_proc`` workers; :func:`~ecomkit.data.stream.map_batches`). A table
on disk is read batch by batch with plain reads, not through its memory map,
so tokenising 10 M rows does not fill the resident set with the source's
pages. The result is written to the data cache, memory-mapped, and named by a
hash of the records, the tokenizer, the task, the labels and ``max_length``,
so a second run maps it instead of tokenising again. A ``kind`` column (the index into
:data:`~ecomkit.data.tasks.KINDS`) lets the build report count examples per kind,
and a ``record`` column (the source record's row) lets it split examples by record.

When every record has a sentiment among positive/neutral/negative, a
``polarity`` column (+1, 0, -1, from the source record) is kept as well, and
:func:`pad_collate` passes it on as a tensor: the training loop's
sentiment-adaptive clipping policy reads it per batch.

No BOS is prepended (BLOOM's own tokenizer does not add one either); an EOS is
appended so the model learns where a record, or an answer, ends.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch
from datasets import Dataset, Features, Sequence as ArrowList, Value

from ecomkit.data.arrow import fingerprint, tokenizer_digest
from ecomkit.data.formats import check_format, prompt_tail
from ecomkit.data.loaders import RECORD_FEATURES
from ecomkit.data.stream import map_batches, unique_values
from ecomkit.data.tasks import CATEGORY_LABELS, KINDS, SENTIMENT_POLARITY, check_task, task_examples
from ecomkit.data.validate import RECORD_FIELDS
from ecomkit.errors import ConfigError

IGNORE_INDEX = -100
MIN_MAX_LENGTH = 16
_PROMPT_TAIL = 8  # prompt tokens kept at the end when a prompt is truncated (the "答:" cue)
_IDS = ArrowList(Value("int32"))


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
                             max_length: int, tail: int = _PROMPT_TAIL) -> tuple[list[int], list[int]]:
    """Concatenate prompt + answer + EOS; labels are -100 on the prompt.

    If too long, the answer is kept whole and the prompt loses tokens from its
    *middle*: its head carries the instruction and its last ``tail`` tokens the
    answer cue (in the ``seqgpt`` format also the label line:
    :func:`~ecomkit.data.formats.prompt_tail`), both more important than the
    end of a long review.
    """
    answer = answer[: max_length - 2] + [eos_id]
    prompt = truncate_prompt_ids(prompt, max_length - len(answer), tail)
    return prompt + answer, [IGNORE_INDEX] * len(prompt) + answer


def truncate_prompt_ids(prompt: list[int], budget: int, tail: int = _PROMPT_TAIL) -> list[int]:
    """``prompt`` cut to ``budget`` ids by dropping its middle, its last ``tail`` ids kept (see above).

    Generation uses it too, so a prompt is cut the same way in training and in decoding.
    """
    if len(prompt) <= budget:
        return prompt
    if tail <= _PROMPT_TAIL:
        keep = min(tail, budget // 2)
    else:   # a long tail (a label line) keeps it, and at least a few ids of the head
        keep = min(tail, budget - min(_PROMPT_TAIL, budget // 2))
    return prompt[: budget - keep] + (prompt[-keep:] if keep else [])


def tail_length(tokenizer, prompt: str) -> int:
    """How many ids at the end of ``prompt`` truncation keeps: its :func:`prompt_tail`, at least the default."""
    tail = prompt_tail(prompt)
    return max(_PROMPT_TAIL, len(tokenizer(tail, add_special_tokens=False)["input_ids"])) if tail else _PROMPT_TAIL


def encode_prompt_answer(tokenizer, prompt: str, answer: str, max_length: int) -> tuple[list[int], list[int]]:
    """Token ids and labels for one (prompt, answer) pair, exactly as in training.

    Use it to score classification candidates: the candidate's log-probability
    is the sum over positions whose label is not -100 (answer tokens and EOS).
    """
    ids = tokenizer([prompt, answer], add_special_tokens=False)["input_ids"]
    return encode_prompt_answer_ids(ids[0], ids[1], _eos_id(tokenizer), max_length, tail_length(tokenizer, prompt))


def _tokenize_batch(batch: dict[str, list], indices: list[int], tokenizer, task: str,
                    labels: Mapping[str, Sequence[str]], max_length: int, with_polarity: bool,
                    prompt_format: str = "ecomkit") -> dict[str, list]:
    """Records → examples → ids for one batch; a record gives 0..4 rows (see ``tasks.task_examples``)."""
    kinds, records, prompts, answers, polarity = [], [], [], [], []
    for i, index in enumerate(indices):
        record = {name: batch[name][i] for name in batch}
        for ex in task_examples(record, task, labels, prompt_format):
            kinds.append(KINDS.index(ex.task))
            records.append(index)
            prompts.append(ex.prompt)
            answers.append(ex.answer)
            if with_polarity:
                polarity.append(SENTIMENT_POLARITY[record["sentiment"]])
    eos = _eos_id(tokenizer)
    answer_ids = tokenizer(answers, add_special_tokens=False)["input_ids"] if answers else []
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"] if any(prompts) else [[]] * len(prompts)
    tails = [prompt_tail(p) for p in prompts]
    tail_ids = tokenizer(tails, add_special_tokens=False)["input_ids"] if any(tails) else [[]] * len(prompts)
    tail_lengths = [max(_PROMPT_TAIL, len(t)) if tail else _PROMPT_TAIL for t, tail in zip(tail_ids, tails)]
    pairs = [encode_lm_ids(a, eos, max_length) if not p else encode_prompt_answer_ids(p, a, eos, max_length, n)
             for p, a, n in zip(prompt_ids, answer_ids, tail_lengths)]
    out = {"input_ids": [p[0] for p in pairs], "labels": [p[1] for p in pairs],
           "length": [len(p[0]) for p in pairs], "kind": kinds, "record": records}
    if with_polarity:
        out["polarity"] = polarity
    return out


def as_record_table(records: Sequence[Mapping[str, Any]] | Dataset) -> Dataset:
    """A record table (:data:`RECORD_FIELDS` columns) from a Dataset as is, or from a list of dicts (in memory)."""
    if isinstance(records, Dataset):
        return records
    columns = {name: [r.get(name) for r in records] for name in RECORD_FIELDS}
    return Dataset.from_dict(columns, features=RECORD_FEATURES)


def has_polarity(records: Dataset) -> bool:
    """Every record has a sentiment the clipping policy knows (positive/neutral/negative)."""
    if len(records) == 0:
        return False
    return set(unique_values(records, "sentiment")) <= set(SENTIMENT_POLARITY)


def tokenize_records(records: Sequence[Mapping[str, Any]] | Dataset, tokenizer, task: str, max_length: int,
                     num_proc: int = 1, category_labels: Sequence[str] | None = None,
                     labels: Mapping[str, Sequence[str]] | None = None, keep_kind: bool = False,
                     prompt_format: str = "ecomkit") -> Dataset:
    """Tokenize records (a list of dicts, or a record table) into ``input_ids``, ``labels``, ``length``.

    A ``polarity`` column is added when every record has a sentiment (see the
    module docstring); ``keep_kind`` keeps the ``kind`` column and ``record``
    (the index of each example's source record in ``records``). ``nlu``
    produces several rows per record (see ``tasks.build_nlu_examples``).
    ``labels``: candidate labels per classification target (default: the
    built-in ones; ``category_labels`` sets the category candidates alone) and
    the extraction label set (``labels["extract"]``). ``prompt_format``: how NLU
    examples are laid out (:mod:`ecomkit.data.formats`; ``build_datasets`` defaults
    to ``seqgpt``, this function to the ``ecomkit`` prompts its callers were written for).
    ``num_proc > 1`` tokenizes in worker processes (``map_batches``); the
    tokenizer's own Rust thread pool is then switched off
    (``TOKENIZERS_PARALLELISM=false``) to avoid oversubscribing the cores.
    """
    if max_length < MIN_MAX_LENGTH:
        raise ConfigError(f"max_length={max_length} (--seq-len) is too short; use at least {MIN_MAX_LENGTH} (256 fits "
                          f"most catalog rows).")
    if num_proc < 1:
        raise ConfigError(f"--num-proc must be >= 1, got {num_proc}.")
    check_task(task)
    check_format(prompt_format)
    _eos_id(tokenizer)
    labels = dict(labels or {})
    labels.setdefault("category", tuple(category_labels or CATEGORY_LABELS))
    table = as_record_table(records)
    with_polarity = has_polarity(table)
    n_proc = min(num_proc, max(1, len(table)))
    if n_proc > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    features = Features({"input_ids": _IDS, "labels": _IDS, "length": Value("int32"), "kind": Value("int8"),
                         "record": Value("int64"), **({"polarity": Value("int8")} if with_polarity else {})})
    key = fingerprint("tokens", table._fingerprint, tokenizer_digest(tokenizer), task, max_length,
                      {k: list(v) for k, v in labels.items()}, with_polarity,
                      *([prompt_format, "tail-kept"] if task == "nlu" and prompt_format != "ecomkit" else []))
    tokenized = map_batches(table, _tokenize_batch, key=key, features=features, num_proc=n_proc,
                            fn_kwargs={"tokenizer": tokenizer, "task": task, "labels": labels,
                                       "max_length": max_length, "with_polarity": with_polarity,
                                       "prompt_format": prompt_format},
                            desc="tokenizing")
    order = [c for c in ("input_ids", "labels", "length", "polarity") if c in tokenized.column_names]
    return tokenized.select_columns(order + (["kind", "record"] if keep_kind else []))


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
