"""Synthetic e-commerce catalog: the default data set, seeded, generated in seconds, no download.

Every chapter must run offline with the same numbers, so it reproduces what training is sensitive to: mixed-script
titles with marks and product codes, long-tailed review lengths (bucketing needs spread) and sentiment the text shows.
"""

from __future__ import annotations

import json
from typing import Iterator, Sequence

import numpy as np
from datasets import Features, Value

from ecomkit.errors import ConfigError

# Invented brands, products, specs and review sentences (no claim about real companies).
# (label, English name, median price in yuan, brands, products (zh, en), spec attributes)
CATEGORY_TABLE: tuple[tuple, ...] = (
    ("手机", "phones", 2999.0,
     ("星驰", "NovaTech", "米粒", "Zenith"),
     (("智能手机", "Smartphone"), ("折叠屏手机", "Foldable Phone"), ("老人机", "Senior Phone")),
     (("颜色", ("黑色", "白色", "远峰蓝", "Silver")), ("容量", ("128GB", "256GB", "512GB", "1TB")),
      ("网络", ("5G", "4G", "5G双卡")))),
    ("服饰", "apparel", 199.0,
     ("云裳", "UrbanFit", "北岸", "Linea"),
     (("纯棉T恤", "Cotton T-Shirt"), ("羽绒服", "Down Jacket"), ("牛仔裤", "Slim Jeans"), ("连衣裙", "Summer Dress")),
     (("颜色", ("黑色", "米白", "藏青", "Beige")), ("尺码", ("S", "M", "L", "XL", "XXL")),
      ("材质", ("纯棉", "聚酯纤维", "羊毛")))),
    ("美妆", "beauty", 159.0,
     ("花漾", "Lumiere", "雪肌", "Verde"),
     (("保湿面霜", "Moisturizing Cream"), ("口红", "Matte Lipstick"), ("防晒霜", "Sunscreen SPF50")),
     (("容量", ("30ml", "50ml", "100ml")), ("肤质", ("干性", "油性", "混合性", "所有肤质")))),
    ("家电", "appliances", 1299.0,
     ("海风", "Aerona", "美域", "Kelvin"),
     (("空气炸锅", "Air Fryer"), ("扫地机器人", "Robot Vacuum"), ("电热水壶", "Electric Kettle")),
     (("功率", ("800W", "1200W", "1800W")), ("颜色", ("白色", "灰色", "Black")),
      ("电压", ("220V",)))),
    ("食品", "food", 49.0,
     ("田园记", "GoldenHarvest", "三只熊", "Nordic Bites"),
     (("坚果礼盒", "Mixed Nuts"), ("挂耳咖啡", "Drip Coffee"), ("牛肉干", "Beef Jerky")),
     (("净含量", ("250g", "500g", "1kg")), ("口味", ("原味", "香辣", "Salted")))),
    ("图书", "books", 59.0,
     ("墨香出版", "Harbor Press", "青禾文化", "Quill House"),
     (("Python编程入门", "Python Programming"), ("深度学习实战", "Deep Learning in Practice"),
      ("儿童绘本", "Picture Book")),
     (("装帧", ("平装", "精装")), ("页数", ("256页", "384页", "512页")))),
    ("运动", "sports", 299.0,
     ("疾风", "Stride", "峰行", "Apex"),
     (("跑步鞋", "Running Shoes"), ("瑜伽垫", "Yoga Mat"), ("速干运动衣", "Dri-Fit Tee")),
     (("尺码", ("39", "40", "41", "42", "43")), ("颜色", ("荧光绿", "黑色", "Navy")))),
    ("母婴", "baby", 129.0,
     ("小禾苗", "BabyJoy", "贝贝乐", "Tinytots"),
     (("纸尿裤", "Diapers"), ("婴儿推车", "Baby Stroller"), ("奶瓶", "Baby Bottle")),
     (("适用年龄", ("0-6个月", "6-12个月", "1-3岁")), ("规格", ("S码", "M码", "L码", "XL码")))),
    ("数码配件", "accessories", 89.0,
     ("闪电侠", "VoltEdge", "极客", "Pixelink"),
     (("充电宝", "Power Bank"), ("无线耳机", "Wireless Earbuds"), ("数据线", "USB-C Cable")),
     (("容量", ("10000mAh", "20000mAh")), ("接口", ("USB-C", "Lightning")), ("颜色", ("黑色", "白色")))),
    ("家居", "home", 199.0,
     ("木与", "Hearth", "栖居", "Casa Nova"),
     (("四件套床品", "Bedding Set"), ("收纳箱", "Storage Box"), ("香薰蜡烛", "Scented Candle")),
     (("尺寸", ("1.5m", "1.8m", "大号", "小号")), ("颜色", ("浅灰", "奶白", "Sage")))),
)

