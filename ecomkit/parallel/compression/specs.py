"""Chapter 05's method specs: one short string per compression set-up (``--methods`` in scripts/05).

``none`` is a counting fp32 all-reduce hook (the baseline); ``plain`` is DDP with no hook, to check the hooks change
nothing. Each :class:`MethodSpec` is a variant of :func:`ecomkit.train.sweep.run_sweep`; its label names the folder.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ecomkit.config import COMPRESSIONS, TrainConfig
from ecomkit.errors import ConfigError

SPEC_GRAMMAR = "none | plain | fp16 | bf16 | powersgd[:RANK][:noef] | topk[:RATIO][:noef] | topk_naive[:RATIO]"

# The notebook's line-up: baseline, casts, low rank, sparse with and without error feedback, the guide's recipe.
CHAPTER_METHODS = ("none", "fp16", "bf16", "powersgd:1", "powersgd:4",
                   "topk:0.01", "topk:0.1", "topk:0.25", "topk:0.01:noef", "topk:0.1:noef", "topk:0.25:noef",
                   "topk_naive:0.25")


@dataclass(frozen=True)
class MethodSpec:
    """One compression set-up, parsed from a spec string."""

    text: str
    method: str                          # a compression.method, or "plain"
    ratio: float | None = None
    rank: int | None = None
    error_feedback: bool | None = None   # None: keep the config's value
    count_bytes: bool = True             # False only for "plain"

    @property
    def label(self) -> str:
        """Folder-safe name: ``topk:0.01:noef`` → ``topk-0.01-noef``."""
        return self.text.replace(":", "-")

    @property
    def title(self) -> str:
        if self.method == "powersgd":
            name = f"PowerSGD r={self.rank}" if self.rank else "PowerSGD"
            return name + ("" if self.error_feedback else " no EF")
        if self.method in ("topk", "topk_naive"):
            pct = f" {self.ratio * 100:g} %" if self.ratio else ""
            if self.method == "topk_naive":
                return f"guide's Top-K{pct} (naive)"
            return f"Top-K{pct}" + (" + EF" if self.error_feedback else " no EF")
        return {"none": "none (fp32)", "plain": "plain DDP (no hook)"}.get(self.method, self.method)

    def apply(self, base: TrainConfig) -> TrainConfig:
        cfg = copy.deepcopy(base)
        comp = cfg.compression
        comp.method = "none" if self.method == "plain" else self.method
        if self.ratio is not None:
            comp.topk_ratio = self.ratio
        if self.rank is not None:
            comp.powersgd_rank = self.rank
        if self.error_feedback is not None:
            comp.error_feedback = self.error_feedback
        return cfg


def parse_method_spec(text: str) -> MethodSpec:
    """``"topk:0.01:noef"`` → MethodSpec; a ConfigError naming the grammar otherwise."""
    method, *args = [p.strip() for p in text.strip().split(":")]
    noef = bool(args) and args[-1] == "noef"
    args = args[:-1] if noef else args
    try:
        if method in ("none", "plain", "fp16", "bf16") and not args and not noef:
            return MethodSpec(text, method, count_bytes=method != "plain")
        if method == "powersgd" and len(args) <= 1:
            return MethodSpec(text, method, rank=int(args[0]) if args else None, error_feedback=not noef)
        if method == "topk" and len(args) <= 1:
            return MethodSpec(text, method, ratio=float(args[0]) if args else None, error_feedback=not noef)
        if method == "topk_naive" and len(args) <= 1 and not noef:
            return MethodSpec(text, method, ratio=float(args[0]) if args else None, error_feedback=False)
    except ValueError:
        pass
    raise ConfigError(f"--methods: cannot read '{text}'. Each comma-separated entry is one of: {SPEC_GRAMMAR} "
                      f"(methods: {', '.join(COMPRESSIONS)}), e.g. 'none,powersgd:4,topk:0.01,topk:0.01:noef'.")


def spec_from_config(cfg: TrainConfig) -> MethodSpec:
    """The spec of the method a plain config describes (the script without --methods)."""
    comp = cfg.compression
    if comp.method in ("topk", "topk_naive"):
        text = f"{comp.method}:{comp.topk_ratio:g}"
    elif comp.method == "powersgd":
        text = f"powersgd:{comp.powersgd_rank}"
    else:
        text = comp.method
    if comp.method in ("topk", "powersgd") and not comp.error_feedback:
        text += ":noef"
    return parse_method_spec(text)


def parse_methods(text: str) -> list[MethodSpec]:
    """A comma-separated list of specs; labels must be unique (they name the output folders)."""
    specs = [parse_method_spec(t) for t in text.split(",") if t.strip()]
    labels = [s.label for s in specs]
    if not specs or len(set(labels)) != len(labels):
        raise ConfigError(f"--methods '{text}': give at least one method and no method twice.")
    return specs
