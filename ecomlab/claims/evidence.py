"""What the ledger decides from: the newest benchmark artifact of each benchmark, GPU report included.

Every rule that reads an artifact takes an :class:`Evidence` argument, so a
test can hand it fabricated rows (``Evidence({"gpu_bench": {...}})``) and
watch a verdict flip; :func:`load_evidence` reads the artifacts' folder
(:func:`ecomlab.artifacts.results_dir`: ``--results``, ``$ECOMKIT_RESULTS`` or
the repository's ``benchmarks/results/``).

The GPU report (``benchmarks/gpu_bench.py``, written with ``write_artifact``)
is read by section name: ``gpu_rows(section, gpu)`` returns the rows of that
section of the newest report, only when it ran on that GPU board (its ``gpu``
fact, matched through ``ecomkit.hardware``) and was not a CPU dry run. The
sections the ledger asks for, and the fields each row needs:

- ``scaling``: ``model``, ``strategy``, ``gpus``, ``samples_per_s`` (1 GPU and N GPUs of one node);
- ``memory``: ``model``, ``strategy``, ``gpus``, ``micro_batch``, ``seq_len``, ``peak_bytes`` per GPU;
- ``precision``: ``model``, ``precision`` (``fp32``/``bf16``/``fp16``), ``tokens_per_s``, ``peak_bytes``.

Batch, sequence length and precision of a ``scaling`` row may differ from the
claim's; the evidence column prints what was measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecomkit.hardware import find_gpu
from ecomkit.planner.links import gpu_spec
from ecomlab.artifacts import REPO, newest_artifacts, results_dir


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

    def gpu_rows(self, section: str, gpu: str | None = None) -> list[dict[str, Any]]:
        """Rows of ``section`` in the newest GPU report, if it ran on ``gpu`` (any board when ``None``).

        Empty without a report, for a CPU dry run, or for a report from another board.
        """
        doc = self.artifacts.get("gpu_bench")
        if not doc:
            return []
        extra = doc.get("extra", {})
        if doc.get("dry_run", extra.get("dry_run", False)):
            return []
        if gpu is not None:
            board = find_gpu(str(doc.get("gpu") or ""))
            if board is None or board.key != gpu_spec(gpu).key:
                return []
        rows = doc.get(section, extra.get(section, []))
        return [r for r in rows if r.get("status", "ok") == "ok"]


def load_evidence(folder: str | Path | None = None) -> Evidence:
    """The newest ``<bench>-<yyyy-mm-dd>-<machine>.json`` of each benchmark in ``folder`` (:func:`results_dir`)."""
    newest = newest_artifacts(results_dir(folder))
    return Evidence({b: json.loads(p.read_text()) for b, p in newest.items()},
                    {b: _shown(p) for b, p in newest.items()})


def _shown(path: Path) -> str:
    """The artifact as the evidence column names it: relative to the repository when it is inside it."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def gpu_value(ev: Evidence, section: str, key: str, gpu: str, **match: Any) -> float | None:
    """``key`` of the first ``section`` row from board ``gpu`` whose fields equal ``match``; else ``None``."""
    for r in ev.gpu_rows(section, gpu):
        if all(r.get(k) == v for k, v in match.items()) and r.get(key) is not None:
            return float(r[key])
    return None


def gpu_speedup(ev: Evidence, model: str, strategy: str, gpus: int, gpu: str) -> float | None:
    """samples/s on ``gpus`` GPUs over 1 GPU of board ``gpu`` (``scaling`` rows); ``None`` if either is missing."""
    one = gpu_value(ev, "scaling", "samples_per_s", gpu, model=model, strategy=strategy, gpus=1)
    many = gpu_value(ev, "scaling", "samples_per_s", gpu, model=model, strategy=strategy, gpus=gpus)
    return None if one is None or many is None else many / one
