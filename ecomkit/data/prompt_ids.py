"""Prompt rows' token ids: where a prompt's input sits among its ids, and how a row is cut to fit a length.

Task nlu and instruction rows need it, an lm run on plain text does not (``data.tokenize`` imports it by name).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from ecomkit.data.formats import input_span
from ecomkit.data.tokenize import IGNORE_INDEX, RowCut, eos_id


class PromptIds(NamedTuple):
    """A prompt's token ids and where its input text sits among them: ``ids[input_start:input_end]``."""

    ids: list[int]
    input_start: int
    input_end: int


def encode_prompt_texts(tokenizer, prompts: Sequence[str]) -> list[PromptIds]:
    """Token ids of whole prompts (as the model reads them), each with its input's token span.

    The span comes from the fast tokenizer's offsets, so a prompt is tokenised as one string; else in three parts.
    """
    if not prompts:
        return []
    spans = [input_span(p) for p in prompts]
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(list(prompts), add_special_tokens=False, return_offsets_mapping=True)
        return [_span_from_offsets(ids, offsets, span)
                for ids, offsets, span in zip(enc["input_ids"], enc["offset_mapping"], spans)]
    out = []
    for prompt, (a, b) in zip(prompts, spans):
        head, text, tail = (tokenizer(part, add_special_tokens=False)["input_ids"] if part else []
                            for part in (prompt[:a], prompt[a:b], prompt[b:]))
        out.append(PromptIds(head + text + tail, len(head), len(head) + len(text)))
    return out


def _span_from_offsets(ids: list[int], offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> PromptIds:
    a, b = span
    inside = [i for i, (s, e) in enumerate(offsets) if e > a and s < b]
    if inside:
        return PromptIds(list(ids), inside[0], inside[-1] + 1)
    at = sum(1 for s, e in offsets if e <= a)
    return PromptIds(list(ids), at, at)


def cut_prompt(prompt: PromptIds, budget: int) -> tuple[list[int], RowCut]:
    """``prompt`` cut to ``budget`` ids: the end of its input first, then the prompt just before the input.

    Instruction, label list and answer cue tell the model what to do; the end of a long review tells it least.
    """
    ids, a, b = prompt
    excess = len(ids) - budget
    if excess <= 0:
        return list(ids), RowCut()
    from_input = min(excess, b - a)
    ids = ids[:b - from_input] + ids[b:]
    excess -= from_input
    at = b - from_input
    before = min(excess, at)
    after = excess - before
    ids = ids[:at - before] + ids[at + after:]
    return ids, RowCut(input=from_input, other=excess)


def fit_prompt_answer(prompt: PromptIds, answer: list[int], eos_id: int,
                      max_length: int) -> tuple[list[int], list[int], RowCut]:
    """prompt + answer + EOS within ``max_length`` ids; labels are -100 on the prompt; what was cut.

    The answer is what the row teaches: the prompt gives way first; only an answer longer than the row is cut.
    """
    answer = list(answer) + [eos_id]
    answer_cut = max(0, len(answer) - (max_length - 1))
    if answer_cut:
        answer = answer[:len(answer) - answer_cut]
    ids, cut = cut_prompt(prompt, max_length - len(answer))
    return ids + answer, [IGNORE_INDEX] * len(ids) + answer, cut._replace(answer=answer_cut)


def encode_prompt_answer(tokenizer, prompt: str, answer: str, max_length: int) -> tuple[list[int], list[int]]:
    """Token ids and labels for one (prompt, answer) pair, cut exactly as in training (for scoring candidates)."""
    (encoded,) = encode_prompt_texts(tokenizer, [prompt])
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    ids, labels, _ = fit_prompt_answer(encoded, answer_ids, eos_id(tokenizer), max_length)
    return ids, labels
