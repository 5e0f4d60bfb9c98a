"""``--clip-policy sentiment``: the EcomGPT guide's clip value, set each step by the global batch's polar share.

Why apart: a run with the default fixed clip (``--max-grad-norm``) loads none of it (``train.loop.CLIP``); the rule
``0.5 + 0.5 · min(s, 2)``, ``s`` 2 × the share of polar samples in the global batch, is alike on every rank.
Chapter 02 measures it.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ecomkit.dist import DistEnv, all_reduce_mean


class SentimentClip:
    """The step's clip value from its micro-batches' ``polarity`` column, averaged over ranks (a collective)."""

    def __init__(self, env: DistEnv):
        self.env = env

    def value(self, batches: Sequence[dict]) -> float:
        polarity = [batch["polarity"] for batch in batches]
        local = sentiment_strength(torch.cat(polarity)) if polarity else 0.0
        return sentiment_clip_value(all_reduce_mean(local, self.env))   # equal rank slices: the global mean


def sentiment_strength(polarity: torch.Tensor) -> float:
    """2 × fraction of samples with non-zero polarity (+1 positive, -1 negative, 0 neutral)."""
    if polarity.numel() == 0:
        return 0.0
    return 2.0 * float((polarity != 0).float().mean())


def sentiment_clip_value(strength: float) -> float:
    """The guide's rule: 0.5 + 0.5 · min(strength, 2)."""
    return 0.5 + 0.5 * min(strength, 2.0)


def clip_values_per_global_batch(polarity: torch.Tensor, rank_batches: Sequence[Iterable[Sequence[int]]]
                                 ) -> list[float]:
    """The rule's clip value for every optimizer step of an epoch, from each rank's batch sampler (index lists),
    so a notebook can show what the rule would set without training."""
    return [sentiment_clip_value(sentiment_strength(polarity[[i for batch in step for i in batch]]))
            for step in zip(*rank_batches)]


__all__ = ["SentimentClip", "clip_values_per_global_batch", "sentiment_clip_value", "sentiment_strength"]
