"""Train the same job once per compression method, in one torchrun launch (chapter 05).

Why one launch: the notebook compares a dozen methods on two CPU cores.
Starting torchrun, importing torch and joining a process group for each of
them costs more than the training itself, so :func:`train_methods` opens
one process group and runs :class:`~ecomkit.train.loop.TrainingRun` once per
method inside it, exactly as :func:`~ecomkit.train.run_training` would,
re-seeding before each run so every method starts from the same weights and
sees the same batches.

A method is named by a short spec (``--methods`` in ``scripts/05_grad_compression.py``)::

    none | plain | fp16 | bf16 | powersgd[:RANK][:noef] | topk[:RATIO][:noef] | topk_naive[:RATIO]

``none`` is an fp32 all-reduce run as a counting hook (the measured
baseline); ``plain`` is DDP's built-in C++ all-reduce with no hook at all
(bytes not counted), used to check that the hooks change nothing they
should not.
"""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

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
        """Readable name for plots and tables."""
        if self.method == "powersgd":
            name = f"PowerSGD r={self.rank}" if self.rank else "PowerSGD"
            return name + ("" if self.error_feedback else " no EF")
        if self.method in ("topk", "topk_naive"):
            pct = f" {self.ratio * 100:g} %" if self.ratio else ""
            if self.method == "topk_naive":
                return f"guide's Top-K{pct} (naive)"
            return f"Top-K{pct}" + (" + EF" if self.error_feedback else " no EF")
        return {"none": "none (fp32)", "plain": "plain DDP (no hook)"}.get(self.method, self.method)

    def apply(self, base: TrainConfig, subdir: bool = True) -> TrainConfig:
        """A copy of ``base`` with this method set (and ``output_dir/<label>`` when ``subdir``)."""
        cfg = copy.deepcopy(base)
        comp = cfg.compression
        comp.method = "none" if self.method == "plain" else self.method
        if self.ratio is not None:
            comp.topk_ratio = self.ratio
        if self.rank is not None:
            comp.powersgd_rank = self.rank
        if self.error_feedback is not None:
            comp.error_feedback = self.error_feedback
        if subdir:
            cfg.output_dir = str(Path(base.output_dir) / self.label)
        return cfg


def parse_method_spec(text: str) -> MethodSpec:
    """``"topk:0.01:noef"`` → MethodSpec; a ConfigError naming the grammar otherwise.

    Top-K and PowerSGD use error feedback unless the spec ends in ``:noef``.
    """
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


class CountBaselineBytes:
    """Training callback: when the strategy registered no hook (``none``), register the counting all-reduce.

    ``DDPStrategy.wrap`` only calls :func:`register_compression` for a real
    compression method, leaving DDP's C++ all-reduce for ``none``. This
    registers torch's Python ``allreduce_hook`` through the counting group
    before the first backward, so the baseline's bytes are measured like
    every other method's.
    """

    def on_train_start(self, run: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        from ecomkit.parallel.compression.hooks import register_compression

        strategy = run.strategy
        if getattr(strategy, "comm_hook", "n/a") is None and isinstance(strategy.model, DistributedDataParallel):
            strategy.comm_hook = register_compression(strategy.model, run.cfg.compression, run.env)


def comm_summary(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and last-step bytes over the train rows (``None`` when nothing was counted)."""
    rows = [r for r in history if r.get("type") == "train" and r.get("comm_bytes") is not None]
    if not rows:
        return {"comm_bytes_mean": None, "comm_bytes_dense_mean": None, "comm_bytes_last": None}
    return {"comm_bytes_mean": sum(r["comm_bytes"] for r in rows) / len(rows),
            "comm_bytes_dense_mean": sum(r["comm_bytes_dense"] for r in rows) / len(rows),
            "comm_bytes_last": rows[-1]["comm_bytes"], "comm_bytes_dense_last": rows[-1]["comm_bytes_dense"]}


def train_method_in_session(cfg: TrainConfig, env: Any, spec: MethodSpec) -> dict[str, Any]:
    """One run inside an existing process group (``ecomkit.train.loop.train_in_session``), plus byte totals."""
    from ecomkit.train.loop import train_in_session

    callbacks = [CountBaselineBytes()] if spec.count_bytes else []
    summary = train_in_session(cfg, env, callbacks, extra_summary=lambda run: dict(
        method_spec=spec.text, method_title=spec.title, **comm_summary(run.history)))
    gc.collect()
    return summary


def train_methods(base: TrainConfig, specs: Sequence[MethodSpec], subdirs: bool = True) -> list[dict[str, Any]]:
    """Train ``base`` once per spec in one process group; summaries in spec order (every rank gets them)."""
    from ecomkit.dist import distributed_session, seed_everything

    configs = [spec.apply(base, subdir=subdirs) for spec in specs]
    for cfg in configs:  # every bad value is reported before the first run starts
        cfg.validate()
    summaries = []
    with distributed_session(timeout_s=base.timeout_s, seed=base.seed) as env:
        for spec, cfg in zip(specs, configs):
            seed_everything(cfg.seed, env.rank)
            summaries.append(train_method_in_session(cfg, env, spec))
    return summaries


# ---------------------------------------------------------------------- the guide's claims, measured
GUIDE_COMM_CUT = 0.75          # EcomGPT guide, section 3.2: Top-K (25 %) "cuts communication by 75 %"
GUIDE_ACC_DROP_POINTS = 0.15   # ... "top-1 category accuracy drops by only 0.15 points"


def compare_with_guide(summaries: Mapping[str, dict[str, Any]], eval_nlu_samples: int,
                       baseline: str = "none", candidates: Sequence[str] = ("topk_naive:0.25", "topk:0.25",
                                                                             "topk:0.01")) -> list[dict[str, Any]]:
    """Rows of (claim, method, guide's figure, our measurement) from summaries keyed by method spec.

    Bytes are means over all steps. Accuracy differences are in points; one
    scored record is worth at least ``100 / eval_nlu_samples`` points, so a
    difference smaller than that cannot be resolved by this evaluation.
    """
    base = summaries[baseline]
    resolution = 100 / eval_nlu_samples
    rows = []
    for spec in candidates:
        if spec not in summaries:
            continue
        s, title = summaries[spec], parse_method_spec(spec).title
        cut = 1 - s["comm_bytes_mean"] / base["comm_bytes_mean"]
        rows.append({"claim": "Top-K cuts communication by 75 %", "method": title,
                     "guide": f"{100 * GUIDE_COMM_CUT:.0f} %", "measured": f"{100 * cut:.1f} %"})
        if "acc_category" in s and "acc_category" in base:
            drop = 100 * (base["acc_category"] - s["acc_category"])
            rows.append({"claim": "category accuracy drops 0.15 points", "method": title,
                         "guide": f"{GUIDE_ACC_DROP_POINTS} points",
                         "measured": f"{drop:+.2f} points (resolution >= {resolution:.1f})"})
        loss_gap = s["eval_loss"] / base["eval_loss"] - 1
        rows.append({"claim": "(not claimed) eval loss vs dense", "method": title, "guide": "-",
                     "measured": f"{100 * loss_gap:+.1f} %"})
    return rows
