"""What the ledger decides from: the newest benchmark artifact of each benchmark, GPU report included.

Every rule that reads an artifact takes an :class:`Evidence` argument, so a
test can hand it fabricated rows (``Evidence({"gpu_bench": {...}})``) and
watch a verdict flip; :func:`load_evidence` reads ``benchmarks/results/``.

The GPU report (``benchmarks/gpu_bench.py``) is read by section name:
``gpu_rows(section)`` returns the rows of that section of the newest report
that ran on a GPU (a dry run on CPU decides nothing). The sections the ledger
asks for, and the fields each row needs:

- ``scaling``: ``model``, ``strategy``, ``gpus``, ``samples_per_s`` (1 GPU and N GPUs of one node);
- ``precision``: ``model``, ``precision`` (``fp32``/``bf16``/``fp16``), ``tokens_per_s``, ``peak_bytes``;
- ``memory``: ``model``, ``strategy``, ``gpus``, ``micro_batch``, ``seq_len``, ``peak_bytes`` per GPU.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
_NAME = re.compile(r"^(?P<bench>[a-z0-9_]+?)[-_](?P<date>\d{4}-\d{2}-\d{2})[-_].*\.json$")


@dataclass(frozen=True)
class Evidence:
    """The newest artifact document of each benchmark, by benchmark name (``bench_ddp``, ``gpu_bench``...)."""

    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)

    def rows(self, bench: str) -> list[dict[str, Any]] | None:
        """The raw rows of ``bench``'s newest artifact, or ``None`` when none is committed."""
        doc = self.artifacts.get(bench)
        return None if doc is None else list(doc.get("rows", []))

    def where(self, bench: str) -> str:
        """The artifact's file name, for the evidence column."""
        return self.paths.get(bench, f"{bench} artifact")

    def gpu_rows(self, section: str) -> list[dict[str, Any]]:
        """Rows of ``section`` in the newest GPU report; empty without one (or for a CPU dry run)."""
        doc = self.artifacts.get("gpu_bench")
        if not doc or doc.get("dry_run", False):
            return []
        rows = doc.get(section)
        if rows is None:
            rows = doc.get("extra", {}).get(section, [])
        return [r for r in rows if r.get("status", "ok") == "ok"]


def load_evidence(results_dir: str | Path = RESULTS) -> Evidence:
    """Read the newest ``<bench>-<yyyy-mm-dd>-<machine>.json`` of each benchmark (file date, then name)."""
    newest: dict[str, tuple[str, Path]] = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        m = _NAME.match(path.name)
        if m and (m["bench"] not in newest or (m["date"], path.name) >= (newest[m["bench"]][0], newest[m["bench"]][1].name)):
            newest[m["bench"]] = (m["date"], path)
    return Evidence({b: json.loads(p.read_text()) for b, (_, p) in newest.items()},
                    {b: f"benchmarks/results/{p.name}" for b, (_, p) in newest.items()})


def gpu_value(ev: Evidence, section: str, key: str, **match: Any) -> float | None:
    """``key`` of the first ``section`` row whose fields equal ``match``; ``None`` when no GPU row matches."""
    for r in ev.gpu_rows(section):
        if all(r.get(k) == v for k, v in match.items()) and r.get(key) is not None:
            return float(r[key])
    return None


def gpu_speedup(ev: Evidence, model: str, strategy: str, gpus: int) -> float | None:
    """samples/s on ``gpus`` GPUs over 1 GPU, from the GPU report's ``scaling`` rows; ``None`` if either is missing."""
    one = gpu_value(ev, "scaling", "samples_per_s", model=model, strategy=strategy, gpus=1)
    many = gpu_value(ev, "scaling", "samples_per_s", model=model, strategy=strategy, gpus=gpus)
    return None if one is None or many is None else many / one
