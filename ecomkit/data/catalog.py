"""Synthetic e-commerce catalog: the default data set, seeded, generated in seconds, no download.

Every chapter must run offline with the same numbers, so it reproduces what training is sensitive to: mixed-script
titles with marks and product codes, long-tailed review lengths (bucketing needs spread) and sentiment the text shows.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ecomkit.data.catalog_pools import (
    BODY,
    CATEGORY_TABLE,
    CHINESE_TITLE_WORDS,
    CLOSERS,
    ENGLISH_TITLE_WORDS,
    OPENERS,
)
from ecomkit.errors import ConfigError

MIN_ROWS = 100
MAX_ROWS = 1_000_000

CATEGORIES: tuple[str, ...] = tuple(row[0] for row in CATEGORY_TABLE)
CATEGORY_ENGLISH: dict[str, str] = {row[0]: row[1] for row in CATEGORY_TABLE}
SENTIMENTS: tuple[str, ...] = ("positive", "neutral", "negative")
SENTIMENT_WEIGHTS = np.array([0.55, 0.20, 0.25])

# Body sentences per review: long-tailed (many short, some long), clipped to MAX_BODY_SENTENCES.
MAX_BODY_SENTENCES = 16
_ALNUM = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))


def generate_catalog(n_rows: int, seed: int | tuple[int, ...] = 0) -> list[dict]:
    """Return ``n_rows`` product records, identical for identical ``(n_rows, seed)``.

    Draws are vectorised over ``n_rows``, so a smaller catalog is not a prefix of a larger one.
    """
    _check_n_rows(n_rows)
    rng = np.random.default_rng(seed)
    cat = rng.integers(0, len(CATEGORY_TABLE), n_rows)
    draws = _draw_columns(rng, cat)
    titles = _titles(rng, cat, draws)
    reviews = _reviews(rng, draws["sentiment"])
    return [
        {
            "sku": draws["sku"][i],
            "category": CATEGORIES[cat[i]],
            "brand": draws["brand"][i],
            "title": titles[i],
            "price": float(draws["price"][i]),
            "spec": draws["spec"][i],
            "review": reviews[i],
            "sentiment": SENTIMENTS[draws["sentiment"][i]],
        }
        for i in range(n_rows)
    ]


BRAND_SPAN_LABEL = "品牌"
SPAN_LABELS: tuple[str, ...] = (BRAND_SPAN_LABEL, *dict.fromkeys(row[5][0][0] for row in CATEGORY_TABLE))


def catalog_spans(record: dict) -> list[tuple[str, int, int]]:
    """``(label, start, end)`` (end exclusive) of the brand and the first spec value in a title, with no random draw."""
    title, brand = record["title"], record["brand"]
    key, value = record["spec"].split(";")[0].split(":", 1)
    spans = [(BRAND_SPAN_LABEL, 0, len(brand))] if title.startswith(brand) else []
    for head in (title, title.rsplit(" ", 1)[0]):
        if head.endswith(" " + value):
            spans.append((key.strip(), len(head) - len(value), len(head)))
            break
    return spans


def generate_catalog_chunks(n_rows: int, seed: int = 0, chunk_rows: int = 100_000) -> Iterator[list[dict]]:
    """Yield a catalog of any size in chunks of at most ``chunk_rows`` records, one chunk in memory at a time.

    Chunk ``i`` is drawn with seed ``(seed, i)``: deterministic and bounded in memory (SKUs unique within a chunk only).
    """
    if n_rows <= chunk_rows:
        yield generate_catalog(n_rows, seed)
        return
    n_chunks = -(-n_rows // chunk_rows)
    base, extra = divmod(n_rows, n_chunks)
    for i in range(n_chunks):
        yield generate_catalog(base + (i < extra), (seed, i))


def review_rows(n_rows: int, seed: int = 0, categories: int = 4) -> list[dict]:
    """Rows in the common public shape of Chinese review data: ``cat``, ``label`` (0/1), ``review``.

    Not ecomkit's names and an integer label, so "bring your own data" examples need a column map and a label map.
    """
    keep = set(CATEGORIES[:categories])
    rows: list[dict] = []
    draw = min(MAX_ROWS, max(MIN_ROWS, 4 * n_rows * len(CATEGORIES) // max(1, len(keep))))
    part = 0
    while len(rows) < n_rows:
        rows += [{"cat": r["category"], "label": int(r["sentiment"] == "positive"),
                  "review": f"{r['title']} {r['review']}"} for r in generate_catalog(draw, (seed, part))
                 if r["category"] in keep and r["sentiment"] != "neutral"]
        part += 1
    return rows[:n_rows]


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


def _check_n_rows(n_rows: int) -> None:
    if isinstance(n_rows, bool) or not isinstance(n_rows, (int, np.integer)):
        raise ConfigError(f"--n-rows must be an integer between {MIN_ROWS} and {MAX_ROWS}, got {n_rows!r}.")
    if not MIN_ROWS <= n_rows <= MAX_ROWS:
        raise ConfigError(
            f"--n-rows {n_rows} is outside the supported range {MIN_ROWS}..{MAX_ROWS:,} for the synthetic "
            f"catalog. Pick a size in that range (2,000 rows is plenty for a first run), or load your own "
            f"data from a JSONL/CSV file or a save_to_disk directory."
        )


def _pick(rng: np.random.Generator, cat: np.ndarray, pool_of) -> list:
    """Pick one element per row from a per-category pool of varying size."""
    sizes = np.array([len(pool_of(row)) for row in CATEGORY_TABLE])
    idx = (rng.random(len(cat)) * sizes[cat]).astype(np.int64)
    return [pool_of(CATEGORY_TABLE[c])[j] for c, j in zip(cat.tolist(), idx.tolist())]


def _draw_columns(rng: np.random.Generator, cat: np.ndarray) -> dict:
    n = len(cat)
    medians = np.array([row[2] for row in CATEGORY_TABLE])
    price = np.maximum(np.round(medians[cat] * np.exp(rng.normal(0.0, 0.55, n)), 2), 1.0)
    sku_numbers = rng.permutation(MAX_ROWS)[:n]
    specs = _specs(rng, cat)
    return {
        "sku": [f"SKU-{k:06d}" for k in sku_numbers.tolist()],
        "brand": _pick(rng, cat, lambda row: row[3]),
        "product": _pick(rng, cat, lambda row: row[4]),
        "price": price,
        "spec": specs,
        "sentiment": rng.choice(len(SENTIMENTS), size=n, p=SENTIMENT_WEIGHTS),
    }


def _specs(rng: np.random.Generator, cat: np.ndarray) -> list[str]:
    """``"颜色:黑色; 容量:256GB"``: every attribute of the category, one value each."""
    n_attrs = max(len(row[5]) for row in CATEGORY_TABLE)
    u = rng.random((len(cat), n_attrs))
    out = []
    for i, c in enumerate(cat.tolist()):
        attrs = CATEGORY_TABLE[c][5]
        out.append("; ".join(f"{key}:{values[int(u[i, a] * len(values))]}" for a, (key, values) in enumerate(attrs)))
    return out


def _codes(rng: np.random.Generator, skus: list[str]) -> list[str]:
    """One product code per title: the SKU, an ASIN, a UPC-A with check digit, or none."""
    n = len(skus)
    kind = rng.choice(4, size=n, p=[0.3, 0.25, 0.2, 0.25])
    asin_chars = _ALNUM[rng.integers(0, len(_ALNUM), (n, 8))]
    upc = rng.integers(0, 10, (n, 11))
    check = (10 - (3 * upc[:, 0::2].sum(1) + upc[:, 1::2].sum(1)) % 10) % 10
    out = []
    for i, k in enumerate(kind.tolist()):
        if k == 0:
            out.append(skus[i])
        elif k == 1:
            out.append("ASIN:B0" + "".join(asin_chars[i]))
        elif k == 2:
            out.append("UPC:" + "".join(map(str, upc[i])) + str(check[i]))
        else:
            out.append("")
    return out


def _titles(rng: np.random.Generator, cat: np.ndarray, draws: dict) -> list[str]:
    """Chinese or English title: brand + mark, marketing word, product, first spec value, code."""
    n = len(cat)
    english = rng.random(n) < 0.4
    mark = rng.choice(3, size=n, p=[0.35, 0.4, 0.25])  # none, ®, ™ (books: ©)
    word_u = rng.random(n)
    codes = _codes(rng, draws["sku"])
    out = []
    for i in range(n):
        product_zh, product_en = draws["product"][i]
        spec_value = draws["spec"][i].split(";")[0].split(":", 1)[1]
        symbol = ("", "©" if CATEGORIES[cat[i]] == "图书" else "®", "™")[mark[i]]
        if english[i]:
            word = ENGLISH_TITLE_WORDS[int(word_u[i] * len(ENGLISH_TITLE_WORDS))]
            parts = [f"{draws['brand'][i]}{symbol}", word, product_en, spec_value, codes[i]]
        else:
            word = CHINESE_TITLE_WORDS[int(word_u[i] * len(CHINESE_TITLE_WORDS))]
            parts = [f"{draws['brand'][i]}{symbol}", f"{word}{product_zh}", spec_value, codes[i]]
        out.append(" ".join(p for p in parts if p))
    return out


def _body_counts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Long-tailed number of body sentences: ~45 % short, ~35 % medium, ~20 % long."""
    group = rng.choice(3, size=n, p=[0.45, 0.35, 0.20])
    low = np.array([0, 2, 6])[group]
    high = np.array([2, 6, MAX_BODY_SENTENCES + 1])[group]
    return rng.integers(low, high)


