"""Chapter 05's measurement: the same job once per compression method, in one torchrun launch, bytes counted.

Why one launch: the notebook compares a dozen methods on two CPU cores.
Starting torchrun, importing torch and joining a process group for each of
them costs more than the training itself, so :func:`train_methods` hands the
methods (:class:`~ecomkit.parallel.compression.specs.MethodSpec`, parsed from
``--methods``) to the sweep driver (:func:`ecomkit.train.sweep.run_sweep`):
one process group, every method re-seeded, so every method starts from the
same weights and sees the same batches. :class:`CompressionRunCallback` makes
the baseline's bytes measured like every other method's and adds each
method's byte totals to its summary; :func:`compare_with_guide` sets the
results beside the EcomGPT guide's claims.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torch.nn.parallel import DistributedDataParallel

from ecomkit.config import TrainConfig
from ecomkit.parallel.compression.hooks import register_compression
from ecomkit.parallel.compression.specs import MethodSpec, parse_method_spec
from ecomkit.train.sweep import run_sweep


class CompressionRunCallback:
    """Training callback of one method's run: count the baseline's bytes, and put the byte totals in the summary.

    ``DDPStrategy.wrap`` only calls :func:`register_compression` for a real
    compression method, leaving DDP's C++ all-reduce for ``none``. For a spec
    that counts bytes (every one but ``plain``) this registers torch's Python
    ``allreduce_hook`` through the counting group before the first backward,
    so the baseline's bytes are measured like every other method's. At the end
    the summary gets ``method_spec``, ``method_title`` and :func:`comm_summary`.
    """

    def __init__(self, spec: MethodSpec):
        self.spec = spec

    def on_train_start(self, run: Any) -> None:
        strategy = run.strategy
        if (self.spec.count_bytes and getattr(strategy, "comm_hook", "n/a") is None
                and isinstance(strategy.model, DistributedDataParallel)):
            strategy.comm_hook = register_compression(strategy.model, run.cfg.compression, run.env)

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        summary.update(method_spec=self.spec.text, method_title=self.spec.title, **comm_summary(run.history))


def comm_summary(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and last-step bytes over the train rows (``None`` when nothing was counted)."""
    rows = [r for r in history if r.get("type") == "train" and r.get("comm_bytes") is not None]
    if not rows:
        return {"comm_bytes_mean": None, "comm_bytes_dense_mean": None, "comm_bytes_last": None}
    return {"comm_bytes_mean": sum(r["comm_bytes"] for r in rows) / len(rows),
            "comm_bytes_dense_mean": sum(r["comm_bytes_dense"] for r in rows) / len(rows),
            "comm_bytes_last": rows[-1]["comm_bytes"], "comm_bytes_dense_last": rows[-1]["comm_bytes_dense"]}


def compression_callbacks(spec: MethodSpec, cfg: TrainConfig) -> list[Any]:
    """The sweep's extra callbacks for one method's run."""
    return [CompressionRunCallback(spec)]


def train_methods(base: TrainConfig, specs: Sequence[MethodSpec], subdirs: bool = True) -> list[dict[str, Any]]:
    """Train ``base`` once per spec in one process group; summaries in spec order (every rank gets them).

    With ``subdirs`` each method writes into ``base.output_dir/<spec label>``;
    without (one method, the script without ``--methods``) into ``base.output_dir``.
    """
    return run_sweep(base, specs, compression_callbacks, subdirs=subdirs)


def error_feedback_effect(summaries: Mapping[str, dict[str, Any]],
                          ratios: Sequence[float] = (0.01, 0.1, 0.25)) -> list[dict[str, Any]]:
    """Top-K with and without error feedback at each ratio: final training losses and which is lower.

    ``summaries`` are keyed by method spec (``topk:0.01``, ``topk:0.01:noef``);
    ratios whose pair was not trained are skipped.
    """
    rows = []
    for ratio in ratios:
        ef, noef = summaries.get(f"topk:{ratio:g}"), summaries.get(f"topk:{ratio:g}:noef")
        if ef is None or noef is None:
            continue
        rows.append({"ratio": ratio, "final_loss_ef": ef["final_loss"], "final_loss_noef": noef["final_loss"],
                     "ef_lower": ef["final_loss"] < noef["final_loss"]})
    return rows


# ---------------------------------------------------------------------- bytes: what each method must send
BYTE_RATIO_TOLERANCE = 0.02   # Top-K keeps ceil(ratio × bucket) entries per bucket: rounding, a fraction of a percent


def expected_byte_ratio(spec: str) -> float | None:
    """Dense fp32 bytes / this method's bytes per step, from what the method puts on the wire.

    fp16/bf16: 2-byte values instead of 4 → 2×. The guide's Top-K all-reduces a
    dense tensor → 1×. Top-K at ``ratio`` sends a 4-byte value and a 4-byte index
    per kept entry → ``1 / (2 × ratio)`` (2× at 25 %, 50× at 1 %). ``none`` is
    the baseline (1×). PowerSGD's bytes depend on the matrix shapes: ``None``.
    """
    s = parse_method_spec(spec)
    if s.method in ("none", "topk_naive"):
        return 1.0
    if s.method in ("fp16", "bf16"):
        return 2.0
    if s.method == "topk" and s.ratio:
        return 1 / (2 * s.ratio)
    return None


def byte_ratio_checks(summaries: Mapping[str, dict[str, Any]],
                      rel_tol: float = BYTE_RATIO_TOLERANCE) -> list[dict[str, Any]]:
    """Per method (summaries keyed by spec): measured dense/sent bytes on the last step against the expected ratio.

    The last step is used because PowerSGD sends dense bytes during its
    warm-up; for the other methods every step sends the same bytes. Rows for
    methods without a closed-form ratio (PowerSGD) check only that fewer
    bytes than dense were sent. ``ok``: within ``rel_tol`` of the expectation.
    """
    rows = []
    for spec, s in summaries.items():
        measured = s["comm_bytes_dense_last"] / s["comm_bytes_last"]
        expected = expected_byte_ratio(spec)
        ok = abs(measured / expected - 1) <= rel_tol if expected is not None else measured > 1
        rows.append({"method": parse_method_spec(spec).title, "spec": spec, "measured_ratio": measured,
                     "expected_ratio": expected, "comm_cut": 1 - 1 / measured, "ok": ok})
    return rows


# ---------------------------------------------------------------------- the guide's claims, measured
GUIDE_COMM_CUT = 0.75          # EcomGPT guide, section 3.2: Top-K (25 %) "cuts communication by 75 %"
GUIDE_ACC_DROP_POINTS = 0.15   # ... "top-1 category accuracy drops by only 0.15 points"


def compare_with_guide(summaries: Mapping[str, dict[str, Any]], eval_nlu_samples: int,
                       baseline: str = "none", candidates: Sequence[str] = ("topk_naive:0.25", "topk:0.25",
                                                                             "topk:0.01")) -> list[dict[str, Any]]:
    """Rows of (claim, method, guide's figure, our measurement) from summaries keyed by method spec.

    Bytes are means over all steps. Accuracy differences are in points; one
    scored record is worth ``100 / scored`` points (``scored_category``: the
    final evaluation scores every held-out record; ``eval_nlu_samples`` for
    summaries without it), so a smaller difference cannot be resolved.
    """
    base = summaries[baseline]
    resolution = 100 / (base.get("scored_category") or eval_nlu_samples)
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
