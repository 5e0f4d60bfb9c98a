"""Generated sets a tiny model learns in seconds: a colour task the dictionary baseline gets wrong by construction.

On the catalog every held-out span was seen in training, so the dictionary baseline is near perfect. Here each row
names a product and its accessory, and only the first colour is a ``颜色`` span; both come from the same ten colours,
so the dictionary scores F1 2/3 whatever it sees, while a model that reads the text can reach 1.0::

    {"text": "粉色围巾 配棕色挂件", "spans": [{"type": "颜色", "term": "粉色", "start": 0, "end": 2}],
     "review": "非常满意，粉色围巾 配棕色挂件", "sentiment": "positive"}

Also: the demo's title/category file, a ``cat,label,review`` review file and product pages for pretraining.
"""

from __future__ import annotations

import csv
import json
import os
import random
from pathlib import Path
from typing import Callable

import numpy as np

from ecomkit.data.catalog import (BODY, CATEGORY_TABLE, CLOSERS, MAX_ROWS, MIN_ROWS, OPENERS, catalog_spans,
                                  generate_catalog)

COLOURS: tuple[str, ...] = ("红色", "黑色", "白色", "蓝色", "绿色", "灰色", "粉色", "紫色", "黄色", "棕色")
PRODUCTS: tuple[str, ...] = ("连衣裙", "外套", "衬衫", "卫衣", "运动鞋", "背包", "帽子", "围巾")
ACCESSORIES: tuple[str, ...] = ("腰带", "包装袋", "挂件", "鞋带")
POSITIVE: tuple[str, ...] = ("很好看", "质量很好", "非常满意")
NEGATIVE: tuple[str, ...] = ("质量差", "不满意", "很失望")
COLOUR_LABEL = "颜色"


