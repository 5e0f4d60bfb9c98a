"""The locally trained BPE: e-commerce tokens whole, lossless, save/load round trip, get_tokenizer paths."""

import logging

import pytest

from ecomkit.data import generate_catalog
from ecomkit.data.tasks import format_lm_text, training_texts_for_tokenizer
from ecomkit.errors import ModelNotFoundError
from ecomkit.models.tokenizer import (
    ECOM_SPECIAL_TOKENS,
    add_ecom_special_tokens,
    get_tokenizer,
    load_tokenizer,
    resize_embeddings_for,
    save_tokenizer,
    train_tokenizer,
)

TEXT = "星驰® Pro 智能手机 SKU-004213 ASIN:B0ABCDEF12 UPC:012345678905 ©2024 NovaTech™ 太棒了!"


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(training_texts_for_tokenizer(generate_catalog(1500, seed=0)), vocab_size=3000)


def _single_ids(tokenizer):
    ids = {}
    for token in ECOM_SPECIAL_TOKENS:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        assert len(encoded) == 1, (token, encoded)
        ids[token] = encoded[0]
    return ids


def _assert_whole_in_context(tokenizer):
    ids = _single_ids(tokenizer)
    encoded = tokenizer.encode(TEXT, add_special_tokens=False)
    for token, token_id in ids.items():
        assert token_id in encoded, token
    assert tokenizer.decode(encoded) == TEXT


def test_special_tokens_whole_and_decoding_lossless(tok):
    assert len(set(_single_ids(tok).values())) == len(ECOM_SPECIAL_TOKENS)
    _assert_whole_in_context(tok)
    assert len(tok) <= 3000 + len(ECOM_SPECIAL_TOKENS)
    for token in ("bos", "eos", "pad", "unk"):
        assert getattr(tok, f"{token}_token_id") is not None


def test_save_load_round_trip(tok, tmp_path):
    save_tokenizer(tok, tmp_path / "t")
    assert (tmp_path / "t" / "tokenizer.json").is_file()
    loaded = load_tokenizer(tmp_path / "t")
    _assert_whole_in_context(loaded)
    texts = [format_lm_text(r) for r in generate_catalog(200, seed=9)]
    assert loaded(texts, add_special_tokens=False)["input_ids"] == tok(texts, add_special_tokens=False)["input_ids"]
    assert all(loaded.decode(ids) == t for ids, t in zip(loaded(texts, add_special_tokens=False)["input_ids"], texts))
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.bos_token_id, loaded.unk_token_id) == \
        (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id, tok.unk_token_id)
    assert len(loaded) == len(tok)


def _plain_byte_level_bpe():
    """A byte-level BPE trained on text without the e-commerce tokens (like a foreign tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(["plain text about phones and shoes 手机 鞋"] * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>")


def test_add_ecom_special_tokens_to_a_foreign_tokenizer(caplog):
    foreign = _plain_byte_level_bpe()
    before = len(foreign)
    with caplog.at_level(logging.WARNING, logger="ecomkit.models.tokenizer"):
        added = add_ecom_special_tokens(foreign)
    assert added == len(foreign) - before == 4  # ™ SKU- UPC: ASIN:
    for token in ("™", "SKU-", "UPC:", "ASIN:"):
        assert len(foreign.encode(token, add_special_tokens=False)) == 1
    # ® and © are bytes of the byte-level alphabet: adding them would corrupt decoding, so they are refused.
    assert "'®'" in caplog.text and "'©'" in caplog.text
    assert foreign.decode(foreign.encode(TEXT, add_special_tokens=False)) == TEXT
    assert add_ecom_special_tokens(foreign) == 0


def test_resize_embeddings_pads_to_multiple_of_eight(tok):
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(vocab_size=100, hidden_size=16, n_layer=1, n_head=2))
    rows = resize_embeddings_for(model, tok)
    assert rows >= len(tok) and rows % 8 == 0
    assert model.get_output_embeddings().weight.shape[0] == rows


def test_get_tokenizer_synthetic_is_cached(tmp_path, monkeypatch):
    first = get_tokenizer("synthetic", tmp_path, n_rows=300, vocab_size=1000)
    (cached,) = list(tmp_path.iterdir())

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been reused")

    monkeypatch.setattr("ecomkit.models.tokenizer.train_tokenizer", no_training)
    second = get_tokenizer("local", tmp_path, n_rows=300, vocab_size=1000)
    assert second.get_vocab() == first.get_vocab()
    assert get_tokenizer(str(cached)).get_vocab() == first.get_vocab()
    _single_ids(second)


def test_get_tokenizer_missing_directory():
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        get_tokenizer("./no/such/tokenizer")


def test_get_tokenizer_offline_hub_name_is_a_clear_error(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotFoundError) as info:
        get_tokenizer("ecomkit-test/no-such-model", tmp_path)
    message = str(info.value)
    assert "HF_HUB_OFFLINE" in message and "local directory" in message and "\n" not in message
