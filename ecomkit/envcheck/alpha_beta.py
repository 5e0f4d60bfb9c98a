"""The α-β model of a ring collective, fitted by least squares to a message-size sweep.

Why: latency α plus ``b/β`` per message prices every size from one sweep, which the overlap and time-model need.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

# ring steps per (n - 1): an all-reduce is a reduce-scatter then an all-gather
RING_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "fsdp_all_gather": 1, "fsdp_reduce_scatter": 1}


def ring_time_s(size_bytes: float, n: int, alpha_s: float, bus_bytes_per_s: float, kind: str = "all_reduce") -> float:
    """``t = k(n-1)·α + k(n-1)/n · S/β`` (k = 2 for all-reduce): k(n-1) steps, each one latency and one chunk."""
    k = RING_STEPS[kind]
    return k * (n - 1) * alpha_s + k * (n - 1) / n * size_bytes / bus_bytes_per_s


def fit_alpha_beta(samples: Sequence[tuple[int, float]], n: int, kind: str = "all_reduce") -> tuple[float, float]:
    """α (s per ring step) and bus bandwidth β (bytes/s) of :func:`ring_time_s` through ``(bytes, seconds)``.

    Weights 1/t² (relative error), so the small messages that fix α count as much as the large ones that fix β.
    """
    if n < 2 or len(samples) < 2:
        raise ValueError("an α-β fit needs at least 2 processes and 2 message sizes")
    k = RING_STEPS[kind]
    xs = [k * (n - 1) / n * s for s, _ in samples]
    ts = [t for _, t in samples]
    ws = [1 / t**2 for t in ts]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    mt = sum(w * t for w, t in zip(ws, ts)) / sw
    slope = sum(w * (x - mx) * (t - mt) for w, x, t in zip(ws, xs, ts)) / sum(w * (x - mx) ** 2
                                                                            for w, x in zip(ws, xs))
    intercept = max(mt - slope * mx, 0.0)
    return intercept / (k * (n - 1)), 1.0 / slope if slope > 0 else float("inf")


@dataclass(frozen=True)
class AlphaBetaFit:
    """A fitted collective: α, β, and how far the line misses the points it was fitted to."""

    kind: str
    world_size: int
    alpha_s: float
    bus_bytes_per_s: float
    samples: tuple[tuple[int, float], ...]

    def predict_s(self, size_bytes: float) -> float:
        return ring_time_s(size_bytes, self.world_size, self.alpha_s, self.bus_bytes_per_s, self.kind)

    def relative_residuals(self) -> list[float]:
        """``predicted / measured − 1`` at every fitted size."""
        return [self.predict_s(s) / t - 1 for s, t in self.samples]

    @property
    def rms_residual(self) -> float:
        """Root mean square of the relative residuals: the error the fit minimises."""
        res = self.relative_residuals()
        return math.sqrt(sum(r * r for r in res) / len(res))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rms_residual": self.rms_residual}


def fit_collective(samples: Sequence[tuple[int, float]], n: int, kind: str = "all_reduce") -> AlphaBetaFit:
    """:func:`fit_alpha_beta` with its samples kept, so the fit reports its residual."""
    alpha, beta = fit_alpha_beta(samples, n, kind)
    return AlphaBetaFit(kind, n, alpha, beta, tuple((int(s), float(t)) for s, t in samples))


def fit_sweep_rows(rows: Sequence[dict[str, Any]], n: int) -> AlphaBetaFit:
    """The all-reduce fit of chapter 01's sweep rows (``size_bytes``, ``time_us``), as the env check writes them."""
    return fit_collective([(r["size_bytes"], r["time_us"] * 1e-6) for r in rows], n, "all_reduce")


def format_fit(fit: AlphaBetaFit) -> str:
    return (f"α-β fit ({fit.kind}, n = {fit.world_size}): α = {fit.alpha_s * 1e6:.1f} µs per ring step, "
            f"β = {fit.bus_bytes_per_s / 1e9:.3f} GB/s bus bandwidth; RMS relative residual "
            f"{100 * fit.rms_residual:.1f} % over {len(fit.samples)} sizes")


__all__ = ["RING_STEPS", "AlphaBetaFit", "fit_alpha_beta", "fit_collective", "fit_sweep_rows", "format_fit",
           "ring_time_s"]
