"""BLOOM model presets, exact parameter counts on the meta device, and ``load_model``.

Why presets: ``tiny`` and ``small`` keep BLOOM's architecture at a size that trains in seconds, so every
distributed path runs for real; the real shapes are built on the meta device for their exact Ψ.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, BloomConfig, BloomForCausalLM,
                          PretrainedConfig, PreTrainedModel)
from transformers.initialization import no_init_weights

from ecomkit import find
from ecomkit.errors import ModelNotFoundError


@dataclass(frozen=True)
class ModelPreset:
    """A BLOOM shape. ``vocab_size=None`` means "take it from the tokenizer"."""

    hidden_size: int
    n_layer: int
    n_head: int
    vocab_size: int | None
    description: str


# Real BLOOM shapes use a 250,880-token vocabulary; toy presets size theirs to the local tokenizer.
PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset(64, 2, 4, None, "2 blocks, hidden 64: unit tests, seconds on CPU"),
    "small": ModelPreset(512, 4, 8, None, "4 blocks, hidden 512: benchmarks, minutes on CPU"),
    "seqgpt-560m": ModelPreset(1024, 24, 16, 250_880, "SeqGPT-560M = BLOOM-560m shape"),
    "ecomgpt-7b": ModelPreset(4096, 30, 32, 250_880, "EcomGPT-7B = BLOOM-7b1 shape"),
}

# The public checkpoints these shapes correspond to, for users with hub access.
HUB_IDS: dict[str, str] = {
    "seqgpt-560m": "DAMO-NLP/SeqGPT-560M",
    "ecomgpt-7b": "Alibaba-NLP/EcomGPT-7B-Multilingual",
}

DEFAULT_TOY_VOCAB = 8192


def unknown_preset_message(name: str) -> str:
    return (
        f"Unknown model '{name}'. It is not a preset ({', '.join(PRESETS)}), not a local "
        "directory containing config.json, and not a hub id of the form 'org/name'. Pass a "
        "preset name, or the directory a model was saved to with save_pretrained()."
    )


def preset_config(name: str, vocab_size: int | None = None, **overrides: Any) -> BloomConfig:
    """Return the ``BloomConfig`` of a preset; ``vocab_size`` fills in toy presets' vocabulary.
    Real shapes keep BLOOM's 250,880-token vocabulary with any smaller tokenizer (a larger one grows it), so they
    are the models they name; ``overrides`` set any field."""
    if name not in PRESETS:
        raise ModelNotFoundError(unknown_preset_message(name))
    p = PRESETS[name]
    if p.vocab_size is None:   # a toy preset: sized to its tokenizer, so the embedding does not dwarf the blocks
        vocab = vocab_size or DEFAULT_TOY_VOCAB
    else:   # a real shape keeps BLOOM's vocabulary whatever tokenizer trains it; it only grows (tokens added)
        vocab = max(p.vocab_size, vocab_size or 0)
    cfg = BloomConfig(
        vocab_size=vocab,
        hidden_size=p.hidden_size,
        n_layer=p.n_layer,
        n_head=p.n_head,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        use_cache=False,     # training; the saved config turns it on (ecomkit.models.tokenizer.match_tokenizer)
        # BLOOM's ids, which ecomkit's own tokenizer also uses: <unk> 0, <s> 1, </s> 2, <pad> 3
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def build_model(name_or_config: str | BloomConfig, *, vocab_size: int | None = None,
                device: str | torch.device = "cpu", seed: int | None = 0,
                dtype: torch.dtype = torch.float32) -> BloomForCausalLM:
    """Build a randomly initialised BLOOM from a preset or config, its weights made in ``dtype``.
    Why seeded here: every rank and a 1-process reference start from bit-identical weights. ``device="meta"``
    allocates nothing (parameter counts, the planner)."""
    cfg = name_or_config if isinstance(name_or_config, BloomConfig) else preset_config(name_or_config, vocab_size)
    if seed is not None and str(device) != "meta":
        torch.manual_seed(seed)
    ctx = torch.device(device) if str(device) == "meta" else contextlib.nullcontext()
    with ctx, default_dtype(dtype):
        model = BloomForCausalLM(cfg)
    if str(device) != "meta":
        model = model.to(device=device)
    return model


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Floating-point tensors created inside are ``dtype`` (modules' weights included); restored afterwards."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    """Count unique parameters (tied embeddings counted once), meta tensors included; a bitsandbytes 4-bit weight
    (two values per packed byte) counts the elements of the weight it stores, from its quantization state."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        shape = getattr(getattr(p, "quant_state", None), "shape", None)
        total += int(torch.Size(shape).numel()) if shape is not None else p.numel()
    return total


def enable_activation_checkpointing(model: torch.nn.Module, checkpoint_kwargs: dict[str, Any] | None = None) -> None:
    """Turn on transformers' per-block activation checkpointing, under this transformers version's name for it.
    Why: transformers 5.23 renamed ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable``; every
    caller goes through here. ``checkpoint_kwargs`` go to ``torch.utils.checkpoint.checkpoint``."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=checkpoint_kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs)


def disable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Undo :func:`enable_activation_checkpointing`, by this transformers version's name."""
    disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    disable()


