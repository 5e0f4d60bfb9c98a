"""Task formats: what a record becomes before tokenization, following the fields the record has.

``lm``: one string per record, loss on every token. ``nlu``: one (prompt, answer) example per target the record
supports (category, sentiment, extraction, brand; ``price`` in the ``ecomkit`` format only), loss on the answer
only; instruction rows are one example in either task. Missing fields give fewer examples, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ecomkit import find
from ecomkit.data.catalog import CATEGORIES
from ecomkit.errors import ConfigError

TASKS: tuple[str, ...] = ("lm", "nlu")
CATEGORY_LABELS: tuple[str, ...] = CATEGORIES
SENTIMENT_LABELS: tuple[str, ...] = ("positive", "neutral", "negative")
SENTIMENT_POLARITY: dict[str, int] = {"positive": 1, "neutral": 0, "negative": -1}
NLU_TASKS: tuple[str, ...] = ("category", "sentiment", "brand", "price")
CLASSIFICATION_TASKS: tuple[str, ...] = ("category", "sentiment")
KINDS: tuple[str, ...] = ("lm", *NLU_TASKS, "instruction", "extract")   # example kinds, counted by the build report
TARGETS = "ecomkit.data.targets"   # --task nlu: what each target asks of a record, imported by name
BRAND_LABEL = "品牌"                                          # the label of a brand column read as a span
BUILTIN_LABELS: dict[str, tuple[str, ...]] = {"category": CATEGORY_LABELS, "sentiment": SENTIMENT_LABELS}
_INPUT_NAMES = {"title": "商品", "review": "评论", "text": "文本"}


@dataclass(frozen=True)
class NluExample:
    """One instruction example; the loss covers ``answer`` only."""

    task: str
    prompt: str
    answer: str


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ConfigError(f"Unknown task {task!r}. Use 'lm' (causal language modelling on catalog text) or "
                          f"'nlu' (instructions: classify category/sentiment, extract brand/price).")
    return task


def format_price(price: float) -> str:
    return f"{price:.2f}"


def format_lm_text(record: Mapping[str, Any]) -> str:
    """``商品:{title} 价格:{price} 规格:{spec} 评论:{review}`` with the parts present; else the plain ``text``."""
    parts = [f"{name}:{value}" for name, value in (
        ("商品", record.get("title")),
        ("价格", format_price(record["price"]) if record.get("price") is not None else None),
        ("规格", record.get("spec")), ("评论", record.get("review"))) if value]
    if record.get("text"):
        parts.append(record["text"])
    return " ".join(parts)


def first_present(record: Mapping[str, Any], names: Sequence[str]) -> tuple[str, str] | None:
    """The first of ``names`` the record has a value for, with that value; None when it has none."""
    for name in names:
        if record.get(name):
            return name, record[name]
    return None


def category_prompt(record: Mapping[str, Any], labels: Sequence[str]) -> str:
    name, value = first_present(record, ("title", "review", "text"))
    return f"任务:商品分类。从候选类目中选出商品所属的一个。\n候选:{'、'.join(labels)}\n{_INPUT_NAMES[name]}:{value}\n答:"


def sentiment_prompt(record: Mapping[str, Any], labels: Sequence[str] = SENTIMENT_LABELS) -> str:
    name, value = first_present(record, ("review", "text"))
    return f"任务:评论情感分类。判断评论的情感倾向。\n候选:{'、'.join(labels)}\n{_INPUT_NAMES[name]}:{value}\n答:"


def _brand_prompt(record: Mapping[str, Any]) -> str:
    name, value = first_present(record, ("title", "text"))
    return f"任务:品牌抽取。从商品标题中抽出品牌名。\n{_INPUT_NAMES[name]}:{value}\n答:"


def _price_prompt(record: Mapping[str, Any]) -> str:
    price = format_price(record["price"])
    if record.get("title"):
        spec = f";规格:{record['spec']}" if record.get("spec") else ""
        return f"任务:价格抽取。从商品信息中抽出售价(元)。\n商品:{record['title']};售价{price}元{spec}\n答:"
    return f"任务:价格抽取。从商品信息中抽出售价(元)。\n文本:{record['text']};售价{price}元\n答:"


def build_nlu_examples(record: Mapping[str, Any], category_labels: Sequence[str] = CATEGORY_LABELS,
                       sentiment_labels: Sequence[str] = SENTIMENT_LABELS) -> list[NluExample]:
    """All NLU examples a record supports, in the order of :data:`KINDS`."""
    r, out = record, []
    if r.get("prompt") and r.get("response"):
        return [NluExample("instruction", r["prompt"], r["response"])]
    if r.get("category") and (r.get("title") or r.get("review") or r.get("text")):
        out.append(NluExample("category", category_prompt(r, category_labels), r["category"]))
    if r.get("sentiment") and (r.get("review") or r.get("text")):
        out.append(NluExample("sentiment", sentiment_prompt(r, sentiment_labels), r["sentiment"]))
    if r.get("brand") and (r.get("title") or r.get("text")):
        out.append(NluExample("brand", _brand_prompt(r), r["brand"]))
    if r.get("price") is not None and (r.get("title") or r.get("text")):
        out.append(NluExample("price", _price_prompt(r), format_price(r["price"])))
    return out


def task_examples(record: Mapping[str, Any], task: str, labels: Mapping[str, Sequence[str]],
                  prompt_format: str = "ecomkit") -> list[NluExample]:
    """What ``task`` trains on from one record: kind ``lm`` (prompt empty, loss on all) or prompt/answer pairs."""
    if record.get("prompt") and record.get("response"):
        return [NluExample("instruction", record["prompt"], record["response"])]
    if task == "lm":
        text = format_lm_text(record)
        return [NluExample("lm", "", text)] if text else []
    return find(f"{TARGETS}:nlu_examples")(record, labels, prompt_format)


def can_classify(record: Mapping[str, Any], task: str) -> bool:
    """Whether ``record`` gives a ``task`` classification example (its label and an input to read)."""
    inputs = ("title", "review", "text") if task == "category" else ("review", "text")
    return bool(record.get(task)) and not record.get("prompt") and any(record.get(f) for f in inputs)


def labels_from_values(values: Iterable[Any], task: str) -> tuple[str, ...]:
    """Candidate labels from the data: those seen, in the built-in order when all are built-in, else sorted."""
    seen = {v for v in values if v}
    builtin = BUILTIN_LABELS.get(task, ())
    if seen <= set(builtin):
        return tuple(label for label in builtin if label in seen)
    return tuple(sorted(seen))


def category_labels_for(records: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Candidate categories for a data set (see :func:`labels_from_values`)."""
    return labels_from_values((r.get("category") for r in records), "category")


def training_texts_for_tokenizer(records: Iterable[Mapping[str, Any]]) -> Iterable[str]:
    """Texts a catalog tokenizer should be trained on: LM strings and NLU prompts/answers (so prompts take few ids)."""
    for record in records:
        yield format_lm_text(record)
        for example in build_nlu_examples(record):
            yield example.prompt + example.answer
