"""``--seq-len``, ``--packing`` and the decoding sizes: checks of
:func:`~ecomkit.config.validate.validate_train_config`."""

from __future__ import annotations

from typing import Any

from ecomkit.config.vocabulary import AUTO, StrategyName, flag_of
from ecomkit.errors import ConfigError

_TrainConfig = Any      # ecomkit.config.schema.TrainConfig (schema imports validate, which imports this module)


# The shortest --seq-len a run takes: shorter leaves no room for a prompt's instruction, labels and answer.
MIN_SEQ_LEN = 16


def number_or_auto(name: str, value: Any, minimum: int) -> None:
    """``value`` is ``"auto"`` or an integer >= ``minimum``; the message names the flag."""
    if value == AUTO:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag_of(name)} {value!r}: must be a whole number or 'auto'.")
    if value < minimum:
        raise ConfigError(f"{flag_of(name)} {value}: must be >= {minimum}, or 'auto'.")


def check_lengths(cfg: _TrainConfig) -> None:
    """``--seq-len`` and ``--gen-max-new-tokens``: a number or ``auto``; packing where a strategy can pack."""
    number_or_auto("seq_len", cfg.seq_len, MIN_SEQ_LEN)
    number_or_auto("gen_max_new_tokens", cfg.gen_max_new_tokens, 1)
    if cfg.packing == "on" and cfg.strategy in (StrategyName.TP, StrategyName.MIXED) \
            and cfg.parallel.sequence_parallel and cfg.seq_len != AUTO and cfg.seq_len % cfg.parallel.tp:
        raise ConfigError(
            f"--packing on with --parallel-sequence-parallel cuts every packed sequence of --seq-len {cfg.seq_len} "
            f"into tp={cfg.parallel.tp} equal pieces, so seq_len must be a multiple of {cfg.parallel.tp}. Give "
            f"--seq-len {-(-cfg.seq_len // cfg.parallel.tp) * cfg.parallel.tp}.")


def check_generation(cfg: _TrainConfig) -> None:
    """Decoding sizes in range; beam search only where transformers' generate() runs (not pp, not sequence parallel)."""
    if cfg.gen_eval_samples < 0:
        raise ConfigError(f"--gen-eval-samples {cfg.gen_eval_samples}: must be >= 0 (0: no evaluation by generation).")
    for name in ("gen_num_beams", "gen_batch_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{flag_of(name)} {getattr(cfg, name)}: must be >= 1.")
    par = cfg.parallel
    pipelined = cfg.strategy in (StrategyName.PP, StrategyName.MIXED) and par.pp > 1
    if cfg.gen_num_beams > 1 and (cfg.strategy == StrategyName.PP or pipelined or par.sequence_parallel):
        raise ConfigError(
            f"--gen-num-beams {cfg.gen_num_beams}: pipeline parallel and sequence parallel decode greedily without "
            "the KV cache (a pipeline's stages are separate modules; sequence parallel cannot cut a one-token step "
            "into tp pieces), so beam search is not available there. Use --gen-num-beams 1.")


__all__ = ["MIN_SEQ_LEN", "check_generation", "check_lengths", "number_or_auto"]