def colour_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` rows (see the module docstring), the same for the same ``seed``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        own, other = rng.sample(COLOURS, 2)
        positive = rng.random() < 0.5
        text = f"{own}{rng.choice(PRODUCTS)} 配{other}{rng.choice(ACCESSORIES)}"
        rows.append({"text": text, "spans": [{"type": COLOUR_LABEL, "term": own, "start": 0, "end": len(own)}],
                     "review": f"{rng.choice(POSITIVE if positive else NEGATIVE)}，{text}",
                     "sentiment": "positive" if positive else "negative"})
    return rows


def _write_train_dev(folder: str | Path, rows: Callable[[int, int], list[dict]], n_train: int, n_dev: int,
                     seed: int) -> tuple[Path, Path]:
    """``train.jsonl`` (``rows(n_train, seed)``) and ``dev.jsonl`` (``rows(n_dev, seed + 1)``) under ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, n, s in (("train", n_train, seed), ("dev", n_dev, seed + 1)):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows(n, s)), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def write_colour_task(folder: str | Path, n_train: int = 1500, n_dev: int = 200, seed: int = 0) -> tuple[Path, Path]:
    """``train.jsonl`` and ``dev.jsonl`` under ``folder`` (different seeds); returns both paths."""
    return _write_train_dev(folder, colour_rows, n_train, n_dev, seed)


BASE_LABELS: tuple[str, str] = ("主色", "配件颜色")   # the base schema: the product's colour, the accessory's
BASE_SENTIMENT: dict[str, str] = {"positive": "好评", "negative": "差评"}   # the base's names for the two


def base_schema_rows(n: int, seed: int = 100) -> list[dict]:
    """Rows for a *base* model that a LoRA run then adapts to :func:`colour_rows` (the SeqGPT situation).

    Same kind of text under another schema (``主色``/``配件颜色``, ``好评``/``差评``), so the base answers the colour task
    in labels that score nothing there.
    """
    rows = []
    for row in colour_rows(n, seed):
        text = row["text"]
        at = text.index("配") + 1
        rows.append({"text": text, "spans": [
            {"type": BASE_LABELS[0], "term": text[:2], "start": 0, "end": 2},
            {"type": BASE_LABELS[1], "term": text[at:at + 2], "start": at, "end": at + 2}],
            "review": row["review"], "sentiment": BASE_SENTIMENT[row["sentiment"]]})
    return rows + [{"review": r["review"], "sentiment": r["sentiment"]} for r in generate_catalog(max(n, 100), seed)]


def write_base_task(folder: str | Path, n_train: int = 1500, n_dev: int = 200, seed: int = 100) -> tuple[Path, Path]:
    """``train.jsonl`` and ``dev.jsonl`` of :func:`base_schema_rows` under ``folder``; returns both paths."""
    return _write_train_dev(folder, base_schema_rows, n_train, n_dev, seed)


def category_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` catalog titles with their category: ``{"title": ..., "category": ...}`` (the demo's task)."""
    return [{"title": r["title"], "category": r["category"]} for r in generate_catalog(n, seed)]


def write_category_task(path: str | Path, n: int = 2000, seed: int = 0) -> Path:
    """:func:`category_rows` as JSON lines at ``path``, written whole or not at all (every rank may call it at once)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in category_rows(n, seed)), encoding="utf-8")
    os.replace(tmp, path)
    return path


# Category shares of review_file_rows: ten categories, the largest near 0.16 (a real review file's spread).
REVIEW_CATEGORY_SHARES: tuple[float, ...] = (0.16, 0.14, 0.12, 0.11, 0.10, 0.09, 0.08, 0.07, 0.07, 0.06)
REVIEW_NOISE = {"no_product": 0.15, "other_product": 0.10, "neutral_opener": 0.20, "flipped_label": 0.08,
                "product_first": 0.6, "brand": 0.4, "spec": 0.5}


def review_file_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` Chinese product reviews in the common public shape ``cat,label,review`` (label 1 positive, 0 negative).

    Both targets carry noise (``REVIEW_NOISE``: missing or other products, neutral openers, flipped labels).
    """
    rng = random.Random(seed)
    cats = [row[0] for row in CATEGORY_TABLE]
    products = {row[0]: [zh for zh, _ in row[4]] for row in CATEGORY_TABLE}
    brands = {row[0]: [b for b in row[3] if not b.isascii()] for row in CATEGORY_TABLE}
    specs = {row[0]: row[5] for row in CATEGORY_TABLE}
    rows = []
    for _ in range(n):
        cat = rng.choices(cats, weights=REVIEW_CATEGORY_SHARES)[0]
        positive = rng.random() < 0.5
        label = "positive" if positive else "negative"
        u = rng.random()
        shown = (cat if u >= REVIEW_NOISE["no_product"] + REVIEW_NOISE["other_product"]
                 else rng.choice([c for c in cats if c != cat]) if u >= REVIEW_NOISE["no_product"] else None)
        opener_key = ("neutral" if rng.random() < REVIEW_NOISE["neutral_opener"] else label, "zh")
        body = rng.sample(BODY[(label, "zh")] + BODY[("neutral", "zh")], rng.randint(0, 3))
        opener, closer = rng.choice(OPENERS[opener_key]), rng.choice(CLOSERS[(label, "zh")])
        if shown:   # the product, often with its brand, and one of its specs ("容量256GB"), as reviews name them
            brand = rng.choice(brands[shown]) if rng.random() < REVIEW_NOISE["brand"] else ""
            attr, values = rng.choice(specs[shown])
            spec = f"{attr}{rng.choice(values)}，" if rng.random() < REVIEW_NOISE["spec"] else ""
            body.insert(rng.randint(0, len(body)), spec)
            named = f"{brand}{rng.choice(products[shown])}"
        if shown and rng.random() < REVIEW_NOISE["product_first"]:   # "这款…太棒了!" or "太棒了!买的这款…"
            text = f"这款{named}{opener}" + "".join(body) + closer
        else:
            product = f"买的这款{named}，" if shown else ""
            text = opener + product + "".join(body) + closer
        flipped = rng.random() < REVIEW_NOISE["flipped_label"]
        rows.append({"cat": cat, "label": int(positive != flipped), "review": text})
    return rows


def write_review_file(path: str | Path, n: int = 3000, seed: int = 0) -> Path:
    """:func:`review_file_rows` as a CSV file (``cat,label,review``) at ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["cat", "label", "review"])
        writer.writeheader()
        writer.writerows(review_file_rows(n, seed))
    return path


def product_page_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` product pages as plain text (``{"text": ...}``): breadcrumb, title, price, spec, review and rating.

    Chapter 08's pretraining text: a product's words beside its category, a review's beside its rating.
    """
    return [{"text": f"类目:{r['category']} 商品:{r['title']} 价格:{r['price']:.2f} 规格:{r['spec']} "
                     f"评论({r['sentiment']}):{r['review']}"}
            for r in generate_catalog(n, seed)]


_INSTRUCTIONS = ("根据下面的商品信息写一条买家评论。", "总结下面几条商品信息的共同点。", "把下面的商品按价格从低到高说明。",
                 "从下面的商品信息中找出最值得买的一件并说明理由。")


def instruction_rows(n_rows: int, seed: int = 0, max_items: int = 24) -> list[dict]:
    """Alpaca-style rows (``instruction``, ``input``, ``output``) of widely varied length, from the catalog.

    Inputs list a long-tailed number of catalog items, as real SFT lengths vary; extra draws from ``(seed, 29)``.
    """
    rng = np.random.default_rng([seed, 29])
    counts = np.minimum(max_items, rng.geometric(0.25, size=n_rows))
    items = generate_catalog(min(MAX_ROWS, max(MIN_ROWS, int(counts.sum()))), seed)
    rows, at = [], 0
    for i, k in enumerate(counts.tolist()):
        picked = [items[(at + j) % len(items)] for j in range(k)]
        at += k
        lines = [f"{j + 1}. {r['title']} 价格:{r['price']:.2f} 规格:{r['spec']}" for j, r in enumerate(picked)]
        rows.append({"instruction": _INSTRUCTIONS[i % len(_INSTRUCTIONS)], "input": "\n".join(lines),
                     "output": picked[int(rng.integers(0, k))]["review"]})
    return rows


_BRAND_CHARS = "云星海风山川青禾木森光明华美优品佳乐安康宜家金银雪月花语晨曦锦绣天地凯悦君诺泽瑞丰源"
_BRAND_SYLLABLES = ("Zen", "No", "va", "Lux", "Vi", "ta", "Ae", "ro", "Kai", "Te", "ra", "Mi", "o", "Sol", "Vex",
                    "Lu", "na", "Or", "bit", "Ca", "sa", "Pix", "el", "Qu", "on", "Ri", "vo", "Ty", "Wen", "Ya")


def extraction_rows(n_rows: int, seed: int = 0, distractors: float = 0.7, new_brands: bool = False) -> list[dict]:
    """Catalog titles as extraction rows in the span-list shape: ``{"text", "spans": [{type, term, start, end}]}``.

    Extra draws come from ``(seed, 23)``, so the catalog is unchanged.

    - ``distractors``: shares of titles ending with a compatible brand or another value of the attribute (not
      spans), so a dictionary of training spans is no longer near perfect.
    - ``new_brands``: a made-up brand per row, found only by copying by position.
    """
    rng = np.random.default_rng([seed, 23])
    rows = []
    for record in generate_catalog(n_rows, seed):
        if new_brands:
            brand = _made_up_brand(rng, not record["brand"].isascii())
            record = {**record, "title": brand + record["title"][len(record["brand"]):], "brand": brand}
        title = record["title"]
        spans = [{"type": t, "term": title[s:e], "start": s, "end": e} for t, s, e in catalog_spans(record)]
        cat = next(row for row in CATEGORY_TABLE if row[0] == record["category"])
        other_brand = [b for b in cat[3] if b != record["brand"]][int(rng.integers(0, len(cat[3]) - 1))]
        values = [v for v in cat[5][0][1] if not spans or v != spans[-1]["term"]]
        other_value = values[int(rng.integers(0, len(values)))]
        chinese = not record["brand"].isascii()
        if rng.random() < distractors:
            title += f" 兼容{other_brand}" if chinese else f" for {other_brand}"
        if rng.random() < distractors:
            title += f" 另有{other_value}"
        rows.append({"text": title, "spans": spans})
    return rows


def _made_up_brand(rng: np.random.Generator, chinese: bool) -> str:
    if chinese:
        return "".join(_BRAND_CHARS[i] for i in rng.integers(0, len(_BRAND_CHARS), int(rng.integers(2, 4))))
    return "".join(_BRAND_SYLLABLES[i] for i in rng.integers(0, len(_BRAND_SYLLABLES), 3)).capitalize()
