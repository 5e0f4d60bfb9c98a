"""Tokenizers: a byte-level BPE trained locally on the catalog, and helpers for real ones.

Why train one: the tiny models need a tokenizer that works offline with a small vocabulary (4,000 ids, not
250,880), with the e-commerce tokens (``®``, ``SKU-``, ...) whole (:func:`add_ecom_special_tokens` says why).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ecomkit.data.catalog import generate_catalog
from ecomkit.data.tasks import training_texts_for_tokenizer
from ecomkit.errors import ConfigError, EcomkitError, ModelNotFoundError
from ecomkit.models.bloom import checkpoint_files

logger = logging.getLogger(__name__)

ECOM_SPECIAL_TOKENS: list[str] = ["®", "™", "©", "SKU-", "UPC:", "ASIN:"]
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
DEFAULT_VOCAB_SIZE = 4000
SYNTHETIC_NAMES = ("local", "synthetic")
TOKENIZER_FORMAT_VERSION = 1  # bump when training changes, so stale caches are not reused


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, *, min_frequency: int = 2,
                    model_max_length: int = 2048):
    """Train a byte-level BPE on ``texts`` and wrap it as a transformers tokenizer.
    Each Chinese character is its own pre-token: otherwise BPE on template sentences merges whole sentences and
    sequence lengths would be unrealistically short. ``len(tok)`` may exceed ``vocab_size`` by the e-commerce tokens."""
    if vocab_size < 300:
        raise ConfigError(f"vocab_size={vocab_size} is too small for a byte-level BPE (256 byte ids plus "
                          f"specials); use at least 300, typically 2000-8000 for the tiny models.")
    tok = Tokenizer(models.BPE())
    pattern = "|".join(re.escape(t) for t in ECOM_SPECIAL_TOKENS)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.Split(Regex(r" ?\p{Han}"), behavior="isolated"),  # one id per Chinese character
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[UNK, BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    # The repeated line guarantees the merges that make "®"/"©" (two bytes each) whole,
    # even when the caller's texts rarely contain them.
    guarantee = " ".join(ECOM_SPECIAL_TOKENS)
    tok.train_from_iterator(_with_guarantee(texts, guarantee, repeats=max(min_frequency, 2) * 50), trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                      unk_token=UNK, model_max_length=model_max_length, padding_side="right")
    add_ecom_special_tokens(wrapped)
    not_whole = [t for t in ECOM_SPECIAL_TOKENS if len(wrapped.encode(t, add_special_tokens=False)) != 1]
    if not_whole:
        raise EcomkitError(f"After training, the tokens {not_whole} are still split; increase vocab_size "
                           f"(now {vocab_size}).")
    return wrapped


def _with_guarantee(texts: Iterable[str], line: str, repeats: int) -> Iterable[str]:
    yield from texts
    for _ in range(repeats):
        yield line


def add_ecom_special_tokens(tokenizer) -> int:
    """Make the e-commerce tokens whole in ``tokenizer``; return how many ids were added.
    A token whose text is already an entry it does not encode to (``®`` as byte 0xAE) is skipped with a warning.
    After a non-zero return, call :func:`resize_embeddings_for` on the model."""
    vocab = tokenizer.get_vocab()
    to_add = []
    for token in ECOM_SPECIAL_TOKENS:
        if len(tokenizer.encode(token, add_special_tokens=False)) == 1:
            continue
        if token in vocab:
            logger.warning("Not adding %r: in this vocabulary %r already stands for something else (a byte of "
                           "a byte-level BPE); it stays split into %d ids.", token, token,
                           len(tokenizer.encode(token, add_special_tokens=False)))
            continue
        to_add.append(AddedToken(token, normalized=False, special=False))
    return tokenizer.add_tokens(to_add) if to_add else 0


def resize_embeddings_for(model, tokenizer, pad_to_multiple_of: int | None = 8) -> int:
    """Resize the model's (tied) embeddings to ``len(tokenizer)``, the rows padded to ``pad_to_multiple_of`` for
    tensor cores; return the new row count."""
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=pad_to_multiple_of)
    return model.get_input_embeddings().weight.shape[0]


def save_tokenizer(tokenizer, directory: str | os.PathLike) -> Path:
    """Save to ``directory`` (``tokenizer.json`` + ``tokenizer_config.json``); return the path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def load_tokenizer(directory: str | os.PathLike):
    """Load a tokenizer saved by :func:`save_tokenizer` (or any local HF tokenizer directory)."""
    directory = Path(directory)
    if not (directory / "tokenizer.json").is_file() and not (directory / "tokenizer_config.json").is_file():
        raise EcomkitError(f"No tokenizer in {directory}: expected tokenizer.json and tokenizer_config.json. "
                           f"Save one with ecomkit.models.tokenizer.save_tokenizer(tok, '{directory}'), or pass "
                           f"'synthetic' to train the local one.")
    return AutoTokenizer.from_pretrained(str(directory))


