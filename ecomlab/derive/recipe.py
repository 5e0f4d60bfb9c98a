"""Full fine-tuning's measured lr anchor from a ``bench_transfer`` artifact: the lowest lr that learned a target.

Why here: the core keeps the anchor (the small end of :data:`ecomkit.config.recipe.FULL_FT_ANCHORS`);
tests/test_recipe_anchor.py holds it equal to :func:`lowest_learning_lr` of the newest artifact.
"""

from __future__ import annotations

import math
from typing import Any

LEARNED_SE = 2.0   # learned: held-out accuracy above the majority baseline by more than 2 binomial standard errors


def learned(accuracy: float, majority: float, n: int, se: float = LEARNED_SE) -> bool:
    """Whether ``accuracy`` over ``n`` held-out records beats always answering the majority label beyond noise."""
    return accuracy - majority > se * math.sqrt(majority * (1 - majority) / n)


def lowest_learning_lr(artifact: dict[str, Any]) -> float:
    """The lowest lr at which the pretrained model learned any target (``acc_<t>`` against ``majority_<t>``)."""
    n = int(artifact["extra"]["sizes"]["eval_samples"])
    lrs = sorted(float(r["lr"]) for r in artifact["rows"] if r["pretrained"] and any(
        learned(r[k], r["majority_" + k[len("acc_"):]], n) for k in r if k.startswith("acc_")))
    if not lrs:
        raise ValueError("no fine-tuning lr of this artifact learned any target: it gives no anchor")
    return lrs[0]


__all__ = ["LEARNED_SE", "learned", "lowest_learning_lr"]