ENGLISH_TITLE_WORDS: tuple[str, ...] = ("Pro", "Ultra", "Classic", "2024 New", "Premium", "Lite", "Max")
CHINESE_TITLE_WORDS: tuple[str, ...] = ("旗舰款", "新款", "官方正品", "热销", "限量版", "升级版")

# Each opener of a review carries at least one strongly polar word of its sentiment.
POSITIVE_WORDS: tuple[str, ...] = ("太棒了", "非常满意", "物超所值", "amazing", "excellent", "love")
NEGATIVE_WORDS: tuple[str, ...] = ("垃圾", "太差了", "假货", "terrible", "awful", "worst")

OPENERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("positive", "zh"): ("太棒了!", "质量太棒了,超出预期!", "非常满意,五星好评!", "物超所值,强烈推荐!"),
    ("positive", "en"): ("Amazing!", "Absolutely amazing quality!", "Excellent product, highly recommend!",
                         "I love it, works perfectly!"),
    ("neutral", "zh"): ("还行吧,中规中矩。", "一般般,没有特别惊喜。", "凑合能用。", "和预期差不多。"),
    ("neutral", "en"): ("It's okay.", "Average, nothing special.", "Does the job, nothing more.",
                        "About what I expected."),
    ("negative", "zh"): ("垃圾,千万别买!", "太差了,非常失望!", "质量垃圾,后悔买了!", "假货,差评!"),
    ("negative", "en"): ("Terrible!", "Terrible quality, a total waste of money.", "Awful product, do not buy!",
                         "Worst purchase ever, very disappointed."),
}

# Body sentences: sentiment-coloured ones (no polar keyword) and plain observations.
BODY: dict[tuple[str, str], tuple[str, ...]] = {
    ("positive", "zh"): ("做工很精致,手感很好。", "用了一周,效果非常好。", "客服态度特别好,很耐心。",
                         "包装很用心,送朋友也有面子。", "性价比很高,已经推荐给家人。", "细节处理得很到位。"),
    ("positive", "en"): ("The build quality is great and it feels solid.", "After a week of use it still works great.",
                         "Customer service was patient and helpful.", "Great value for the price.",
                         "My whole family uses it every day now."),
    ("negative", "zh"): ("做工粗糙,边缘还有毛刺。", "用了两天就坏了。", "客服一直不回复,退货也很麻烦。",
                         "和图片严重不符,颜色差很多。", "味道很大,根本没法用。", "说明书也看不懂。"),
    ("negative", "en"): ("It stopped working after two days.", "The seller never answered my messages.",
                         "It looks nothing like the pictures.", "There is a strong chemical smell.",
                         "The return process was a nightmare."),
    ("neutral", "zh"): ("物流三天到货。", "包装完好无破损。", "颜色和图片基本一致。", "尺寸和描述一样。",
                        "目前用了几天,再观察一下。", "价格不算便宜也不算贵。", "快递员送货上门。",
                        "赶上活动买的,比平时便宜一点。", "给家里老人买的。", "第二次购买了。"),
    ("neutral", "en"): ("Delivery took three days.", "The box arrived undamaged.",
                        "The colour matches the photos.", "The size is as described.",
                        "I have only used it for a few days so far.", "I bought it during a sale.",
                        "It was a gift for my parents.", "This is my second order."),
}

CLOSERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("positive", "zh"): ("会回购的!", "下次还来!", ""),
    ("positive", "en"): ("Will buy again!", "Five stars.", ""),
    ("neutral", "zh"): ("暂时给三星吧。", ""),
    ("neutral", "en"): ("Three stars for now.", ""),
    ("negative", "zh"): ("已经申请退货。", "不会再买了。", ""),
    ("negative", "en"): ("Returning it.", "Never again.", ""),
}

# The record every source is read into (a catalog row, a user's row): one table column per field. ``spans``: JSON
# ``[[type, start, end, term], ...]``, end exclusive.
TEXT_FIELDS: tuple[str, ...] = ("title", "review", "spec", "text")
TARGET_FIELDS: tuple[str, ...] = ("category", "sentiment", "brand", "price")
RECORD_FIELDS: tuple[str, ...] = ("sku", "category", "brand", "title", "price", "spec", "review", "sentiment", "text",
                                  "prompt", "response", "spans")
RECORD_FEATURES = Features({name: Value("float64" if name == "price" else "string") for name in RECORD_FIELDS})

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


def spans_json(spans: Sequence[tuple[str, int, int]], text: str) -> str:
    """The record-table form of a row's spans: ``[[type, start, end, term], ...]`` (end exclusive)."""
    return json.dumps([[t, s, e, text[s:e]] for t, s, e in spans], ensure_ascii=False)


def spans_from_json(value: str | None) -> list[tuple[str, int, int, str]]:
    return [tuple(item) for item in json.loads(value)] if value else []


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
