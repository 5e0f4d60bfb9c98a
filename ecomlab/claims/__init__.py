"""The guides' claims ledger: every checkable claim of the two source guides, with a verdict computed by code.

Each entry (:class:`~ecomlab.claims.claim.Claim`) quotes the claim, says where
and on what it was made, and holds the function that decides it from the
evidence: benchmark artifacts (``benchmarks/results/``, the GPU report
included), the planner and its time model, or first-principles bounds. No
entry carries a verdict; :func:`ledger_rows` computes them all, and
``python -m ecomlab.claims`` renders them into ``docs/claims.md``.

    from ecomlab.claims import chapter_rows
    rows = chapter_rows(5)        # chapter 05's claims, decided now
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from ecomlab.claims import ch01, ch02, ch03, ch04, ch05, ch06, ch06_memory, ch07
from ecomlab.claims.claim import GUIDES, Claim
from ecomlab.claims.evidence import Evidence, load_evidence
from ecomlab.claims.verdicts import VERDICTS, Finding

LEDGER: list[Claim] = sorted([*ch01.CLAIMS, *ch02.CLAIMS, *ch03.CLAIMS, *ch04.CLAIMS, *ch05.CLAIMS, *ch06.CLAIMS,
                              *ch06_memory.CLAIMS, *ch07.CLAIMS], key=lambda c: (c.chapter, c.id))


def decide(claim: Claim, evidence: Evidence) -> dict[str, Any]:
    """One row: the claim's fields and the finding its function computes from ``evidence``."""
    f: Finding = claim.decide(evidence)
    return {"id": claim.id, "guide": claim.guide, "section": claim.section, "chapter": claim.chapter,
            "quote": claim.quote, "gloss": claim.gloss, "setup": claim.setup, "verdict": f.verdict,
            "evidence": f.evidence, "source": f.source, "reason": f.reason}


def ledger_rows(results_dir: str | Path | None = None, evidence: Evidence | None = None) -> list[dict[str, Any]]:
    """Every claim, decided now from ``evidence`` (default: :func:`load_evidence` of ``results_dir``)."""
    ev = evidence if evidence is not None else load_evidence(results_dir)
    return [decide(c, ev) for c in LEDGER]


def chapter_rows(chapter: int, results_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """The rows of one chapter (what its notebook shows)."""
    ev = load_evidence(results_dir)
    return [decide(c, ev) for c in LEDGER if c.chapter == chapter]


def verdict_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many rows have each verdict, in :data:`VERDICTS` order (zeros included)."""
    c = Counter(r["verdict"] for r in rows)
    return {v: c[v] for v in VERDICTS}


__all__ = ["LEDGER", "GUIDES", "VERDICTS", "Claim", "Evidence", "load_evidence", "decide", "ledger_rows",
           "chapter_rows", "verdict_counts"]
