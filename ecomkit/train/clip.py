"""Gradient-clipping policies: fixed, and the EcomGPT guide's sentiment-adaptive rule.

The guide clips with ``0.5 + 0.5 · min(s, 2)`` where ``s`` is the "sentiment
polarity strength" of the batch, claiming that batches full of extreme words
("垃圾", "完美") explode gradients. We implement it faithfully as an opt-in
policy so chapter 02 can measure it against fixed clipping instead of
taking it on trust. ``s`` is defined here as 2 × the fraction of polar
(positive or negative) samples in the *global* batch, so it spans [0, 2] and
is identical on every rank (clip values must agree across ranks, or the
replicas drift apart).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ecomkit.dist import DistEnv, all_reduce_mean


def sentiment_strength(polarity: torch.Tensor) -> float:
    """2 × fraction of samples with non-zero polarity (+1 positive, -1 negative, 0 neutral)."""
    if polarity.numel() == 0:
        return 0.0
    return 2.0 * float((polarity != 0).float().mean())


def sentiment_clip_value(strength: float) -> float:
    """The guide's rule: 0.5 + 0.5 · min(strength, 2)."""
    return 0.5 + 0.5 * min(strength, 2.0)


def clip_values_per_global_batch(polarity: torch.Tensor, rank_batches: Sequence[Iterable[Sequence[int]]]) -> list[float]:
    """The rule's clip value for every optimizer step: the ranks' micro-batches of one step, joined.

    ``rank_batches`` holds each rank's batch sampler (index lists), so a
    notebook can show what the rule would set over an epoch without training.
    """
    return [sentiment_clip_value(sentiment_strength(polarity[[i for batch in step for i in batch]]))
            for step in zip(*rank_batches)]


class ClipPolicy:
    """Return the max grad norm for the current optimizer step."""

    def __init__(self, policy: str, max_grad_norm: float, env: DistEnv):
        self.policy, self.max_grad_norm, self.env = policy, max_grad_norm, env
        self._polar: list[torch.Tensor] = []

    def observe(self, batch: dict) -> None:
        """Record a micro-batch's polarity (only needed by the sentiment policy)."""
        if self.policy == "sentiment":
            self._polar.append(batch["polarity"])

    def value(self) -> float:
        if self.policy == "fixed":
            return self.max_grad_norm
        local = sentiment_strength(torch.cat(self._polar)) if self._polar else 0.0
        self._polar.clear()
        # equal-sized rank slices, so the mean of rank means is the global mean
        return sentiment_clip_value(all_reduce_mean(local, self.env))
