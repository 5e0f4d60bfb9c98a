"""Task formats: what a record becomes before tokenization.

Two tasks, matching the two kinds of model the cookbook fine-tunes:

- ``"lm"``: continued pre-training on catalog text, one string per record,
  ``商品:{title} 价格:{price} 规格:{spec} 评论:{review}``; the loss is on every token.
- ``"nlu"``: SeqGPT-style instructions, each a (prompt, answer) pair; the loss
  is on the answer only, because the model should learn to answer, not to
  reproduce the instruction text it is always given. Four sub-tasks: classify
  the category, classify the sentiment, extract the brand, extract the price.

Classification is evaluated by *scoring candidates* rather than by free
generation: for each candidate label the model's mean log-probability per answer
token (the EOS after it included; ``ecomkit.train.evaluate`` states why the mean)
is computed and the best candidate is the prediction. That needs
no decoding loop, works from the first step, and gives an exact accuracy.
:func:`build_classification_example` returns the prompt, the candidates and
the index of the correct one; encode each with
``ecomkit.data.tokenize.encode_prompt_answer`` so scoring sees exactly the
token layout used in training.

Fields required per task (:func:`required_fields_for_task`): ``lm`` needs
title, price, spec and review. ``nlu`` needs only title and price (price
extraction always applies); category classification, brand extraction and
sentiment classification are produced for a record only when it has
``category``, ``brand``, or ``sentiment`` and ``review`` respectively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ecomkit.data.catalog import CATEGORIES
from ecomkit.errors import ConfigError, DataError

TASKS: tuple[str, ...] = ("lm", "nlu")
CATEGORY_LABELS: tuple[str, ...] = CATEGORIES
SENTIMENT_LABELS: tuple[str, ...] = ("positive", "neutral", "negative")
SENTIMENT_POLARITY: dict[str, int] = {"positive": 1, "neutral": 0, "negative": -1}
NLU_TASKS: tuple[str, ...] = ("category", "sentiment", "brand", "price")
CLASSIFICATION_TASKS: tuple[str, ...] = ("category", "sentiment")

_REQUIRED = {"lm": ("title", "price", "spec", "review"), "nlu": ("title", "price")}


@dataclass(frozen=True)
class NluExample:
    """One instruction example; the loss covers ``answer`` only."""

    task: str
    prompt: str
    answer: str


@dataclass(frozen=True)
class ClassificationExample:
    """A prompt, its candidate answers, and which one is correct (for accuracy by scoring)."""

    task: str
    prompt: str
    candidates: tuple[str, ...]
    correct_index: int


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ConfigError(f"Unknown task {task!r}. Use 'lm' (causal language modelling on catalog text) or "
                          f"'nlu' (instructions: classify category/sentiment, extract brand/price).")
    return task


def required_fields_for_task(task: str) -> tuple[str, ...]:
    """Fields a record must have (non-empty) to be usable for ``task``."""
    return _REQUIRED[check_task(task)]


def format_price(price: float) -> str:
    return f"{price:.2f}"


def format_lm_text(record: dict) -> str:
    """``商品:{title} 价格:{price} 规格:{spec} 评论:{review}``."""
    return (f"商品:{record['title']} 价格:{format_price(record['price'])} "
            f"规格:{record['spec']} 评论:{record['review']}")


def _category_prompt(record: dict, labels: Sequence[str]) -> str:
    return f"任务:商品分类。从候选类目中选出商品所属的一个。\n候选:{'、'.join(labels)}\n商品:{record['title']}\n答:"


def _sentiment_prompt(record: dict) -> str:
    return f"任务:评论情感分类。判断评论的情感倾向。\n候选:{'、'.join(SENTIMENT_LABELS)}\n评论:{record['review']}\n答:"


def _brand_prompt(record: dict) -> str:
    return f"任务:品牌抽取。从商品标题中抽出品牌名。\n商品:{record['title']}\n答:"


def _price_prompt(record: dict) -> str:
    spec = f";规格:{record['spec']}" if record.get("spec") else ""
    return f"任务:价格抽取。从商品信息中抽出售价(元)。\n商品:{record['title']};售价{format_price(record['price'])}元{spec}\n答:"


def build_nlu_examples(record: dict, category_labels: Sequence[str] = CATEGORY_LABELS) -> list[NluExample]:
    """All NLU examples a record supports, in the order of :data:`NLU_TASKS`."""
    out = []
    if record.get("category"):
        out.append(NluExample("category", _category_prompt(record, category_labels), record["category"]))
    if record.get("sentiment") and record.get("review"):
        out.append(NluExample("sentiment", _sentiment_prompt(record), record["sentiment"]))
    if record.get("brand"):
        out.append(NluExample("brand", _brand_prompt(record), record["brand"]))
    out.append(NluExample("price", _price_prompt(record), format_price(record["price"])))
    return out


def build_classification_example(record: dict, task: str,
                                 labels: Sequence[str] | None = None) -> ClassificationExample:
    """Prompt, candidates and correct index for ``task`` in ``("category", "sentiment")``.

    Pure function: same record, same output. ``labels`` defaults to
    :data:`CATEGORY_LABELS` / :data:`SENTIMENT_LABELS`; for your own data pass
    :func:`category_labels_for` of the whole data set, so training prompts and
    evaluation candidates list the same categories.
    """
    if task == "category":
        labels = tuple(labels or CATEGORY_LABELS)
        prompt, gold = _category_prompt(record, labels), record.get("category")
    elif task == "sentiment":
        labels = tuple(labels or SENTIMENT_LABELS)
        prompt, gold = _sentiment_prompt(record), record.get("sentiment")
    else:
        raise ConfigError(f"Unknown classification task {task!r}; use one of {CLASSIFICATION_TASKS}.")
    if gold not in labels:
        raise DataError(f"Record {record.get('sku', '')!s} has {task}={gold!r}, which is not among the candidate "
                        f"labels {list(labels)}. Pass labels=category_labels_for(all_records), or drop records "
                        f"without a {task}.")
    return ClassificationExample(task, prompt, labels, labels.index(gold))


def category_labels_for(records: Iterable[dict]) -> tuple[str, ...]:
    """Candidate categories for a data set: the built-in labels if they cover it, else its sorted categories."""
    seen = {r["category"] for r in records if r.get("category")}
    if seen <= set(CATEGORY_LABELS):
        return CATEGORY_LABELS
    return tuple(sorted(seen))


def training_texts_for_tokenizer(records: Iterable[dict]) -> Iterable[str]:
    """Texts a catalog tokenizer should be trained on: LM strings and NLU prompts/answers.

    Including the prompts makes the fixed instruction words cheap (few ids),
    which keeps NLU sequences short.
    """
    for record in records:
        yield format_lm_text(record)
        for example in build_nlu_examples(record):
            yield example.prompt + example.answer
