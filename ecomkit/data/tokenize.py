"""Records to token ids: ``input_ids``, ``labels`` (-100 = no loss) and ``length``, plus the padding collator.

Labels are stored because the loss mask differs per example kind, which keeps the training loop task-agnostic.
One streamed batched map, cached by content hash; ``kind`` and ``record`` columns let the build count and split
examples, ``polarity`` feeds the sentiment clipping policy. No BOS (as BLOOM's tokenizer); an EOS ends each row.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple, Sequence

import torch
from datasets import Dataset, Features, Sequence as ArrowList, Value

from ecomkit import find
from ecomkit.data.stream import column_numpy, fingerprint, map_batches, tokenizer_digest, unique_values
from ecomkit.data.catalog import RECORD_FEATURES, RECORD_FIELDS
from ecomkit.data.task_file import check_format
from ecomkit.data.tasks import CATEGORY_LABELS, KINDS, SENTIMENT_POLARITY, check_task, task_examples
from ecomkit.errors import ConfigError

IGNORE_INDEX = -100
PROMPT_IDS = "ecomkit.data.prompt_ids"   # rows with a prompt (task nlu, instruction pairs): imported by name
MIN_MAX_LENGTH = 16
_IDS = ArrowList(Value("int32"))


def eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise ConfigError("The tokenizer has no EOS token; set tokenizer.eos_token (e.g. '</s>') before "
                          "tokenizing, so sequences can be terminated.")
    return tokenizer.eos_token_id


class RowCut(NamedTuple):
    """Tokens a row lost to fit a length: from the end of its input, from the end of its answer, elsewhere."""

    input: int = 0
    answer: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.input + self.answer + self.other


def lm_windows(ids: list[int], max_length: int) -> list[list[int]]:
    """A document in consecutive windows of ``max_length`` ids, one id of overlap, never truncated.

    A window's first id is only context, so the overlap makes every id after the first predicted exactly once.
    """
    if len(ids) <= max_length:
        return [list(ids)]
    step = max_length - 1
    return [list(ids[start:start + max_length]) for start in range(0, len(ids) - 1, step)]


def _prompt_ids():
    """The module that encodes and cuts prompts, imported by name: rows without a prompt never need it."""
    return find(PROMPT_IDS)


def _tokenize_batch(batch: dict[str, list], indices: list[int], tokenizer, task: str,
                    labels: Mapping[str, Sequence[str]], with_polarity: bool,
                    prompt_format: str = "ecomkit") -> dict[str, list]:
    """Records → examples → whole (uncut) ids for one batch; :func:`fit_rows` cuts once the length is known."""
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
    eos = eos_id(tokenizer)
    answer_ids = tokenizer(answers, add_special_tokens=False)["input_ids"] if answers else []
    with_prompt = [i for i, p in enumerate(prompts) if p]
    encoded = {}
    if with_prompt:
        texts = [prompts[i] for i in with_prompt]
        encoded = dict(zip(with_prompt, _prompt_ids().encode_prompt_texts(tokenizer, texts)))
    out: dict[str, list] = {"input_ids": [], "labels": [], "length": [], "prompt_length": [], "input_start": [],
                            "input_end": []}
    for i, answer in enumerate(answer_ids):
        prompt, start, end = encoded.get(i, ([], 0, 0))
        ids = prompt + answer + [eos]
        out["input_ids"].append(ids)
        out["labels"].append(([IGNORE_INDEX] * len(prompt) + answer + [eos]) if prompt else list(ids))
        out["length"].append(len(ids))
        out["prompt_length"].append(len(prompt))
        out["input_start"].append(start)
        out["input_end"].append(end)
    out.update({"kind": kinds, "record": records})
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


WHOLE_COLUMNS = ("prompt_length", "input_start", "input_end")   # kept by tokenize_whole for the cut (data/lengths.py)


def tokenize_whole(records: Sequence[Mapping[str, Any]] | Dataset, tokenizer, task: str, num_proc: int = 1,
                   labels: Mapping[str, Sequence[str]] | None = None, prompt_format: str = "ecomkit") -> Dataset:
    """Every record's examples as whole token rows: nothing cut yet, so lengths can be measured first.

    Cached by records, tokenizer, task, labels and format, not by length, so another ``--seq-len`` never re-tokenises.
    """
    if num_proc < 1:
        raise ConfigError(f"--num-proc must be >= 1, got {num_proc}.")
    check_task(task)
    check_format(prompt_format)
    eos_id(tokenizer)
    labels = dict(labels or {})
    labels.setdefault("category", tuple(CATEGORY_LABELS))
    table = as_record_table(records)
    with_polarity = has_polarity(table)
    n_proc = min(num_proc, max(1, len(table)))
    if n_proc > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    features = Features({"input_ids": _IDS, "labels": _IDS, "length": Value("int32"),
                         **{name: Value("int32") for name in WHOLE_COLUMNS}, "kind": Value("int8"),
                         "record": Value("int64"), **({"polarity": Value("int8")} if with_polarity else {})})
    key = fingerprint("whole-tokens", table._fingerprint, tokenizer_digest(tokenizer), task,
                      {k: list(v) for k, v in labels.items()}, with_polarity,
                      prompt_format if task == "nlu" else None)
    return map_batches(table, _tokenize_batch, key=key, features=features, num_proc=n_proc,
                       fn_kwargs={"tokenizer": tokenizer, "task": task, "labels": labels,
                                  "with_polarity": with_polarity, "prompt_format": prompt_format},
                       desc="tokenizing")


def tokenize_records(records: Sequence[Mapping[str, Any]] | Dataset, tokenizer, task: str, max_length: int,
                     num_proc: int = 1, category_labels: Sequence[str] | None = None,
                     labels: Mapping[str, Sequence[str]] | None = None, keep_kind: bool = False,
                     prompt_format: str = "ecomkit") -> Dataset:
    """Records (dicts, or a record table) as ``input_ids``, ``labels``, ``length`` fit to ``max_length`` in one call.

    For callers that know their length (``build_datasets`` measures first); ``keep_kind``: keep ``kind``, ``record``.
    """
    check_max_length(max_length)
    labels = dict(labels or {})
    labels.setdefault("category", tuple(category_labels or CATEGORY_LABELS))
    whole = tokenize_whole(records, tokenizer, task, num_proc, labels, prompt_format)
    fitted = fit_rows(whole, max_length, num_proc)
    order = [c for c in ("input_ids", "labels", "length", "polarity") if c in fitted.column_names]
    return fitted.select_columns(order + (["kind", "record"] if keep_kind else []))


def check_max_length(max_length: int) -> int:
    if max_length < MIN_MAX_LENGTH:
        raise ConfigError(f"max_length={max_length} (--seq-len) is too short; use at least {MIN_MAX_LENGTH}, or "
                          f"--seq-len auto to fit every row.")
    return max_length


CUT_COLUMNS = ("cut_input", "cut_answer", "cut_other", "input_tokens", "window")


def fit_rows(whole: Dataset, max_length: int, num_proc: int = 1) -> Dataset:
    """:func:`tokenize_whole`'s rows fit to ``max_length``, with per-row cut counts in :data:`CUT_COLUMNS`.

    Prompt rows lose the end of their input first; LM documents become windows, never truncated. A table whose rows
    all fit is returned as it is.
    """
    check_max_length(max_length)
    if len(whole) == 0 or int(column_numpy(whole, "length").max()) <= max_length:
        return whole
    features = Features({**whole.features, **{name: Value("int32") for name in CUT_COLUMNS}})
    key = fingerprint("fit", whole._fingerprint, max_length)
    return map_batches(whole, _fit_batch, key=key, features=features, num_proc=min(num_proc, max(1, len(whole))),
                       fn_kwargs={"max_length": max_length}, desc=f"fitting rows to {max_length} tokens")


def _fit_batch(batch: dict[str, list], indices: list[int], max_length: int) -> dict[str, list]:
    names = list(batch)
    out: dict[str, list] = {name: [] for name in names + list(CUT_COLUMNS)}

    def emit(i: int, ids: list[int], labels: list[int], cut: RowCut, window: int, prompt_length: int) -> None:
        for name in names:
            out[name].append(batch[name][i])
        out["input_ids"][-1], out["labels"][-1], out["length"][-1] = ids, labels, len(ids)
        out["prompt_length"][-1] = prompt_length
        out["cut_input"].append(cut.input)
        out["cut_answer"].append(cut.answer)
        out["cut_other"].append(cut.other)
        out["input_tokens"].append(batch["input_end"][i] - batch["input_start"][i])
        out["window"].append(window)

    for i, ids in enumerate(batch["input_ids"]):
        n_prompt = batch["prompt_length"][i]
        if len(ids) <= max_length:
            emit(i, ids, batch["labels"][i], RowCut(), 0, n_prompt)
        elif n_prompt == 0:
            for k, window in enumerate(lm_windows(ids, max_length)):
                emit(i, window, list(window), RowCut(), k, 0)
        else:
            prompts = _prompt_ids()
            prompt = prompts.PromptIds(ids[:n_prompt], batch["input_start"][i], batch["input_end"][i])
            fitted, labels, cut = prompts.fit_prompt_answer(prompt, ids[n_prompt:-1], ids[-1], max_length)
            emit(i, fitted, labels, cut, 0, sum(1 for y in labels if y == IGNORE_INDEX))
    return out


def pad_collate(features: Sequence[dict], pad_id: int, pad_to_multiple_of: int | None = None) -> dict:
    """Right-pad examples to the longest: ``input_ids``, ``attention_mask``, ``labels`` (padded with -100) tensors."""
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


class BatchCounts(NamedTuple):
    """What one micro-batch holds, counted from its rows on the host (no tensor read, so no device sync).

    ``label_tokens``: positions the loss reads; ``squared``: Σ L² over rows, the attention term of the model FLOPs.
    """

    label_tokens: int
    tokens: int
    rows: int
    positions: int
    squared: int


def predicted_tokens(labels: Sequence[int]) -> int:
    """Positions of one row whose label the shifted loss reads: every label after the first that is not -100."""
    return sum(1 for y in labels[1:] if y != IGNORE_INDEX)


def row_counts(features: Sequence[dict], pad_to_multiple_of: int | None = None) -> BatchCounts:
    """:class:`BatchCounts` of the rows :func:`pad_collate` pads into one batch (with the same rounding)."""
    lengths = [len(f["input_ids"]) for f in features]
    longest = max(lengths)
    if pad_to_multiple_of:
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    labels = sum(predicted_tokens(f.get("labels", f["input_ids"])) for f in features)
    return BatchCounts(labels, sum(lengths), len(lengths), len(lengths) * longest, sum(n * n for n in lengths))

