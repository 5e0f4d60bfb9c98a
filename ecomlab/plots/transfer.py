"""Chapter 08's transfer plot: accuracy per target for each fine-tuning arm beside its majority baseline, and the
held-out pretraining-text loss each pretrained arm kept, beside the pretrained model's."""

from __future__ import annotations

from typing import Sequence

from ecomlab.measure.transfer import TARGETS, Arm
from ecomlab.plots.common import _plt

COLOURS = ("#4C72B0", "#C44E52", "#8C8C8C", "#55A868")


def plot_transfer(arms: Sequence[Arm], pretrained_loss: float):
    """Left: accuracy per target, one bar per arm, the majority baseline dotted. Right: LM loss on the old text."""
    plt = _plt()
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(arms)
    for i, a in enumerate(arms):
        xs = [t + (i - (len(arms) - 1) / 2) * width for t in range(len(TARGETS))]
        acc_ax.bar(xs, [a.accuracy[t] for t in TARGETS], width, color=COLOURS[i % len(COLOURS)],
                   label=f"{a.label} (lr {a.lr:g})")
    for t, target in enumerate(TARGETS):
        acc_ax.hlines(arms[0].majority[target], t - 0.45, t + 0.45, colors="black", linestyles=":",
                      label="majority baseline" if t == 0 else None)
    acc_ax.set_xticks(range(len(TARGETS)), TARGETS)
    acc_ax.set_ylim(0, 1.05)
    acc_ax.set_ylabel("held-out accuracy (candidate scoring)")
    acc_ax.set_title("the new task, at equal steps")
    acc_ax.legend(fontsize=8)
    kept = [a for a in arms if a.lm_loss is not None]
    names = ["pretrained", *(a.label for a in kept)]
    loss_ax.bar(range(len(names)), [pretrained_loss, *(a.lm_loss for a in kept)],
                color=["#55A868", *(COLOURS[arms.index(a) % len(COLOURS)] for a in kept)])
    loss_ax.set_xticks(range(len(names)), names, rotation=15)
    loss_ax.set_ylabel("LM loss, held-out product text")
    loss_ax.set_title("what it kept (lower is better)")
    fig.tight_layout()
    return fig
