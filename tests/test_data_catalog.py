"""The synthetic catalog: deterministic, varied, labelled consistently, fast."""

import re
import time

import numpy as np
import pytest

from ecomkit.data.catalog import CATEGORIES, generate_catalog
from ecomkit.data.catalog import NEGATIVE_WORDS, POSITIVE_WORDS
from ecomkit.errors import ConfigError

FIELDS = {"sku", "category", "brand", "title", "price", "spec", "review", "sentiment"}


@pytest.fixture(scope="module")
def rows():
    return generate_catalog(3000, seed=0)


def test_same_seed_same_rows_other_seed_other_rows():
    assert generate_catalog(500, seed=7) == generate_catalog(500, seed=7)
    assert generate_catalog(500, seed=7) != generate_catalog(500, seed=8)


def test_record_fields_and_types(rows):
    for r in rows:
        assert set(r) == FIELDS
        assert isinstance(r["price"], float) and r["price"] > 0
        assert re.fullmatch(r"SKU-\d{6}", r["sku"])
        assert r["brand"] in r["title"]
        assert re.fullmatch(r"[^:;]+:[^:;]+(; [^:;]+:[^:;]+)*", r["spec"])
    assert len({r["sku"] for r in rows}) == len(rows)


def test_at_least_eight_categories_and_three_sentiments(rows):
    assert len(CATEGORIES) >= 8
    assert {r["category"] for r in rows} == set(CATEGORIES)
    assert {r["sentiment"] for r in rows} == {"positive", "neutral", "negative"}


def test_titles_mix_languages_symbols_and_codes(rows):
    titles = [r["title"] for r in rows]
    for needle in ("®", "™", "©", "SKU-", "ASIN:B0", "UPC:"):
        assert sum(needle in t for t in titles) > 10, needle
    chinese = sum(bool(re.search(r"[\u4e00-\u9fff]", t)) for t in titles)
    assert 0.3 * len(titles) < chinese < 0.95 * len(titles)
    upcs = [re.search(r"UPC:(\d{12})", t).group(1) for t in titles if "UPC:" in t]
    for code in upcs[:50]:  # UPC-A check digit
        digits = [int(c) for c in code]
        assert (3 * sum(digits[0:11:2]) + sum(digits[1:11:2]) + digits[11]) % 10 == 0


def test_sentiment_matches_polar_words(rows):
    def has(words, text):
        return any(w.lower() in text.lower() for w in words)

    for r in rows:
        pos, neg = has(POSITIVE_WORDS, r["review"]), has(NEGATIVE_WORDS, r["review"])
        expected = {"positive": (True, False), "negative": (False, True), "neutral": (False, False)}
        assert (pos, neg) == expected[r["sentiment"]], r["review"]


def test_review_lengths_spread_widely(rows):
    lengths = np.array([len(r["review"]) for r in rows])
    assert np.percentile(lengths, 10) < 30
    assert np.percentile(lengths, 90) > 150


@pytest.mark.parametrize("bad", [99, 1_000_001, 0, "100", True, 2.5])
def test_row_count_out_of_range_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="--n-rows"):
        generate_catalog(bad)


def test_hundred_thousand_rows_under_ten_seconds():
    start = time.perf_counter()
    rows = generate_catalog(100_000, seed=1)
    assert time.perf_counter() - start < 10.0
    assert len(rows) == 100_000