def default_cache_dir() -> Path:
    """``$ECOMKIT_CACHE/tokenizers`` (default ``~/.cache/ecomkit/tokenizers``)."""
    return Path(os.environ.get("ECOMKIT_CACHE", Path.home() / ".cache" / "ecomkit")).expanduser() / "tokenizers"


def get_tokenizer(name_or_dir: str | os.PathLike = "synthetic", cache_dir: str | os.PathLike | None = None, *,
                  vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0, n_rows: int = 5_000):
    """Return a tokenizer from a local directory, the local catalog BPE (``"synthetic"``/``"local"``, cached
    atomically so ranks share it), or the hub (a clear error offline); no pad token gets ``pad = eos``."""
    name_or_dir = str(name_or_dir)
    if name_or_dir in SYNTHETIC_NAMES:
        return _cached_synthetic_tokenizer(Path(cache_dir) if cache_dir else default_cache_dir(),
                                           vocab_size, seed, n_rows)
    path = Path(name_or_dir).expanduser()
    if path.is_dir():
        return load_tokenizer(path)
    if name_or_dir.startswith((".", "/", "~")) or name_or_dir.count("/") > 1:  # a path, not "org/name"
        raise ModelNotFoundError(f"Tokenizer directory {path} does not exist. Pass an existing directory, "
                                 f"'synthetic' for the local BPE, or a hub id such as 'bigscience/bloom-560m'.")
    return checkpoint_files().hub_tokenizer(name_or_dir, cache_dir)


def local_tokenizer_dir(cache_dir: str | os.PathLike, vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0,
                        n_rows: int = 5_000) -> Path:
    """The directory of the local catalog BPE with this target vocabulary, trained and cached if needed (a
    ``TrainConfig.tokenizer`` can name it)."""
    _cached_synthetic_tokenizer(Path(cache_dir), vocab_size, seed, n_rows)
    return _local_dir(Path(cache_dir), vocab_size, seed, n_rows)


def _local_dir(cache_dir: Path, vocab_size: int, seed: int, n_rows: int) -> Path:
    return cache_dir / f"catalog-bpe-v{TOKENIZER_FORMAT_VERSION}-vocab{vocab_size}-rows{n_rows}-seed{seed}"


def _cached_synthetic_tokenizer(cache_dir: Path, vocab_size: int, seed: int, n_rows: int):
    final = _local_dir(cache_dir, vocab_size, seed, n_rows)
    if (final / "tokenizer.json").is_file():
        return load_tokenizer(final)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(training_texts_for_tokenizer(generate_catalog(n_rows, seed)), vocab_size)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache_dir))
    save_tokenizer(tok, tmp)
    try:
        os.rename(tmp, final)  # atomic; fails if another process got there first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_tokenizer(final)


def match_tokenizer(model, tokenizer) -> dict[str, int | None]:
    """Make ``model``'s config and generation config carry ``tokenizer``'s pad/bos/eos ids and ``use_cache=True``.
    Why: a wrong ``pad_token_id`` makes Trainer warn and ``generate()`` pad wrongly, and ``use_cache: false`` makes
    every ``generate()`` recompute the prefix. Call it on the model about to be saved; returns the ids set."""
    ids = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.eos_token_id}
    targets = [model.config] + ([model.generation_config] if getattr(model, "generation_config", None) else [])
    for target in targets:
        for key, value in ids.items():
            if value is not None:
                setattr(target, key, value)
        target.use_cache = True
    return ids
