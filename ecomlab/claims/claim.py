"""One claim of a guide, as the ledger holds it: where it is, what it says, and the function that decides it.

A :class:`Claim` carries no verdict. Its ``decide`` function computes a
:class:`~ecomlab.claims.verdicts.Finding` from the evidence (benchmark
artifacts, the planner, first-principles bounds) every time the page is rendered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ecomlab.claims.evidence import Evidence
from ecomlab.claims.verdicts import Finding

GUIDES = {"S0": "EcomGPT-7B guide", "S1": "SeqGPT-560M guide"}


@dataclass(frozen=True)
class Claim:
    """A checkable statement of one guide (``S0`` EcomGPT-7B, ``S1`` SeqGPT-560M)."""

    id: str                                  # e.g. "S0-07"
    section: str                             # the guide's section number, e.g. "3.2"
    chapter: int                             # the ecomkit chapter (notebook) that shows it
    quote: str                               # the claim in the guide's words (Chinese)
    gloss: str                               # English gloss
    setup: str                               # the hardware and training it was made on
    decide: Callable[[Evidence], Finding]    # computes the verdict, evidence and reason

    @property
    def guide(self) -> str:
        return GUIDES[self.id.split("-")[0]]