def _reviews(rng: np.random.Generator, sentiment: np.ndarray) -> list[str]:
    """Opener with a polar phrase, then distinct body sentences (drawn without replacement), then an optional closer."""
    n = len(sentiment)
    chinese = rng.random(n) < 0.65
    counts = _body_counts(rng, n)
    opener_u, closer_u = rng.random(n), rng.random(n)
    order = rng.random((n, _MAX_POOL)).argsort(axis=1)
    out = []
    for i in range(n):
        label, lang = SENTIMENTS[sentiment[i]], ("zh" if chinese[i] else "en")
        openers, closers, pool = OPENERS[(label, lang)], CLOSERS[(label, lang)], _BODY_POOLS[(label, lang)]
        picked = [pool[j] for j in order[i].tolist() if j < len(pool)][: counts[i]]
        parts = [openers[int(opener_u[i] * len(openers))], *picked, closers[int(closer_u[i] * len(closers))]]
        out.append(("" if lang == "zh" else " ").join(p for p in parts if p))
    return out


def _body_pools() -> dict[tuple[str, str], tuple[str, ...]]:
    pools = {}
    for label in SENTIMENTS:
        for lang in ("zh", "en"):
            own = BODY[(label, lang)] if label != "neutral" else ()
            pools[(label, lang)] = own + BODY[("neutral", lang)]
    return pools


_BODY_POOLS = _body_pools()
_MAX_POOL = max(len(p) for p in _BODY_POOLS.values())