def preset_parameter_count(name: str, vocab_size: int | None = None) -> int:
    """Ψ of a preset, computed on the meta device (no memory allocated)."""
    return count_parameters(build_model(name, vocab_size=vocab_size, device="meta"))


def flops_per_token(n_params: int, n_layer: int, hidden: int, seq_len: float) -> float:
    """Training FLOPs per token of a BLOOM: 6Ψ + 12·L·h·T (for MFU and the time planner).
    6Ψ is forward 2Ψ + backward 4Ψ; 12·L·h·T are the attention products, which involve no weight (PaLM appendix B).
    ``seq_len`` (T) is the attention length: planned, or a real run's token-weighted mean real length."""
    return 6.0 * n_params + 12.0 * n_layer * hidden * seq_len


def is_local_model_dir(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


@dataclass(frozen=True)
class ModelSource:
    """What to load, without saying how: strategies decide how the model is materialised.
    ``name_or_path`` as for :func:`load_model`; ``dtype`` None is the strategy's ``weight_dtype``."""

    name_or_path: str
    vocab_size: int | None = None
    seed: int | None = 0
    dtype: torch.dtype | None = None

    @property
    def is_local_checkpoint(self) -> bool:
        """A local directory with weights: the case where loading the whole model per rank can be avoided."""
        return self.name_or_path not in PRESETS and is_local_model_dir(self.name_or_path)


def build_empty_model(source: ModelSource, device: str | torch.device = "meta") -> PreTrainedModel:
    """The architecture of ``source`` with no trained weights: on ``meta`` nothing is allocated, elsewhere the
    weights are allocated uninitialised for a checkpoint to fill (which keeps its own vocabulary)."""
    config = model_config(source.name_or_path,
                          vocab_size=source.vocab_size if source.name_or_path in PRESETS else None)
    with no_init_weights(), torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=source.dtype or torch.float32)
    model.tie_weights()  # no_init_weights also skips tying; the checkpoint has no separate lm_head for tied models
    return model


def checkpoint_files() -> Any:
    """:mod:`ecomkit.models.checkpoint_files`, imported by name: a preset's run reads no weights' files."""
    return find("ecomkit.models.checkpoint_files")


def load_model(name_or_path: str, *, vocab_size: int | None = None, device: str | torch.device = "cpu",
               seed: int | None = 0, dtype: torch.dtype = torch.float32,
               trust_remote_code: bool = False) -> PreTrainedModel:
    """Load a model from a preset name (seeded random init), a local ``save_pretrained`` directory, or a hub id.
    ``trust_remote_code`` stays off by default: executing a repository's code is the user's explicit decision."""
    if name_or_path in PRESETS:
        return build_model(name_or_path, vocab_size=vocab_size, device=device, seed=seed, dtype=dtype)
    return checkpoint_files().load_weights(name_or_path, device=device, dtype=dtype,
                                           trust_remote_code=trust_remote_code)


def model_config(name_or_path: str, *, vocab_size: int | None = None) -> PretrainedConfig:
    """The architecture :func:`load_model` builds for ``name_or_path``, without any weights (``vocab_size``
    overrides the vocabulary)."""
    if name_or_path in PRESETS:
        return preset_config(name_or_path, vocab_size=vocab_size)
    config = AutoConfig.from_pretrained(name_or_path, local_files_only=is_local_model_dir(name_or_path))
    if vocab_size is not None:
        config.vocab_size = vocab_size
    return config


# The sequence length BLOOM was pre-trained at (SeqGPT-560M and EcomGPT-7B kept it): where --seq-len auto stops.
# ALiBi has no position table, so longer rows run, but at lengths the model never trained on.
BLOOM_TRAINING_LENGTH = 2048


def model_length_limit(name_or_path: str) -> int:
    """The longest sequence ``--seq-len auto`` may choose for this model: its config's length, else BLOOM's
    training length; an unknown name raises :func:`load_model`'s error before the data is built."""
    if name_or_path in PRESETS:
        return BLOOM_TRAINING_LENGTH
    if not is_local_model_dir(name_or_path) and ("/" not in name_or_path or name_or_path.startswith((".", "/"))):
        raise ModelNotFoundError(unknown_preset_message(name_or_path))   # what load_model would say, before the data
    try:
        config = model_config(name_or_path)
    except (OSError, ValueError):     # not reachable yet: load_model reports it properly
        return BLOOM_TRAINING_LENGTH
    for name in ("seq_length", "n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return BLOOM_TRAINING_LENGTH


def model_origin(name_or_path: str) -> dict[str, str]:
    """Where a run's weights come from: ``{"kind": preset | local | hub, "text": what a user should know}``.
    Why: a preset trains from a random init and never learns language; the start-up line and summary say so."""
    if name_or_path in PRESETS:
        shape = PRESETS[name_or_path].description.split(":")[0]
        real = HUB_IDS.get(name_or_path, HUB_IDS["seqgpt-560m"])
        return {"kind": "preset", "text": f"random-init preset ({shape}), trained from scratch here: it learns the "
                                          f"mechanics and this data, not language; for a real task give real "
                                          f"weights: --model {real}, or a local save_pretrained folder"}
    if is_local_model_dir(name_or_path):
        return {"kind": "local", "text": f"weights from the folder {Path(name_or_path).resolve()}"}
    return {"kind": "hub", "text": f"weights from the Hugging Face hub ({name_or_path})"}
